#pragma once
// loom::optim::OptimizerInBackward: the optimizer step inside backward (Python's recipe with
// register_post_accumulate_grad_hook, torchtune's optimizer_in_bwd), so a parameter's gradient
// is freed as soon as it has been applied and a model never holds all its gradients at once:
//
//   loom::optim::OptimizerInBackward<loom::optim::AdamW> opt(
//       rt, model->named_parameters(), loom::optim::AdamWOptions(1e-3).weight_decay(0.01));
//   for (auto& batch : loader) {
//     rt.backward(loss_of(batch), model);   // each parameter steps as its gradient is ready
//   }                                       // (no rt.optimizer_step, no zero_grad)
//
// Each parameter that requires grad gets an optimizer of its own (`Optimizer({p}, options)`:
// loom's fused kernels on one tensor do the arithmetic they do on many, so training is the
// plain step's bit for bit) and a post-accumulate-grad hook (loom/nn/hooks.hpp) that calls its
// step() and then zero_grad() (the gradient set to none, its memory returned). The gradients
// alive at any time are those the backward is still computing: at most one parameter's worth
// once accumulated, not the model's.
//
// What it excludes, as Python's recipe does: gradient accumulation over micro-batches (every
// backward steps), clipping by the total norm (it needs every gradient first), 16-mixed's
// GradScaler (the step cannot be skipped afterwards) and strategies that reduce gradients
// after backward (Ddp, Zero, Fsdp: the hooks run before the reduction). Given the runtime that
// runs the backward (the first constructor), it refuses the last two: 16-mixed at compile
// time, more than one process with a loom::Error. LR schedulers step each
// optimizer (`for (auto& [name, o] : opt) scheduler_of(o).step()`). Its state is an entry of a
// loom::State ({"optimizer", opt}): {parameter name: that optimizer's Python state_dict()},
// torchtune's layout.
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/ordered_dict.h>

#include <loom/error.hpp>
#include <loom/nn/hooks.hpp>
#include <loom/state/optimizer.hpp>
#include <loom/state_dict.hpp>

namespace loom::optim {

template <class Optimizer>
class OptimizerInBackward {
 public:
  /// The optimizers of the constructor below, for the backward of `rt`, checked: its precision
  /// must not scale the loss (16-mixed: the step would apply scaled gradients, and could not
  /// be skipped on an overflow) and it must run one process (a strategy that reduces gradients
  /// after backward would have the hooks step on this process's own gradients).
  template <class Runtime, class Options>
  requires requires { Runtime::precision_name(); }
  OptimizerInBackward(const Runtime& rt,
                      const torch::OrderedDict<std::string, at::Tensor>& named_parameters,
                      const Options& options)
      : OptimizerInBackward(checked(rt, named_parameters), options) {
    static_assert(Runtime::precision_name() != "16-mixed",
                  "loom::optim::OptimizerInBackward: 16-mixed scales the loss, and a step "
                  "taken inside backward can neither unscale its gradients first nor be "
                  "skipped on an overflow; use bf16-mixed or a true precision");
  }

  /// One `Optimizer({p}, options)` for each parameter of `named_parameters` that requires
  /// grad, stepped by a hook when its gradient has been accumulated.
  template <class Options>
  OptimizerInBackward(const torch::OrderedDict<std::string, at::Tensor>& named_parameters,
                      const Options& options) {
    for (const auto& item : named_parameters) {
      const at::Tensor& p = item.value();
      if (!p.requires_grad()) continue;
      auto optimizer = std::make_unique<Optimizer>(std::vector<at::Tensor>{p}, options);
      Optimizer* o = optimizer.get();
      handles_.push_back(nn::register_post_accumulate_grad_hook(p, [o](const at::Tensor&) {
        o->step();
        o->zero_grad(/*set_to_none=*/true);
      }));
      optimizers_.emplace_back(item.key(), std::move(optimizer));
    }
    if (optimizers_.empty()) {
      throw Error("loom::optim::OptimizerInBackward: no parameter requires grad");
    }
  }

  OptimizerInBackward(const OptimizerInBackward&) = delete;
  OptimizerInBackward& operator=(const OptimizerInBackward&) = delete;
  OptimizerInBackward(OptimizerInBackward&&) noexcept = default;
  OptimizerInBackward& operator=(OptimizerInBackward&&) noexcept = default;
  /// Takes the hooks out: the parameters' backward no longer steps.
  ~OptimizerInBackward() { remove(); }

  /// Takes the hooks out now (the optimizers and their state stay).
  void remove() {
    for (nn::HookHandle& h : handles_) h.remove();
    handles_.clear();
  }

  /// The parameters' optimizers, in the module's order, each with its parameter's name.
  std::size_t size() const noexcept { return optimizers_.size(); }
  auto begin() const { return optimizers_.begin(); }
  auto end() const { return optimizers_.end(); }

  /// The optimizer of the parameter named `name`; another name is a loom::Error.
  Optimizer& optimizer(const std::string& name) const {
    for (const auto& [n, o] : optimizers_) {
      if (n == name) return *o;
    }
    throw Error("loom::optim::OptimizerInBackward: no optimizer for a parameter named '" + name +
                "'");
  }

  /// {parameter name: Python's state_dict() of its optimizer}.
  StateDict state_dict() const {
    StateDict out;
    for (const auto& [name, o] : optimizers_) {
      out.emplace(name, c10::IValue(state::optimizer_state(*o, name)));
    }
    return out;
  }
  /// Loads what state_dict() saved; a parameter missing from `state`, or a name no parameter
  /// has, is a loom::Error.
  void load_state_dict(const StateDict& state) {
    for (const auto& [name, o] : optimizers_) {
      auto it = state.find(name);
      if (it == state.end()) {
        throw Error("loom::optim::OptimizerInBackward: the state has no optimizer for '" + name +
                    "'");
      }
      state::load_optimizer_state(*o, it->second, name);
    }
    for (const auto& [name, value] : state) {
      (void)value;
      (void)optimizer(name);  // throws for a name no parameter has
    }
  }

 private:
  template <class Runtime>
  static const torch::OrderedDict<std::string, at::Tensor>& checked(
      const Runtime& rt, const torch::OrderedDict<std::string, at::Tensor>& named_parameters) {
    if (rt.strategy().world_size() > 1) {
      throw Error("loom::optim::OptimizerInBackward: the runtime runs " +
                  std::to_string(rt.strategy().world_size()) +
                  " processes; its strategy reduces the gradients after backward, when the "
                  "hooks have already stepped on this process's own (one process only)");
    }
    return named_parameters;
  }

  std::vector<std::pair<std::string, std::unique_ptr<Optimizer>>> optimizers_;
  std::vector<nn::HookHandle> handles_;
};

}  // namespace loom::optim
