#pragma once
#include <string_view>

#include <c10/core/DeviceType.h>

#include <loom/device/defaults.hpp>

namespace loom::device {

/// The host CPU: blocking moves, no state, the gloo backend. An empty class.
struct Cpu : Defaults<Cpu> {
  static constexpr c10::DeviceType device_type() { return c10::kCPU; }
  static constexpr std::string_view name() { return "cpu"; }
  static constexpr std::string_view ddp_backend() { return "gloo"; }
};

}  // namespace loom::device

namespace loom {
using device::Cpu;
}  // namespace loom
