#pragma once
// The LibTorch calls whose spelling differs between the versions loom supports (2.11 to
// 2.15). Everything else calls LibTorch directly; a new difference gets a wrapper here.
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <torch/version.h>

namespace loom::detail {

static_assert(TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 11,
              "loom needs LibTorch 2.11 or newer");

// Autocast: the device-generic API (torch >= 2.4). The per-device wrappers (is_enabled,
// set_cpu_enabled, get_autocast_gpu_dtype, ...) are deprecated and warn at run time.
inline bool autocast_enabled(c10::DeviceType d) { return at::autocast::is_autocast_enabled(d); }
inline void set_autocast_enabled(c10::DeviceType d, bool on) {
  at::autocast::set_autocast_enabled(d, on);
}
inline c10::ScalarType autocast_dtype(c10::DeviceType d) {
  return at::autocast::get_autocast_dtype(d);
}
inline void set_autocast_dtype(c10::DeviceType d, c10::ScalarType t) {
  at::autocast::set_autocast_dtype(d, t);
}
inline bool autocast_available(c10::DeviceType d) { return at::autocast::is_autocast_available(d); }

/// True if a CUDA device is usable in this process.
inline bool cuda_usable() { return at::globalContext().hasCUDA(); }

/// True if the current CUDA device computes in bf16 (compute capability >= 8.0).
inline bool cuda_supports_bf16() {
  return cuda_usable() && at::detail::getCUDAHooks().supportsBFloat16ConvolutionWithCuDNNv8();
}

}  // namespace loom::detail
