// expect-error: it lacks `static constexpr std::string_view ddp_backend\(\)` naming .?"gloo.?", .?"nccl.?" or .?"mpi
#include <loom/device/defaults.hpp>
#include <loom/precision/fp32.hpp>
#include <loom/runtime.hpp>
struct Custom : loom::device::Defaults<Custom> {
  static constexpr c10::DeviceType device_type() { return c10::kCPU; }
  static constexpr std::string_view name() { return "custom"; }
#ifdef LOOM_FAIL
  static constexpr std::string_view ddp_backend() { return "tcp"; }
#else
  static constexpr std::string_view ddp_backend() { return "gloo"; }
#endif
};
using R = loom::Runtime<Custom, loom::precision::Fp32>;
static_assert(sizeof(R) > 0);
