#pragma once
#include <string>

#include <ATen/autocast_mode.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <loom/detail/torch_compat.hpp>
#include <loom/error.hpp>

namespace loom::amp {

/// An RAII autocast scope on one device type: LibTorch's missing `torch.autocast`.
///
/// Entering saves the device's enabled flag and dtype and the (global) cast-cache flag, then
/// sets them and increments the nesting depth. Leaving, also during unwinding, clears the
/// weight-cast cache when the outermost scope ends, then restores all three. An inner guard
/// with enabled = false makes an fp32 island. Autocast state is thread-local: destroy the
/// guard on the thread that made it.
///
/// Checks at construction: dtype is kHalf or kBFloat16; the device type supports autocast;
/// CUDA is usable for a CUDA guard (Python only warns and disables); CUDA bf16 needs compute
/// capability 8.0. A failed check throws loom::Error and changes nothing.
class [[nodiscard]] AutocastGuard {
 public:
  AutocastGuard(c10::DeviceType device, c10::ScalarType dtype, bool enabled = true,
                bool cache_enabled = true)
      : device_(device) {
    if (dtype != c10::kHalf && dtype != c10::kBFloat16) {
      throw Error(std::string("loom::amp::AutocastGuard: autocast computes in kHalf or "
                              "kBFloat16, not ") +
                  c10::toString(dtype));
    }
    if (!detail::autocast_available(device)) {
      throw Error("loom::amp::AutocastGuard: LibTorch has no autocast for device type " +
                  c10::DeviceTypeName(device, true));
    }
    if (device == c10::kCUDA && enabled) {
      if (!detail::cuda_usable()) {
        throw Error(
            "loom::amp::AutocastGuard: a CUDA autocast scope needs a usable CUDA device, "
            "and none is available");
      }
      if (dtype == c10::kBFloat16 && !detail::cuda_supports_bf16()) {
        throw Error(
            "loom::amp::AutocastGuard: this GPU does not support bf16 autocast "
            "(compute capability 8.0 or newer is needed); use 16-mixed");
      }
    }
    prev_enabled_ = detail::autocast_enabled(device);
    prev_dtype_ = detail::autocast_dtype(device);
    prev_cache_ = at::autocast::is_autocast_cache_enabled();
    detail::set_autocast_enabled(device, enabled);
    detail::set_autocast_dtype(device, dtype);
    at::autocast::increment_nesting();
    at::autocast::set_autocast_cache_enabled(cache_enabled);
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;
  ~AutocastGuard() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    detail::set_autocast_enabled(device_, prev_enabled_);
    detail::set_autocast_dtype(device_, prev_dtype_);
    at::autocast::set_autocast_cache_enabled(prev_cache_);
  }

 private:
  c10::DeviceType device_;
  bool prev_enabled_ = false;
  c10::ScalarType prev_dtype_ = c10::kBFloat16;
  bool prev_cache_ = true;
};

}  // namespace loom::amp
