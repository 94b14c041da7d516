#pragma once
// loom::fp8::linear: y = x W^T + b with the forward product and both backward products in
// fp8 (scaled_mm.hpp): e4m3 for the input and the weight, e5m2 (by default) for the output's
// gradient, never e5m2 x e5m2. The input and the weight are kept in their own dtypes for the
// backward pass and cast again there, along the dimension each product contracts.
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

struct LinearFunction : torch::autograd::Function<LinearFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& weight, int64_t scaling, int64_t grad_dtype,
                            DelayedRef delayed) {
    ctx->save_for_backward({x, weight});
    ctx->saved_data["scaling"] = scaling;
    ctx->saved_data["grad_dtype"] = grad_dtype;
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
    return scaled_mm(x, weight, o);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1];
    const LinearRecipe r{static_cast<Scaling>(ctx->saved_data["scaling"].toInt()),
                         static_cast<c10::ScalarType>(ctx->saved_data["grad_dtype"].toInt())};
    const at::Tensor& dy = grads[0];
    MatmulOptions dx_options = grad_input_options(r), dw_options = grad_weight_options(r);
    if (r.scaling == Scaling::Delayed) {
      dx_options.a_slot = dw_options.a_slot = slot_of(ctx, Operand::GradOutput);
      dx_options.b_slot = slot_of(ctx, Operand::Weight);
      dw_options.b_slot = slot_of(ctx, Operand::Input);
    }
    at::Tensor dx, dw;
    if (ctx->needs_input_grad(0)) {
      dx = scaled_mm(dy, weight.t(), dx_options).to(x.scalar_type());
    }
    if (ctx->needs_input_grad(1)) {
      dw = scaled_mm(dy.t(), x.t(), dw_options).to(weight.scalar_type());
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
