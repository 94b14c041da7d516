#pragma once
// loom::amp::GradScaler: dynamic loss scaling, a port of torch/amp/grad_scaler.py
// (docs/amp.md). LibTorch has no GradScaler (pytorch/pytorch#44710), so the scaler is built
// here on the two ATen AMP ops:
//
//   scale(loss)   loss * scale                                  scale: f32 0-dim, lazily made
//   unscale_(o)   grads *= 1/scale, found_inf per device        _amp_foreach_non_finite_check_
//                                                               and_unscale_, per (device, dtype)
//   step(o)       o.step() only if no inf/nan was found         one host sync (found_inf.item);
//                 an optimizer the optimizer table calls        none: check-only inf pass, the
//                 Fused (loom::optim's) skips on the device     kernel unscales (grad_scale)
//   update()      scale *= backoff on inf, *= growth after      _amp_update_scale_, in place
//                 growth_interval clean steps
//
// Per-optimizer state (stage, found_inf per device) is keyed by the optimizer's address and
// cleared by update(), as in torch.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/core/TensorOptions.h>
#include <torch/optim/optimizer.h>

#include <loom/error.hpp>
#include <loom/optim/optimizer_table.hpp>
#include <loom/optim/optimizer_traits.hpp>
#include <loom/state_dict.hpp>
#include <loom/state_reader.hpp>
#include <loom/step_result.hpp>

namespace loom::amp {

/// The settings of a GradScaler, with torch.amp.GradScaler's defaults.
///
/// Requirements (checked by the GradScaler constructor and by load_state_dict):
/// growth_factor > 1, 0 < backoff_factor < 1, growth_interval >= 1.
struct GradScalerOptions {
  double init_scale = 65536.0;     ///< the scale before the first update
  double growth_factor = 2.0;      ///< scale multiplier after growth_interval clean steps
  double backoff_factor = 0.5;     ///< scale multiplier after a step with inf/nan gradients
  int64_t growth_interval = 2000;  ///< clean steps in a row before the scale grows
  bool enabled = true;             ///< false: scale() is identity and step() a plain step
};

/// A dynamic loss scaler for fp16 mixed precision: the C++ port of torch.amp.GradScaler.
///
///   loom::amp::GradScaler scaler;                 // 65536, x2 every 2000 clean steps, x0.5 on inf
///   scaler.scale(loss).backward();                // grads = scale x true grads
///   scaler.unscale_(optimizer);                   // optional: true grads, e.g. for clipping
///   bool applied = scaler.step(optimizer);        // skipped (false) if any grad is inf/nan
///   scaler.update();                              // once per iteration, after every step
///
/// The scale lives in a tensor on the loss's device, so only step() (and get_scale(),
/// get_growth_tracker(), state_dict() once the tensors exist) wait for the device. A copy is
/// deep: it owns its own scale tensors. Divergences from torch: options are validated even
/// when disabled and again on load; load_state_dict rejects missing and unknown keys; the
/// errors are loom::Error. Page: docs/amp.md
class GradScaler {
 public:
  /// Where an optimizer is in the current iteration; update() sends every optimizer back to
  /// `ready`.
  enum class Stage { Ready, Unscaled, Stepped };

  /// A scaler with these options; throws loom::Error if they break the requirements.
  explicit GradScaler(GradScalerOptions options = {}) : options_(options) {
    validate(options_, "GradScaler");
  }

  GradScaler(const GradScaler& other)
      : options_(other.options_),
        init_growth_tracker_(other.init_growth_tracker_),
        scale_(clone(other.scale_)),
        growth_tracker_(clone(other.growth_tracker_)),
        one_(clone(other.one_)),
        per_optimizer_(other.per_optimizer_) {
    for (auto& entry : per_optimizer_) {
      for (auto& found : entry.second.found_inf) found.second = clone(found.second);
    }
  }
  GradScaler& operator=(const GradScaler& other) {
    if (this != &other) *this = GradScaler(other);
    return *this;
  }
  GradScaler(GradScaler&&) noexcept = default;
  GradScaler& operator=(GradScaler&&) noexcept = default;
  ~GradScaler() = default;

