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
inline double max_value(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kFloat8_e4m3fn:
      return 448.0;
    case c10::kFloat8_e5m2:
      return 57344.0;
    default:
      throw Error(std::string("loom::fp8: ") + c10::toString(dtype) +
                  " is not an fp8 format loom casts to (float8_e4m3fn, float8_e5m2)");
  }
}

/// The smallest amax a scale is computed from (torchao's EPS): an all-zero operand stays zero.
inline constexpr double kAmaxFloor = 1e-12;

/// An operand in fp8 and its dequantisation scale: the value is about data * inv_scale.
struct Quantized {
  at::Tensor data;       ///< fp8, contiguous, (rows, k)
  at::Tensor inv_scale;  ///< fp32: 0-dim (Tensorwise) or (rows, 1) (Rowwise)
};

namespace detail {

// The largest magnitude of `t` in fp32: 0-dim, or (rows, 1) per row. One pass over `t` in its
// own dtype and strides; exact (the largest magnitude is one of the values, and rounding to
// fp32 keeps their order). inf or nan when `t` holds one.
inline at::Tensor amax(const at::Tensor& t, bool per_row) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  const at::Tensor m = per_row ? at::linalg_vector_norm(t, inf, at::IntArrayRef{1}, true)
                               : at::linalg_vector_norm(t, inf);
  return m.to(at::kFloat);
}

// clamp(t * scale, -top, top) cast to `dtype`, row-major whatever t's strides: t is read
// once in its own dtype and multiplied in fp32 (a 0-dim scale is given a dimension, so that
// it does not leave the product in t's dtype), clamped in place and cast.
inline at::Tensor cast(const at::Tensor& t, const at::Tensor& scale, c10::ScalarType dtype,
                       double top) {
  const at::Tensor src = t.scalar_type() == at::kDouble ? t.to(at::kFloat) : t;
  at::Tensor x = at::empty(src.sizes(), src.options().dtype(at::kFloat));
  at::mul_out(x, src, scale.dim() == 0 ? scale.view({1, 1}) : scale);
  return x.clamp_(-top, top).to(dtype);
}

}  // namespace detail

/// Casts the 2-D `t` (any floating dtype, any strides) to the fp8 `dtype`, with scales per
/// tensor or per row (dimension 0; the rows run along the contraction dimension 1). Four
/// passes over the data: the amax, the product by the scale, the clamp, the cast.
inline Quantized quantize(const at::Tensor& t, c10::ScalarType dtype, Scaling scaling) {
  if (t.dim() != 2) throw Error("loom::fp8::quantize: expected a matrix");
  if (scaling == Scaling::Delayed) {
    throw Error("loom::fp8::quantize: Scaling::Delayed takes its scale from a ScaleSlot");
  }
  const double top = max_value(dtype);
  const at::Tensor amax = detail::amax(t, scaling == Scaling::Rowwise).clamp_min_(kAmaxFloor);
  const at::Tensor scale = at::reciprocal(amax).mul_(top);
  return {detail::cast(t, scale, dtype, top), at::reciprocal(scale)};
}

/// Where a delayed-scaling operand takes its scale from and records its amax (delayed.hpp).
struct ScaleSlot {
  at::Tensor scale;  ///< 0-dim fp32 quantisation scale: data = clamp(value * scale)
  at::Tensor amax;   ///< 0-dim fp32, raised in place to the operand's amax (nan if it has one)
};

/// Casts `t` with a scale chosen earlier (delayed scaling) and records its amax in the slot.
/// Values beyond the format's range saturate (clamped); a non-finite value makes the whole
/// operand nan, as with dynamic scales, never a finite wrong number.
inline Quantized quantize(const at::Tensor& t, c10::ScalarType dtype, const ScaleSlot& slot) {
  if (t.dim() != 2) throw Error("loom::fp8::quantize: expected a matrix");
  const double top = max_value(dtype);
  const at::Tensor amax = detail::amax(t, false);
  at::Tensor recorded = slot.amax;  // the same tensor: maximum_out writes the slot in place
  at::maximum_out(recorded, slot.amax, amax);
  // amax - amax is 0, or nan when amax is inf or nan: then every element is nan.
  const at::Tensor scale = slot.scale + (amax - amax);
  return {detail::cast(t, scale, dtype, top), at::reciprocal(slot.scale)};
}

/// Casts `t` by `scaling`: with `slot`'s scale under Scaling::Delayed, else dynamically.
inline Quantized quantize(const at::Tensor& t, c10::ScalarType dtype, Scaling scaling,
                          const ScaleSlot& slot) {
  return scaling == Scaling::Delayed ? quantize(t, dtype, slot) : quantize(t, dtype, scaling);
}

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

