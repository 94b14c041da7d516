#pragma once
// Moving an optimizer's per-parameter state to a device.
//
// LibTorch keeps state in `Optimizer::state()`, keyed by each parameter's TensorImpl, as one
// OptimizerParamState subclass per optimizer. Each state is moved by the optimizer's row of
// loom's optimizer table (optim/optimizer_table.hpp: LibTorch's SGD, Adam, AdamW, RMSprop,
// Adagrad, LBFGS, loom::optim's, and those entered with register_optimizer<O>()); a state of
// another type by the mover the table holds for that type (a state type alone can be taught
// with `register_optimizer_state<State>`). An unknown state type is an error, never a silent skip.
// Host scalars (Adam's integer `step`) stay where they are.
#include <functional>
#include <string>
#include <typeindex>
#include <typeinfo>
#include <utility>

#include <c10/core/Device.h>
#include <c10/util/Type.h>
#include <torch/optim/optimizer.h>

#include <loom/error.hpp>
#include <loom/optim/optimizer_table.hpp>

namespace loom::device {

/// A function that moves every tensor of one parameter's optimizer state to a device.
using StateMover = optim::detail::StateMover;

/// Teaches optimizer_to_device one optimizer state type, for an optimizer loom's table does not
/// otherwise know (register_optimizer<O>() brings the mover with the rest of O's row);
/// `move(state, device)` must move every tensor the state holds. Registering a type again
/// replaces its mover.
template <class State>
void register_optimizer_state(std::function<void(State&, const c10::Device&)> move) {
  optim::detail::add_state_mover(
      std::type_index(typeid(State)),
      [move = std::move(move)](torch::optim::OptimizerParamState& s, const c10::Device& d) {
        move(static_cast<State&>(s), d);
      });
}

/// Moves every state tensor of `optimizer` to `device`, in place; parameters are untouched.
inline torch::optim::Optimizer& move_optimizer_state(torch::optim::Optimizer& optimizer,
                                                     const c10::Device& device) {
  const optim::OptimizerInfo* row = optim::find_optimizer(optimizer);
  for (auto& kv : optimizer.state()) {
    torch::optim::OptimizerParamState* s = kv.second.get();
    if (s == nullptr) continue;
    if (row != nullptr && std::type_index(typeid(*s)) == row->state_type) {
      row->move_state(*s, device);  // the optimizer's own row
      continue;
    }
    const StateMover mover = optim::detail::state_mover(typeid(*s));
    if (!mover) {
      throw Error(
          std::string("loom: optimizer_to_device does not know the optimizer state type '") +
          c10::demangle(typeid(*s).name()) +
          "'; enter its optimizer in loom's table with loom::optim::register_optimizer<O>() "
          "(docs/optim.md), or the state type alone with "
          "loom::device::register_optimizer_state<State>(mover)");
    }
    mover(*s, device);
  }
  return optimizer;
}

}  // namespace loom::device
