#pragma once
// loom::StepResult and loom::GradNorm: whether an optimizer step was applied and the gradient
// norm before clipping, each read from the device only when asked; loom::Optimizers, the
// optimizers one step steps.
#include <functional>
#include <optional>
#include <span>

#include <ATen/core/Tensor.h>
#include <ATen/ops/scalar_tensor.h>

namespace torch::optim {
class Optimizer;
}

namespace loom {

/// One optimizer among several: what a list of optimizers holds (`{o1, o2}` makes them).
using OptimizerRef = std::reference_wrapper<torch::optim::Optimizer>;
/// Several optimizers stepped together (`rt.optimizer_step({o1, o2})`, a strategy's
/// optimizer_step): a view of references, in order.
using Optimizers = std::span<const OptimizerRef>;

/// What `optimizer_step` returns: whether the step was applied (false: skipped, e.g. because
/// 16-mixed found inf/nan gradients).
///
/// The answer is either known on the host, or still a flag on the device (16-mixed with a
/// loom::optim fused optimizer: the step ran without a host sync). Reading it, by applied() or
/// by a test such as `if (rt.optimizer_step(opt))`, then costs exactly one sync, once: the
/// result caches it. known() says whether reading is free; found_inf() hands over the flag
/// itself, for code that wants to keep the decision on the device.
class StepResult {
 public:
  /// A result known on the host.
  StepResult(bool applied = true) : applied_(applied) {}  // NOLINT: implicit, from a bool step
  /// A result decided on the device: applied iff `found_inf` (a one-element tensor) is 0.
  explicit StepResult(at::Tensor found_inf) : found_inf_(std::move(found_inf)) {}

  /// Whether the step was applied; the first call on a device-side result waits for the
  /// device and reads the flag (one sync), later calls return the cached answer.
  bool applied() const {
    if (!applied_) applied_ = found_inf_.item<float>() == 0.0f;
    return *applied_;
  }
  explicit operator bool() const { return applied(); }

  /// Whether applied() is known without reading the device.
  bool known() const noexcept { return applied_.has_value(); }

  /// The device-side flag (f32, nonzero when the step was skipped); undefined for a result
  /// known on the host.
  const at::Tensor& found_inf() const noexcept { return found_inf_; }

 private:
  at::Tensor found_inf_;
  mutable std::optional<bool> applied_;
};

/// What `clip_gradients` returns: the total norm of the gradients before clipping, as
/// Python's `clip_grad_norm_` returns it (a 0-dim tensor on the gradients' device, nan or inf
/// when a gradient is not finite), or a value known on the host (0: nothing was clipped).
///
/// Clipping computes the norm and scales the gradients on the device, so it needs no host
/// sync; value() reads the norm (one sync, once: the result caches it). tensor() hands the
/// norm over without reading it (to log it: loggers read tensors when they flush).
class GradNorm {
 public:
  /// A norm known on the host (0 when nothing was clipped).
  GradNorm(double value = 0.0) : value_(value) {}  // NOLINT: implicit, from a host norm
  /// A norm still on the device: a 0-dim floating tensor.
  explicit GradNorm(at::Tensor norm) : norm_(std::move(norm)) {}

  /// The norm; the first call on a device-side norm waits for the device and reads it.
  double value() const {
    if (!value_) value_ = norm_.item<double>();
    return *value_;
  }
  explicit operator double() const { return value(); }

  /// Whether value() is known without reading the device.
  bool known() const noexcept { return value_.has_value(); }

  /// The norm as a tensor: the device-side one, or a 0-dim f64 CPU tensor of a known value.
  at::Tensor tensor() const {
    return norm_.defined() ? norm_ : at::scalar_tensor(*value_, at::TensorOptions(at::kDouble));
  }

 private:
  at::Tensor norm_;
  mutable std::optional<double> value_;
};

}  // namespace loom
