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

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <loom/error.hpp>
#include <loom/fp8/scaled_mm.hpp>

namespace loom::fp8 {

/// What the three products of a linear layer use.
struct LinearRecipe {
  Scaling scaling = Scaling::Tensorwise;
  c10::ScalarType grad_dtype = c10::kFloat8_e5m2;  ///< the output gradient's format
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
          r.scaling == Scaling::Tensorwise ? c10::kFloat : c10::kBFloat16, false};
}

struct LinearFunction : torch::autograd::Function<LinearFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& weight, int64_t scaling, int64_t grad_dtype) {
    ctx->save_for_backward({x, weight});
    ctx->saved_data["scaling"] = scaling;
    ctx->saved_data["grad_dtype"] = grad_dtype;
    const LinearRecipe r{static_cast<Scaling>(scaling), static_cast<c10::ScalarType>(grad_dtype)};
    return scaled_mm(x, weight, forward_options(r));
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1];
    const LinearRecipe r{static_cast<Scaling>(ctx->saved_data["scaling"].toInt()),
                         static_cast<c10::ScalarType>(ctx->saved_data["grad_dtype"].toInt())};
    const at::Tensor& dy = grads[0];
    at::Tensor dx, dw;
    if (ctx->needs_input_grad(0)) {
      dx = scaled_mm(dy, weight.t(), grad_input_options(r)).to(x.scalar_type());
    }
    if (ctx->needs_input_grad(1)) {
      dw = scaled_mm(dy.t(), x.t(), grad_weight_options(r)).to(weight.scalar_type());
    }
    return {dx, dw, at::Tensor(), at::Tensor()};
  }
};

}  // namespace detail

/// x (..., k) times weight (n, k) transposed, plus bias (n) when defined, in fp8 as `recipe`
/// says; the result is bf16, (..., n). Differentiable in x, weight and bias.
inline at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                         const LinearRecipe& recipe = {}) {
  if (weight.dim() != 2 || x.dim() < 1 || x.size(-1) != weight.size(1)) {
    throw Error("loom::fp8::linear: the input's last dimension must be the weight's second");
  }
  auto sizes = x.sizes().vec();
  sizes.back() = weight.size(0);
  at::Tensor y = detail::LinearFunction::apply(x.reshape({-1, x.size(-1)}), weight,
                                               static_cast<int64_t>(recipe.scaling),
                                               static_cast<int64_t>(recipe.grad_dtype))
                     .view(sizes);
  return bias.defined() ? y + bias.to(y.scalar_type()) : y;
}

}  // namespace loom::fp8