// On a CPU with AMX, _scaled_mm takes oneDNN's fp8 kernel, which is several hundred times
// slower than its emulated one (dequantise to fp32, then an fp32 matmul) and gives the same
// values; this guard selects the emulated one for the call. The flag it sets is LibTorch's
// process-wide "use oneDNN" switch, restored on exit: another thread's CPU convolutions run
// without oneDNN while it is held.
class [[nodiscard]] CpuEmulatedScaledMm {
 public:
  explicit CpuEmulatedScaledMm(bool cpu)
      : previous_(cpu && at::globalContext().userEnabledMkldnn()) {
    if (previous_) at::globalContext().setUserEnabledMkldnn(false);
  }
  CpuEmulatedScaledMm(const CpuEmulatedScaledMm&) = delete;
  CpuEmulatedScaledMm& operator=(const CpuEmulatedScaledMm&) = delete;
  ~CpuEmulatedScaledMm() {
    if (previous_) at::globalContext().setUserEnabledMkldnn(true);
  }

 private:
  bool previous_;
};

}  // namespace detail

/// a @ b^T for operands already in fp8: a (m, k) and b (n, k), both row-major with k and n
/// multiples of 16; tensor-wise scales (0-dim) or row-wise ones ((m, 1) and (n, 1)) as
/// quantize() makes them. The result is (m, n) in `out_dtype`.
inline at::Tensor mm(const Quantized& a, const Quantized& b, c10::ScalarType out_dtype,
                     bool fast_accum = false) {
  // _scaled_mm: a row-major, b column-major (the transpose of a contiguous (n, k)); row-wise
  // scales (m, 1) and (1, n).
  const at::Tensor scale_b = b.inv_scale.dim() == 2 ? b.inv_scale.t().contiguous() : b.inv_scale;
  const detail::CpuEmulatedScaledMm emulated(a.data.is_cpu());
  return at::_scaled_mm(a.data, b.data.t(), a.inv_scale, scale_b, /*bias=*/std::nullopt,
                        /*scale_result=*/std::nullopt, out_dtype, fast_accum);
}

namespace detail {

/// The two operands of scaled_mm(a, b, options), cast: k padded with zeros to a multiple of 16
/// in both, n in b (cuBLASLt's rule; zeros change neither the product nor a scale).
struct Operands {
  Quantized a, b;
};

inline Operands cast_operands(const at::Tensor& a, const at::Tensor& b, const MatmulOptions& o) {
  const int64_t pk = pad16(a.size(1)), pn = pad16(b.size(0));
  const at::Tensor ap = pk ? at::constant_pad_nd(a, {0, pk}) : a;
  const at::Tensor bp = (pk || pn) ? at::constant_pad_nd(b, {0, pk, 0, pn}) : b;
  return {quantize(ap, o.a_dtype, o.scaling, o.a_slot),
          quantize(bp, o.b_dtype, o.scaling, o.b_slot)};
}

}  // namespace detail

/// a @ b^T for a (m, k) and b (n, k), both cast to fp8 as `options` says; (m, n) in
/// options.out_dtype. k and n are padded with zeros to multiples of 16 where they are not
/// (cuBLASLt's rule; zeros change neither the product nor a scale).
inline at::Tensor scaled_mm(const at::Tensor& a, const at::Tensor& b,
                            const MatmulOptions& options = {}) {
  if (a.dim() != 2 || b.dim() != 2 || a.size(1) != b.size(1)) {
    throw Error("loom::fp8::scaled_mm: expected a (m, k) and b (n, k)");
  }
  if (options.a_dtype == c10::kFloat8_e5m2 && options.b_dtype == c10::kFloat8_e5m2) {
    throw Error("loom::fp8::scaled_mm: e5m2 x e5m2 is not a product _scaled_mm runs");
  }
  if (options.scaling == Scaling::Delayed &&
      !(options.a_slot.scale.defined() && options.b_slot.scale.defined())) {
    throw Error("loom::fp8::scaled_mm: Scaling::Delayed needs both operands' scale slots");
  }
  const detail::Operands q = detail::cast_operands(a, b, options);
  const at::Tensor out = mm(q.a, q.b, options.out_dtype, options.fast_accum);
  const int64_t n = b.size(0);
  return out.size(1) != n ? out.narrow(1, 0, n) : out;
}

}  // namespace loom::fp8
