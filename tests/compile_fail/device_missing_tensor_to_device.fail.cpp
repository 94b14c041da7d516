// expect-error: the Device argument does not model DevicePolicy: it lacks `torch::Tensor tensor_to_device\(const torch::Tensor&\) const`
#include <loom/device/defaults.hpp>
#include <loom/precision/fp32.hpp>
#include <loom/runtime.hpp>
// A custom device that hides the default tensor_to_device behind a non-const overload.
struct Custom : loom::device::Defaults<Custom> {
  static constexpr c10::DeviceType device_type() { return c10::kCPU; }
  static constexpr std::string_view name() { return "custom"; }
  static constexpr std::string_view ddp_backend() { return "gloo"; }
#ifdef LOOM_FAIL
  at::Tensor tensor_to_device(const at::Tensor& t) { return t; }  // not const
#else
  at::Tensor tensor_to_device(const at::Tensor& t) const { return t; }
#endif
};
using R = loom::Runtime<Custom, loom::precision::Fp32>;
static_assert(sizeof(R) > 0);
