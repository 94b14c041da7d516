#pragma once
// Moving an optimizer's per-parameter state to a device.
//
// LibTorch keeps state in `Optimizer::state()`, keyed by each parameter's TensorImpl, as one
// OptimizerParamState subclass per optimizer. Every built-in subclass is handled here; other
// optimizers register a mover with `register_optimizer_state<State>`. An unknown state type is
// an error, never a silent skip. Host scalars (Adam's `step`) stay where they are.
#include <functional>
#include <mutex>
#include <string>
#include <typeindex>
#include <typeinfo>
#include <unordered_map>

#include <c10/core/Device.h>
#include <c10/util/Exception.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <loom/batch/walk.hpp>
#include <loom/detail/state_registry.hpp>
#include <loom/error.hpp>

namespace loom::device {

/// A function that moves every tensor of one parameter's optimizer state to a device.
using StateMover = detail::StateMover;

/// Teaches optimizer_to_device a user optimizer's state type; `move(state, device)` must move
/// every tensor the state holds. Registering a type again replaces its mover.
template <class State>
void register_optimizer_state(std::function<void(State&, const c10::Device&)> move) {
  std::lock_guard<std::mutex> lock(detail::registry_mutex());
  detail::registry()[std::type_index(typeid(State))] =
      [move = std::move(move)](torch::optim::OptimizerParamState& s, const c10::Device& d) {
        move(static_cast<State&>(s), d);
      };
}

/// Moves every state tensor of `optimizer` to `device`, in place; parameters are untouched.
inline torch::optim::Optimizer& move_optimizer_state(torch::optim::Optimizer& optimizer,
                                                     const c10::Device& device) {
  auto to = [&](const at::Tensor& t) { return t.to(device); };
  auto mv = [&](const auto& v) { return batch::map(v, to); };
  for (auto& kv : optimizer.state()) {
    torch::optim::OptimizerParamState* s = kv.second.get();
    if (s == nullptr) continue;
    if (auto* own = dynamic_cast<detail::MovableState*>(s)) {
      own->move_to(device);
    } else if (auto* a = dynamic_cast<torch::optim::AdamParamState*>(s)) {
      a->exp_avg(mv(a->exp_avg())).exp_avg_sq(mv(a->exp_avg_sq()));
      a->max_exp_avg_sq(mv(a->max_exp_avg_sq()));
    } else if (auto* w = dynamic_cast<torch::optim::AdamWParamState*>(s)) {
      w->exp_avg(mv(w->exp_avg())).exp_avg_sq(mv(w->exp_avg_sq()));
      w->max_exp_avg_sq(mv(w->max_exp_avg_sq()));
    } else if (auto* g = dynamic_cast<torch::optim::SGDParamState*>(s)) {
      g->momentum_buffer(mv(g->momentum_buffer()));
    } else if (auto* r = dynamic_cast<torch::optim::RMSpropParamState*>(s)) {
      r->square_avg(mv(r->square_avg())).momentum_buffer(mv(r->momentum_buffer()));
      r->grad_avg(mv(r->grad_avg()));
    } else if (auto* ag = dynamic_cast<torch::optim::AdagradParamState*>(s)) {
      ag->sum(mv(ag->sum()));
    } else if (auto* l = dynamic_cast<torch::optim::LBFGSParamState*>(s)) {
      l->d(mv(l->d())).H_diag(mv(l->H_diag())).prev_flat_grad(mv(l->prev_flat_grad()));
      l->old_dirs(mv(l->old_dirs())).old_stps(mv(l->old_stps())).ro(mv(l->ro()));
      l->al(mv(l->al()));
    } else {
      StateMover mover;
      {
        std::lock_guard<std::mutex> lock(detail::registry_mutex());
        auto it = detail::registry().find(std::type_index(typeid(*s)));
        if (it != detail::registry().end()) mover = it->second;
      }
      if (!mover) {
        throw Error(
            std::string("loom: optimizer_to_device does not know the optimizer state type '") +
            c10::demangle(typeid(*s).name()) +
            "'; register it with loom::device::register_optimizer_state<State>(mover)");
      }
      mover(*s, device);
    }
  }
  return optimizer;
}

}  // namespace loom::device