  /// `outputs * scale`; the first call creates the scale (f32) and growth tracker (i32),
  /// both 0-dim, on `outputs`' device. Returns `outputs` itself when disabled.
  at::Tensor scale(const at::Tensor& outputs) {
    if (!options_.enabled) return outputs;
    if (!outputs.defined()) throw Error("loom::amp::GradScaler::scale: the tensor is undefined");
    if (!scale_.defined()) lazy_init(outputs.device());
    return outputs.mul(scale_.to(outputs.device(), c10::kFloat, /*non_blocking=*/true));
  }

  /// Each tensor times the scale; the scale is copied once per device. The first tensor's
  /// device receives the scale if none exists yet.
  std::vector<at::Tensor> scale(const std::vector<at::Tensor>& outputs);

  /// Divides the optimizer's gradients by the scale in place and records, per device,
  /// whether any was inf or nan. At most once per optimizer between two update()s, and not
  /// after step(); step() calls it itself when it has not run. No host sync.
  void unscale_(torch::optim::Optimizer& optimizer);

  /// Unscales (unless unscale_ already ran) and runs `optimizer.step()` only if no gradient
  /// was inf or nan. Returns whether the step was applied; a disabled scaler always steps.
  ///
  /// An optimizer that loom's optimizer table marks AmpSupport::Fused (loom::optim's fused
  /// optimizers) steps as Python's fused optimizers do under torch's scaler, with no host
  /// sync: a check-only inf pass (the gradients stay scaled), then one fused call that divides
  /// by the scale inside the kernel (no scale when unscale_ already ran) and does nothing if
  /// the device-side found_inf is set. The result then holds that flag: reading it is the one
  /// sync.
  StepResult step(torch::optim::Optimizer& optimizer);

  /// With a closure: a plain `optimizer.step(closure)` when disabled; an error when enabled,
  /// as in torch (the closure would recompute unscaled gradients).
  StepResult step(torch::optim::Optimizer& optimizer,
                  torch::optim::Optimizer::LossClosure closure) {
    if (options_.enabled) {
      throw Error(
          "loom::amp::GradScaler::step: Closure use is not currently supported if "
          "GradScaler is enabled.");
    }
    optimizer.step(std::move(closure));
    return true;
  }

  /// Updates the scale from every inf check since the last update (all optimizers together):
  /// x backoff_factor if any found inf/nan, x growth_factor after growth_interval clean
  /// updates in a row (only if the result stays finite). Then every optimizer is `ready`.
  void update();

  /// Sets the scale to `new_scale` (the tracker is kept) and sends every optimizer back to
  /// `ready`. Like torch, it needs the scale tensor: call scale() first.
  void update(double new_scale) {
    if (!options_.enabled) return;
    require_scale("update");
    scale_.fill_(new_scale);
    per_optimizer_.clear();
  }

  /// The current scale: init_scale before the first scale() (no tensor, no sync), then a
  /// host read of the scale tensor; 1.0 when disabled.
  double get_scale() const {
    if (!options_.enabled) return 1.0;
    return scale_.defined() ? static_cast<double>(scale_.item<float>()) : options_.init_scale;
  }

  /// The number of clean updates in a row since the scale last changed; 0 when disabled.
  int64_t get_growth_tracker() const {
    if (!options_.enabled) return 0;
    return growth_tracker_.defined() ? static_cast<int64_t>(growth_tracker_.item<int32_t>())
                                     : init_growth_tracker_;
  }

  /// Whether the scale tensor exists, i.e. scale() has run on an enabled scaler.
  bool has_scale_tensor() const { return scale_.defined(); }

  /// The device of the scale tensor, once it exists.
  std::optional<c10::Device> scale_device() const {
    if (!scale_.defined()) return std::nullopt;
    return scale_.device();
  }

