#pragma once
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <loom/error.hpp>
#include <loom/guards.hpp>
#include <loom/state_dict.hpp>

namespace loom::precision {

/// The fp32 behaviour of every PrecisionPolicy member except the name. Empty and non-virtual.
///
/// A policy derives from it and writes only what differs; PrecisionPolicy is still checked
/// against the derived type, so the whole surface is verified every time.
struct Defaults {
  NullGuard forward_context(c10::DeviceType) const { return {}; }
  NullGuard tensor_init_context() const { return {}; }
  NullGuard module_init_context() const { return {}; }

  void convert_module(torch::nn::Module&) const {}
  at::Tensor convert_input(const at::Tensor& t) const { return t; }
  at::Tensor convert_output(const at::Tensor& t) const { return t; }

  at::Tensor pre_backward(const at::Tensor& loss, torch::nn::Module&) { return loss; }
  void backward(const at::Tensor& loss, torch::nn::Module&) { loss.backward(); }
  at::Tensor post_backward(const at::Tensor& loss, torch::nn::Module&) { return loss.detach(); }

  /// Runs the step; returns whether it was applied (always, here).
  bool optimizer_step(torch::optim::Optimizer& optimizer) {
    optimizer.step();
    return true;
  }

  /// The parameters the optimizer updates: every parameter of every group, in order.
  std::vector<at::Tensor> main_params(torch::optim::Optimizer& optimizer) const {
    std::vector<at::Tensor> params;
    for (auto& group : optimizer.param_groups()) {
      for (auto& p : group.params()) params.push_back(p);
    }
    return params;
  }

  StateDict state_dict() const { return {}; }
  void load_state_dict(const StateDict& state) {
    if (!state.empty()) {
      throw Error("loom: this precision policy has no state, but the state dict holds the key '" +
                  state.begin()->first + "'");
    }
  }
  void teardown() {}
};

}  // namespace loom::precision
