#pragma once
// The process-wide table of optimizer-state movers behind device::register_optimizer_state,
// and the interface of states that move themselves.
#include <functional>
#include <mutex>
#include <typeindex>
#include <unordered_map>

#include <c10/core/Device.h>
#include <torch/optim/optimizer.h>

namespace loom::detail {

/// Moves every tensor of one parameter's optimizer state to a device.
using StateMover = std::function<void(torch::optim::OptimizerParamState&, const c10::Device&)>;

/// A parameter's optimizer state that moves itself to a device (loom's own optimizers):
/// device::move_optimizer_state calls it, no registration needed.
struct MovableState {
  virtual void move_to(const c10::Device& device) = 0;
  MovableState() = default;
  MovableState(const MovableState&) = default;
  MovableState& operator=(const MovableState&) = default;
  virtual ~MovableState() = default;
};

inline std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
inline std::unordered_map<std::type_index, StateMover>& registry() {
  static std::unordered_map<std::type_index, StateMover> r;
  return r;
}

}  // namespace loom::detail
