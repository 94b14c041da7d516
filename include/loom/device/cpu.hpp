#pragma once
#include <string>
#include <string_view>

#include <c10/core/DeviceType.h>

#include <loom/device/defaults.hpp>
#include <loom/device/rng.hpp>
#include <loom/state_dict.hpp>
#include <loom/state_reader.hpp>

namespace loom::device {

/// The host CPU: blocking moves, the gloo backend. An empty class; its state is the CPU
/// generator's (what dropout, randperm and torch::rand draw from on the CPU).
struct Cpu : Defaults<Cpu> {
  static constexpr c10::DeviceType device_type() { return c10::kCPU; }
  static constexpr std::string_view name() { return "cpu"; }
  static constexpr std::string_view ddp_backend() { return "gloo"; }

  /// {"torch": the CPU generator's state}: Python's torch.get_rng_state(), a uint8 tensor.
  StateDict state_dict() const { return {{"torch", get_rng_state()}}; }

  /// Restores the CPU generator; a state of another torch version's size is skipped with a
  /// warning. "torch.cuda" (a CUDA device's generator, in a state saved by loom::Cuda) is
  /// accepted and ignored: a CUDA run resumes on the CPU.
  void load_state_dict(const StateDict& state) {
    static constexpr const char* owner = "loom::device::Cpu::load_state_dict";
    state::Reader r(std::string(owner), state);
    const auto torch = r.optional_tensor("torch");
    r.ignore("torch.cuda");
    r.finish();
    if (torch) set_rng_state(*torch, c10::Device(c10::kCPU), owner);
  }
};

}  // namespace loom::device

namespace loom {
using device::Cpu;
}  // namespace loom
