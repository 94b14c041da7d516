#pragma once
// The default generators' states as Python stores them: torch.get_rng_state() (the CPU
// generator, a uint8 tensor) and torch.cuda.get_rng_state(i) (one CUDA generator).
#include <mutex>
#include <string>

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/Exception.h>

namespace loom::device {

/// The state of the default generator of `device` (a CPU, or one CUDA device): a uint8 tensor
/// on the CPU, the bytes Python's torch.get_rng_state() / torch.cuda.get_rng_state(i) return.
inline at::Tensor get_rng_state(c10::Device device = c10::Device(c10::kCPU)) {
  at::Generator g = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(g.mutex());
  return g.get_state();
}

/// Restores get_rng_state(device)'s value. A state of another size or dtype (another torch
/// version's format) is skipped with a warning naming `who`, so that a checkpoint still
/// loads; returns whether the state was restored.
inline bool set_rng_state(const at::Tensor& state, c10::Device device, const char* who) {
  at::Generator g = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(g.mutex());
  const at::Tensor now = g.get_state();
  if (state.scalar_type() != now.scalar_type() || state.numel() != now.numel()) {
    TORCH_WARN(who, ": the saved ", device.str(), " RNG state has ", state.numel(), " elements of ",
               state.scalar_type(), ", this torch expects ", now.numel(), " of ", now.scalar_type(),
               "; the RNG state was not restored");
    return false;
  }
  g.set_state(state.cpu().contiguous());
  return true;
}

}  // namespace loom::device
