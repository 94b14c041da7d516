#pragma once
// loom::fp8::scaled_mm: a @ b^T with both operands cast to float8 on the fly, on
// at::_scaled_mm (cuBLASLt on CUDA devices of compute capability 8.9 and up; an emulated,
// numerically faithful and slow kernel on the CPU). The building block of fp8::linear and of
// the "fp8-mixed" precision (docs/fp8.md).
//
// Each operand is scaled so that its largest magnitude (per tensor, or per row of the
// contraction dimension) lands on the format's largest finite value, clamped, and cast;
// _scaled_mm is given the inverse (dequantisation) scales in fp32. A non-finite value makes
// its scale's whole output nan (never finite wrong numbers): the whole product for one scale
// per tensor, the rows it is in for row-wise scales.
#include <cstdint>
#include <limits>

#include <ATen/ATen.h>

#include <loom/error.hpp>

namespace loom::fp8 {

/// How an operand's scale is chosen.
enum class Scaling {
  Tensorwise,  ///< dynamic, one scale per tensor: max / amax (torchao's default recipe, cuBLAS)
  Rowwise,     ///< dynamic, one per row of the contraction dimension (torchao's ROWWISE, CUTLASS)
  Delayed,     ///< one per tensor, from earlier steps' amaxes (TransformerEngine's; delayed.hpp)
};

/// The largest finite value of an fp8 format: 448 for e4m3fn, 57344 for e5m2.
double max_value(c10::ScalarType dtype);

/// The smallest amax a scale is computed from (torchao's EPS): an all-zero operand stays zero.
inline constexpr double amax_floor = 1e-12;

/// An operand in fp8 and its dequantisation scale: the value is about data * inv_scale.
struct Quantized {
  at::Tensor data;       ///< fp8, contiguous, (rows, k)
  at::Tensor inv_scale;  ///< fp32: 0-dim (Tensorwise) or (rows, 1) (Rowwise)
};

/// Casts the 2-D `t` (any floating dtype, any strides) to the fp8 `dtype`, with scales per
/// tensor or per row (dimension 0; the rows run along the contraction dimension 1). Four
/// passes over the data: the amax, the product by the scale, the clamp, the cast.
Quantized quantize(const at::Tensor& t, c10::ScalarType dtype, Scaling scaling);

/// Where a delayed-scaling operand takes its scale from and records its amax (delayed.hpp).
struct ScaleSlot {
  at::Tensor scale;  ///< 0-dim fp32 quantisation scale: data = clamp(value * scale)
  at::Tensor amax;   ///< 0-dim fp32, raised in place to the operand's amax (nan if it has one)
};

/// Casts `t` with a scale chosen earlier (delayed scaling) and records its amax in the slot.
/// Values beyond the format's range saturate (clamped); a non-finite value makes the whole
/// operand nan, as with dynamic scales, never a finite wrong number.
Quantized quantize(const at::Tensor& t, c10::ScalarType dtype, const ScaleSlot& slot);

/// Casts `t` by `scaling`: with `slot`'s scale under Scaling::Delayed, else dynamically.
Quantized quantize(const at::Tensor& t, c10::ScalarType dtype, Scaling scaling,
                   const ScaleSlot& slot);

/// The recipe of one product.
struct MatmulOptions {
  c10::ScalarType a_dtype = c10::kFloat8_e4m3fn;
  c10::ScalarType b_dtype = c10::kFloat8_e4m3fn;
  Scaling scaling = Scaling::Tensorwise;
  c10::ScalarType out_dtype = c10::kBFloat16;
  bool fast_accum = false;       ///< cuBLASLt's fast accumulation (torchao: forward output only)
  ScaleSlot a_slot{}, b_slot{};  ///< Scaling::Delayed only: each operand's scale and amax
};

namespace detail {

inline int64_t pad16(int64_t n) { return (16 - n % 16) % 16; }

}  // namespace detail

/// a @ b^T for operands already in fp8: a (m, k) and b (n, k), both row-major with k and n
/// multiples of 16; tensor-wise scales (0-dim) or row-wise ones ((m, 1) and (n, 1)) as
/// quantize() makes them. The result is (m, n) in `out_dtype`.
at::Tensor mm(const Quantized& a, const Quantized& b, c10::ScalarType out_dtype,
              bool fast_accum = false);

namespace detail {

/// The two operands of scaled_mm(a, b, options), cast: k padded with zeros to a multiple of 16
/// in both, n in b (cuBLASLt's rule; zeros change neither the product nor a scale).
struct Operands {
  Quantized a, b;
};

Operands cast_operands(const at::Tensor& a, const at::Tensor& b, const MatmulOptions& o);

}  // namespace detail

/// a @ b^T for a (m, k) and b (n, k), both cast to fp8 as `options` says; (m, n) in
/// options.out_dtype. k and n are padded with zeros to multiples of 16 where they are not
/// (cuBLASLt's rule; zeros change neither the product nor a scale).
at::Tensor scaled_mm(const at::Tensor& a, const at::Tensor& b, const MatmulOptions& options = {});

}  // namespace loom::fp8
