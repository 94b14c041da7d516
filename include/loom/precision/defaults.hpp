#pragma once
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <torch/nn/module.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/optimizer.h>

#include <loom/error.hpp>
#include <loom/guards.hpp>
#include <loom/state_dict.hpp>

namespace loom::precision {

/// How clip_gradients limits gradients: each element to [-v, v], or the total norm to v.
enum class ClipAlgorithm { value, norm };

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

  /// Makes the gradients true gradients (undoes loss scaling); nothing to undo here.
  void unscale_gradients(torch::optim::Optimizer&) {}

  /// Clips the gradients of main_params(o); `value <= 0` clips nothing. Returns the total
  /// norm before clipping for ClipAlgorithm::norm, 0 otherwise.
  double clip_gradients(torch::optim::Optimizer& optimizer, double value, ClipAlgorithm algorithm,
                        double norm_type = 2.0) {
    if (value <= 0) return 0.0;
    auto params = main_params(optimizer);
    if (algorithm == ClipAlgorithm::value) {
      torch::nn::utils::clip_grad_value_(params, value);
      return 0.0;
    }
    return torch::nn::utils::clip_grad_norm_(params, value, norm_type,
                                             /*error_if_nonfinite=*/false);
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
