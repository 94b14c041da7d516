#pragma once
// loom::StepResult: whether an optimizer step was applied, read from the device only when
// asked.
#include <functional>
#include <optional>
#include <span>

#include <ATen/core/Tensor.h>

namespace torch::optim {
class Optimizer;
}

namespace loom {

/// Several optimizers stepped together (`rt.optimizer_step({o1, o2})`): references, in order.
using Optimizers = std::span<const std::reference_wrapper<torch::optim::Optimizer>>;

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

}  // namespace loom
