#pragma once
// loom::fp8::linear: y = x W^T + b with the forward product and both backward products in
// fp8 (scaled_mm.hpp): e4m3 for the input and the weight, e5m2 (by default) for the output's
// gradient, never e5m2 x e5m2. Under tensor-wise and delayed scales each operand is cast
// once and its fp8 bytes transposed for the backward products; under row-wise scales the
// input and the weight are kept in their own dtypes for the backward pass and cast again
// there, along the dimension each product contracts (LinearFunction below).
//
//   forward   y  = x  @ W^T     (m, k) x (n, k)^T   out bf16, fast accumulation
//   backward  dx = dy @ W       (m, n) x (k, n)^T   out bf16
//             dW = dy^T @ x     (n, m) x (k, m)^T   out fp32 (Tensorwise) or bf16 (Rowwise)
//
// The bias is added outside the fp8 products, in the output's dtype; its gradient is the
// usual one.
#include <cstdint>
#include <memory>

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <loom/error.hpp>
#include <loom/fp8/delayed.hpp>
#include <loom/fp8/scaled_mm.hpp>

namespace loom::fp8 {

/// What the three products of a linear layer use.
struct LinearRecipe {
  Scaling scaling = Scaling::Tensorwise;
  c10::ScalarType grad_dtype = c10::kFloat8_e5m2;  ///< the output gradient's format
  DelayedOptions delayed{};                        ///< Scaling::Delayed only
};

/// A layer's place in a DelayedBlock: where Scaling::Delayed takes its scales from.
struct DelayedRef {
  std::shared_ptr<const DelayedBlock> block;
  int64_t layer = 0;
};

namespace detail {

inline MatmulOptions forward_options(const LinearRecipe& r) {
  return {c10::kFloat8_e4m3fn, c10::kFloat8_e4m3fn, r.scaling, c10::kBFloat16, true};
}
inline MatmulOptions grad_input_options(const LinearRecipe& r) {
  return {r.grad_dtype, c10::kFloat8_e4m3fn, r.scaling, c10::kBFloat16, false};
}
inline MatmulOptions grad_weight_options(const LinearRecipe& r) {
  // cuBLASLt's row-wise kernels (CUTLASS on sm90) write bf16 only.
  return {r.grad_dtype, c10::kFloat8_e4m3fn, r.scaling,
          r.scaling == Scaling::Rowwise ? c10::kBFloat16 : c10::kFloat, false};
}

// The layer's slot of the block whose tensors forward saved.
inline ScaleSlot slot_of(torch::autograd::AutogradContext* ctx, Operand operand) {
  const DelayedBlock block{ctx->saved_data["history"].toTensor(),
                           ctx->saved_data["scale"].toTensor()};
  return block.slot(ctx->saved_data["layer"].toInt(), operand);
}

// Transposes a row-major fp8 matrix (rows, cols) into a row-major (cols, rows) one, with
// `pad` zero columns appended; moved as bytes (0 is +0 in both fp8 formats).
inline at::Tensor transposed(const at::Tensor& data, int64_t pad) {
  const at::Tensor bytes = data.view(at::kByte).t();
  const at::Tensor out =
      pad ? at::constant_pad_nd(bytes, {0, pad}).contiguous() : bytes.contiguous();
  return out.view(data.scalar_type());
}

// Under Scaling::Tensorwise and Scaling::Delayed one scale serves an operand in every
// product, so each operand is cast once: forward keeps its fp8 input and weight for
// backward, which casts the output gradient once and transposes the fp8 tensors it needs
// (bytes moved, not values cast again). Under Scaling::Rowwise the scales run along each
// product's own contraction dimension, so forward keeps x and the weight in their own
// dtypes and backward casts them again (scaled_mm). Both give the values of three
// independent scaled_mm calls, bit for bit.
struct LinearFunction : torch::autograd::Function<LinearFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& weight, int64_t scaling, int64_t grad_dtype,
                            DelayedRef delayed) {
    ctx->saved_data["scaling"] = scaling;
    ctx->saved_data["grad_dtype"] = grad_dtype;
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(weight.scalar_type());
    LinearRecipe r{static_cast<Scaling>(scaling), static_cast<c10::ScalarType>(grad_dtype)};
    MatmulOptions o = forward_options(r);
    if (r.scaling == Scaling::Delayed) {
      // The block's tensors themselves (not copies): backward records into the same history.
      ctx->saved_data["history"] = delayed.block->amax_history;
      ctx->saved_data["scale"] = delayed.block->scale;
      ctx->saved_data["layer"] = delayed.layer;
      o.a_slot = slot_of(ctx, Operand::Input);
      o.b_slot = slot_of(ctx, Operand::Weight);
    }
    if (r.scaling == Scaling::Rowwise) {
      ctx->save_for_backward({x, weight});
      return scaled_mm(x, weight, o);
    }
    // scaled_mm's operands, kept for backward: x8 (m, k'), w8 (n', k').
    const Operands q = cast_operands(x, weight, o);
    ctx->save_for_backward({q.a.data, q.a.inv_scale, q.b.data, q.b.inv_scale});
    const int64_t n = weight.size(0);
    ctx->saved_data["n"] = n;
    ctx->saved_data["k"] = x.size(1);
    const at::Tensor y = mm(q.a, q.b, o.out_dtype, o.fast_accum);
    return y.size(1) != n ? y.narrow(1, 0, n) : y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const LinearRecipe r{static_cast<Scaling>(ctx->saved_data["scaling"].toInt()),
                         static_cast<c10::ScalarType>(ctx->saved_data["grad_dtype"].toInt())};
    const auto x_dtype = static_cast<c10::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    const auto w_dtype = static_cast<c10::ScalarType>(ctx->saved_data["w_dtype"].toInt());
    const at::Tensor& dy = grads[0];
    MatmulOptions dx_options = grad_input_options(r), dw_options = grad_weight_options(r);
    if (r.scaling == Scaling::Delayed) {
      dx_options.a_slot = dw_options.a_slot = slot_of(ctx, Operand::GradOutput);
      dx_options.b_slot = slot_of(ctx, Operand::Weight);
      dw_options.b_slot = slot_of(ctx, Operand::Input);
    }
    at::Tensor dx, dw;
    if (r.scaling == Scaling::Rowwise) {
      const at::Tensor &x = saved[0], &weight = saved[1];
      if (ctx->needs_input_grad(0)) dx = scaled_mm(dy, weight.t(), dx_options).to(x_dtype);
      if (ctx->needs_input_grad(1)) dw = scaled_mm(dy.t(), x.t(), dw_options).to(w_dtype);
      return {dx, dw, at::Tensor(), at::Tensor(), at::Tensor()};
    }
    // x8 (m, k'), w8 (n', k'); dy (m, n) is cast once, padded along n to n'.
    const at::Tensor &x8 = saved[0], &x_inv = saved[1], &w8 = saved[2], &w_inv = saved[3];
    const int64_t n = ctx->saved_data["n"].toInt(), k = ctx->saved_data["k"].toInt();
    const int64_t m = dy.size(0), pn = w8.size(0) - n, pm = pad16(m);
    const at::Tensor dyp = pn ? at::constant_pad_nd(dy, {0, pn}) : dy;
    const Quantized qdy = quantize(dyp, r.grad_dtype, r.scaling, dx_options.a_slot);
    if (ctx->needs_input_grad(0)) {
      // dx = dy @ W: (m, n') x (k', n')^T.
      const at::Tensor out =
          mm(qdy, {transposed(w8, 0), w_inv}, dx_options.out_dtype, dx_options.fast_accum);
      dx = (out.size(1) != k ? out.narrow(1, 0, k) : out).to(x_dtype);
    }
    if (ctx->needs_input_grad(1)) {
      // dW = dy^T @ x: (n, m') x (k', m')^T, m padded with zeros to m'.
      at::Tensor dyt = transposed(qdy.data, pm);
      if (pn) dyt = dyt.narrow(0, 0, n).contiguous();
      const at::Tensor out = mm({dyt, qdy.inv_scale}, {transposed(x8, pm), x_inv},
                                dw_options.out_dtype, dw_options.fast_accum);
      dw = (out.size(1) != k ? out.narrow(1, 0, k) : out).to(w_dtype);
    }
    return {dx, dw, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace detail

/// x (..., k) times weight (n, k) transposed, plus bias (n) when defined, in fp8 as `recipe`
/// says; the result is bf16, (..., n). Differentiable in x, weight and bias. Scaling::Delayed
/// takes its scales from, and records its amaxes in, `delayed` (layer `delayed.layer` of a
/// DelayedBlock on x's device).
inline at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                         const LinearRecipe& recipe = {}, DelayedRef delayed = {}) {
  if (weight.dim() != 2 || x.dim() < 1 || x.size(-1) != weight.size(1)) {
    throw Error("loom::fp8::linear: the input's last dimension must be the weight's second");
  }
  if (recipe.scaling == Scaling::Delayed &&
      (delayed.block == nullptr || delayed.layer < 0 || delayed.layer >= delayed.block->layers())) {
    throw Error("loom::fp8::linear: Scaling::Delayed needs the layer's place in a DelayedBlock");
  }
  auto sizes = x.sizes().vec();
  sizes.back() = weight.size(0);
  at::Tensor y = detail::LinearFunction::apply(x.reshape({-1, x.size(-1)}), weight,
                                               static_cast<int64_t>(recipe.scaling),
                                               static_cast<int64_t>(recipe.grad_dtype), delayed)
                     .view(sizes);
  return bias.defined() ? y + bias.to(y.scalar_type()) : y;
}

}  // namespace loom::fp8
