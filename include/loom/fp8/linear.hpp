#pragma once
// loom::fp8::linear: y = x W^T + b with the forward product and both backward products in
// fp8 (scaled_mm.hpp): e4m3 for the input and the weight, e5m2 (by default) for the output's
// gradient, never e5m2 x e5m2. Under tensor-wise and delayed scales each operand is cast
// once and its fp8 bytes transposed for the backward products; under row-wise scales the
// input and the weight are kept in their own dtypes for the backward pass and cast again
// there, along the dimension each product contracts (the autograd function in src/fp8/fp8.cpp).
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

}  // namespace detail

/// x (..., k) times weight (n, k) transposed, plus bias (n) when defined, in fp8 as `recipe`
/// says; the result is bf16, (..., n). Differentiable in x, weight and bias. Scaling::Delayed
/// takes its scales from, and records its amaxes in, `delayed` (layer `delayed.layer` of a
/// DelayedBlock on x's device).
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                  const LinearRecipe& recipe = {}, DelayedRef delayed = {});

}  // namespace loom::fp8
