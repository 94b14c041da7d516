#pragma once
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <loom/amp/autocast.hpp>
#include <loom/amp/grad_scaler.hpp>
#include <loom/detail/fp16_cpu.hpp>
#include <loom/detail/meta.hpp>
#include <loom/error.hpp>
#include <loom/precision/cast.hpp>
#include <loom/precision/defaults.hpp>
#include <loom/step_result.hpp>

namespace loom::precision {

/// The hooks both mixed precisions share: fp32 weights, autocast around the forward.
///
/// forward_context is an autocast scope in `Dtype` on the device type the runtime passes,
/// never a fixed device; convert_input casts floating leaves to `Dtype` (as Fabric does),
/// convert_output casts them back to the default dtype after the scope has closed.
/// Self is the final policy (CRTP, passed on to Defaults).
template <class Self, c10::ScalarType Dtype>
struct Mixed : Defaults<Self> {
  /// The dtype autocast computes in.
  static constexpr c10::ScalarType dtype() { return Dtype; }

  amp::AutocastGuard forward_context(c10::DeviceType device) const {
    if constexpr (Dtype == c10::kHalf) detail::warn_if_fp16_on_cpu(Self::precision(), device);
    return {device, Dtype};
  }
  at::Tensor convert_input(const at::Tensor& t) const { return cast_floating(t, Dtype); }
  at::Tensor convert_output(const at::Tensor& t) const { return cast_to_default(t); }
};

/// "bf16-mixed": fp32 weights, bf16 autocast, no loss scaling (bf16 has fp32's range).
struct Bf16Mixed : Mixed<Bf16Mixed, c10::kBFloat16> {
  static constexpr std::string_view precision() { return "bf16-mixed"; }

  Bf16Mixed() = default;
  /// Refused at compile time: bf16-mixed has no scaler to configure.
  template <class Options>
  requires std::same_as<Options, amp::GradScalerOptions>
  explicit Bf16Mixed(const Options&) {
    static_assert(detail::always_false<Options>,
                  "loom::precision::Bf16Mixed: `bf16-mixed` does not use a scaler; pass "
                  "GradScalerOptions to Fp16Mixed, or construct Bf16Mixed without arguments");
  }
};

/// "16-mixed": fp32 weights, fp16 autocast, and dynamic loss scaling by amp::GradScaler.
///
/// backward scales the loss; optimizer_step unscales, skips the step if any gradient is
/// inf/nan, and updates the scale once (returns whether the step was applied: with a
/// loom::optim fused optimizer the whole step makes no host sync, and the StepResult reads
/// the device flag only when asked);
/// clip_gradients unscales first. The scaler's state is this policy's state_dict. Stepping,
/// unscaling or clipping without a backward() through the policy since the last step is an
/// error: the gradients would not be scaled ones.
/// On the CPU this is real fp16 autocast with loss scaling: LibTorch 2.x has CPU fp16
/// autocast, so loom does not fall back to bf16 as Lightning does; it warns once there, since
/// fp16 kernels are slow on a CPU (docs/precision.md).
struct Fp16Mixed : Mixed<Fp16Mixed, c10::kHalf> {
  static constexpr std::string_view precision() { return "16-mixed"; }

  Fp16Mixed() = default;
  explicit Fp16Mixed(amp::GradScalerOptions options) : scaler_(options) {}

  void backward(const at::Tensor& loss, torch::nn::Module&) {
    scaler_.scale(loss).backward();
    backward_ran_ = true;
  }

  StepResult optimizer_step(torch::optim::Optimizer& optimizer) {
    refuse_closure_optimizers(optimizer);
    require_backward("optimizer_step()");
    StepResult applied = scaler_.step(optimizer);
    scaler_.update();
    backward_ran_ = false;
    return applied;
  }

  /// One step of several optimizers, Python's recipe for several models and optimizers:
  /// scaler.step(o) for each (each unscales its own gradients, unless unscale_gradients did,
  /// and skips on its own inf/nan), then one scaler.update() over all their inf checks.
  std::vector<StepResult> optimizer_steps(Optimizers optimizers) {
    for (torch::optim::Optimizer& o : optimizers) refuse_closure_optimizers(o);
    require_backward("optimizer_step()");
    std::vector<StepResult> applied;
    applied.reserve(optimizers.size());
    for (torch::optim::Optimizer& o : optimizers) applied.push_back(scaler_.step(o));
    scaler_.update();
    backward_ran_ = false;
    return applied;
  }

  void unscale_gradients(torch::optim::Optimizer& optimizer) {
    refuse_closure_optimizers(optimizer);
    require_backward("unscale_gradients() or clip_gradients()");
    if (scaler_.stage(optimizer) == amp::GradScaler::Stage::Ready) scaler_.unscale_(optimizer);
  }

  GradNorm clip_gradients(torch::optim::Optimizer& optimizer, double value, ClipAlgorithm algorithm,
                          double norm_type = 2.0) {
    if (value <= 0) return GradNorm(0.0);
    if (amp::unscales_itself(optimizer)) {
      throw Error(
          "loom: 16-mixed cannot clip the gradients of an optimizer that unscales them "
          "itself (its step would unscale them a second time); clip inside the "
          "optimizer, or use bf16-mixed");
    }
    return Mixed::clip_gradients(optimizer, value, algorithm, norm_type);  // unscales first
  }

  /// The scaler's current scale (reads the scale tensor: a device sync on CUDA).
  double loss_scale() const { return scaler_.get_scale(); }

  StateDict state_dict() const { return scaler_.state_dict(); }
  void load_state_dict(const StateDict& state) { scaler_.load_state_dict(state); }

  /// The loss scaler.
  amp::GradScaler& scaler() noexcept { return scaler_; }
  const amp::GradScaler& scaler() const noexcept { return scaler_; }

 private:
  // The gradients are scaled only if the loss went through backward() above; a direct
  // loss.backward(), or a second step on the same gradients, would silently use wrong ones.
  void require_backward(const char* what) const {
    if (!backward_ran_) {
      throw Error(std::string("loom: 16-mixed ") + what + " needs a backward() through the " +
                  "runtime since the last optimizer step (a direct loss.backward() skips loss " +
                  "scaling)");
    }
  }

  // LBFGS: its closure recomputes the gradients unscaled (loom's optimizer table says which).
  static void refuse_closure_optimizers(torch::optim::Optimizer& optimizer) {
    amp::refuse_unscalable(optimizer);
  }

  amp::GradScaler scaler_;
  bool backward_ran_ = false;
};

}  // namespace loom::precision

namespace loom {
using precision::Bf16Mixed;
using precision::Fp16Mixed;
}  // namespace loom