  /// Whether scaling is on.
  bool is_enabled() const { return options_.enabled; }

  /// Where `optimizer` is in this iteration; `ready` for an optimizer the scaler never saw.
  Stage stage(const torch::optim::Optimizer& optimizer) const {
    for (const auto& entry : per_optimizer_) {
      if (entry.first == &optimizer) return entry.second.stage;
    }
    return Stage::Ready;
  }

  /// The options in force: the constructor's, with the values of the last load_state_dict.
  const GradScalerOptions& options() const { return options_; }

  /// The checkpointable state, as torch's: `scale` (double), `growth_factor` (double),
  /// `backoff_factor` (double), `growth_interval` (int64), `_growth_tracker` (int64);
  /// `{}` when disabled. Take it after update() to checkpoint an iteration's end.
  StateDict state_dict() const;

  /// Restores a state_dict(); before the first scale() the values become the initial ones,
  /// afterwards they fill the live tensors. A no-op when disabled. Throws loom::Error on an
  /// empty state, a missing or unknown key, a wrong type or options that break the rules.
  void load_state_dict(const StateDict& state);

 private:
  struct OptimizerState {
    Stage stage = Stage::Ready;
    std::vector<std::pair<c10::Device, at::Tensor>> found_inf;  // per device: () f32, 0 or >0
  };

  static void validate(const GradScalerOptions& o, const char* where);

  static at::Tensor clone(const at::Tensor& t) { return t.defined() ? t.clone() : t; }

  // torch's fused branch of GradScaler.step: _check_inf_per_device (inv_scale 1: the
  // gradients are only checked), found_inf summed on the scale's device, the scale handed to
  // the optimizer unless unscale_ already ran; no host sync anywhere.
  StepResult step_fused(torch::optim::Optimizer& optimizer, const optim::OptimizerInfo& info);

  void lazy_init(const c10::Device& device);

  void require_scale(const char* where) const;

  OptimizerState& state_of(const torch::optim::Optimizer& optimizer) {
    for (auto& entry : per_optimizer_) {
      if (entry.first == &optimizer) return entry.second;
    }
    per_optimizer_.emplace_back(&optimizer, OptimizerState{});
    return per_optimizer_.back().second;
  }

  // Checks and unscales every defined gradient, one ATen call per (device, dtype) group, and
  // returns a fresh found_inf per device. Throws before touching any gradient.
  std::vector<std::pair<c10::Device, at::Tensor>> unscale_grads(torch::optim::Optimizer& optimizer,
                                                                const at::Tensor& inv_scale);

  GradScalerOptions options_;
  int64_t init_growth_tracker_ = 0;
  at::Tensor scale_;           // () f32, on the first scaled tensor's device
  at::Tensor growth_tracker_;  // () i32, same device
  at::Tensor one_;             // () f32 1.0, same device: the fused step's check-only inv_scale
  std::vector<std::pair<const torch::optim::Optimizer*, OptimizerState>> per_optimizer_;
};

/// A marker base for optimizers that unscale gradients inside their own step, kept for code
/// written before loom's optimizer table: the table's way is optimizer_traits<O>::amp =
/// optim::AmpSupport::SelfUnscaling. loom refuses to clip their gradients under 16-mixed: it
/// would have to unscale them first, and the optimizer would then unscale them a second time.
struct SelfUnscalingOptimizer {
  virtual ~SelfUnscalingOptimizer() = default;
};

/// Whether `optimizer` unscales its gradients inside its own step: its row of loom's optimizer
/// table says AmpSupport::SelfUnscaling, or it derives from SelfUnscalingOptimizer.
bool unscales_itself(const torch::optim::Optimizer& optimizer);

/// Throws loom::Error when loom's optimizer table says `optimizer` cannot run under a
/// GradScaler (AmpSupport::Refused: LBFGS, whose closure recomputes unscaled gradients).
void refuse_unscalable(const torch::optim::Optimizer& optimizer);

}  // namespace loom::amp
