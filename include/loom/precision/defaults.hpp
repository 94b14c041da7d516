#pragma once
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/ones_like.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <loom/concepts/precision_policy.hpp>
#include <loom/detail/precision_defaults.hpp>
#include <loom/detail/refuse_state.hpp>
#include <loom/guards.hpp>
#include <loom/state_dict.hpp>
#include <loom/step_result.hpp>

namespace loom::precision {

/// The fp32 behaviour of every PrecisionPolicy member except the name. Empty and non-virtual.
///
/// Self is the policy deriving from it (CRTP). A policy writes only what differs; what it
/// inherits calls the policy's own members through Self, so an overridden main_params or
/// unscale_gradients is the one clip_gradients uses. PrecisionPolicy is still checked against
/// the derived type, so the whole surface is verified every time.
///
///   struct PureBf16 : loom::precision::Defaults<PureBf16> {
///     static constexpr std::string_view precision() { return "pure-bf16"; }
///     void convert_module(torch::nn::Module& m) const { cast_module(m, c10::kBFloat16); }
///   };
template <class Self>
struct Defaults {
  /// Names this base for loom::is_default (is_default.hpp).
  using defaults_type = Defaults;

  /// Learns the runtime's device once, when the runtime is built (fp8-mixed: whether this GPU
  /// runs fp8 products); nothing here.
  void bind_device(c10::Device) {}

  NullGuard forward_context(c10::DeviceType) const { return {}; }
  NullGuard tensor_init_context() const { return {}; }
  NullGuard module_init_context() const { return {}; }

  void convert_module(torch::nn::Module&) const {}
  at::Tensor convert_input(const at::Tensor& t) const { return t; }
  at::Tensor convert_output(const at::Tensor& t) const { return t; }

  at::Tensor pre_backward(const at::Tensor& loss, torch::nn::Module&) { return loss; }
  /// Python's loss.backward(): a scalar loss's seed gradient made as torch.autograd makes it
  /// (ones_like, preserve_format), so the step runs Python's operators (LibTorch's own seed is
  /// contiguous: aten::empty where Python has aten::empty_strided); any other loss as
  /// LibTorch's backward() takes it (a non-scalar one is its error).
  void backward(const at::Tensor& loss, torch::nn::Module&) {
    if (loss.requires_grad() && loss.numel() == 1) {
      torch::autograd::backward({loss}, {at::ones_like(loss, at::MemoryFormat::Preserve)});
    } else {
      loss.backward();
    }
  }
  /// The loss without its graph, for logging: a shallow copy (no operator dispatched).
  at::Tensor post_backward(const at::Tensor& loss, torch::nn::Module&) {
    return loss.variable_data();
  }

  /// State every rank must agree on before the optimizer step: a tensor the runtime all-reduces
  /// with Max in place across ranks before each optimizer_step (fp8-mixed: the delayed
  /// scales' current amaxes). Undefined: nothing to agree on, as here.
  at::Tensor max_reduced_before_step() const { return {}; }

  /// Runs the step; returns whether it was applied (always, here).
  bool optimizer_step(torch::optim::Optimizer& optimizer) {
    optimizer.step();
    return true;
  }

  /// One step of several optimizers (a GAN's, a split Muon + AdamW): self's optimizer_step
  /// for each, in order.
  std::vector<StepResult> optimizer_steps(Optimizers optimizers) {
    std::vector<StepResult> applied;
    applied.reserve(optimizers.size());
    for (torch::optim::Optimizer& o : optimizers) applied.emplace_back(self().optimizer_step(o));
    return applied;
  }

  /// The parameters the optimizer updates: every parameter of every group, in order.
  std::vector<at::Tensor> main_params(torch::optim::Optimizer& optimizer) const {
    return detail::all_params(optimizer);
  }

  /// Makes the gradients true gradients (undoes loss scaling); nothing to undo here.
  void unscale_gradients(torch::optim::Optimizer&) {}

  /// Unscales (self's unscale_gradients), then clips the gradients of self's main_params(o);
  /// `value <= 0` clips nothing. Returns the total norm before clipping for
  /// ClipAlgorithm::Norm (nan or inf when a gradient is not finite), 0 otherwise. The norm is
  /// Python's `clip_grad_norm_(foreach=True)`, computed and applied on the device: no sync.
  GradNorm clip_gradients(torch::optim::Optimizer& optimizer, double value, ClipAlgorithm algorithm,
                          double norm_type = 2.0) {
    if (value <= 0) return GradNorm(0.0);
    self().unscale_gradients(optimizer);
    return detail::clip_params(self().main_params(optimizer), value, algorithm, norm_type);
  }

  /// The factor the loss is multiplied by before backward: 1, no loss scaling.
  double loss_scale() const { return 1.0; }

  StateDict state_dict() const { return {}; }
  void load_state_dict(const StateDict& state) {
    detail::refuse_state(Self::precision(), "precision", state);
  }
  void teardown() {}

 private:
  Self& self() { return static_cast<Self&>(*this); }
};

}  // namespace loom::precision
