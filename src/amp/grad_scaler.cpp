// loom::amp::GradScaler (amp/grad_scaler.hpp): compiled once here rather than in every
// translation unit that trains in 16-mixed.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/_amp_update_scale.h>
#include <ATen/ops/full.h>

#include <loom/amp/grad_scaler.hpp>
#include <loom/detail/tensor_groups.hpp>
#include <loom/error.hpp>
#include <loom/optim/optimizer_table.hpp>
#include <loom/state_reader.hpp>

namespace loom::amp {

std::vector<at::Tensor> GradScaler::scale(const std::vector<at::Tensor>& outputs) {
  if (!options_.enabled) return outputs;
  std::optional<loom::detail::DeviceReplicas> per_device;  // torch's _MultiDeviceReplicator
  std::vector<at::Tensor> scaled;
  scaled.reserve(outputs.size());
  for (const auto& t : outputs) {
    if (!t.defined()) throw Error("loom::amp::GradScaler::scale: a tensor is undefined");
    if (!scale_.defined()) lazy_init(t.device());
    if (!per_device) per_device.emplace(scale_);
    scaled.push_back(t.mul(per_device->get(t.device())));
  }
  return scaled;
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) return;
  require_scale("unscale_");
  auto& state = state_of(optimizer);
  if (state.stage == Stage::Unscaled) {
    throw Error(
        "loom::amp::GradScaler::unscale_: unscale_() has already been called on this "
        "optimizer since the last update().");
  }
  if (state.stage == Stage::Stepped) {
    throw Error("loom::amp::GradScaler::unscale_: unscale_() is being called after step().");
  }
  // The reciprocal in f64, as torch does: f32 division can be imprecise under some flags.
  auto inv_scale = scale_.to(c10::kDouble).reciprocal().to(c10::kFloat);  // () f32
  state.found_inf = unscale_grads(optimizer, inv_scale);
  state.stage = Stage::Unscaled;
}

StepResult GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  require_scale("step");
  if (state_of(optimizer).stage == Stage::Stepped) {
    throw Error(
        "loom::amp::GradScaler::step: step() has already been called since the last "
        "update().");
  }
  const auto* info = optim::find_optimizer(optimizer);
  if (info != nullptr && info->amp == optim::AmpSupport::Fused) {
    return step_fused(optimizer, *info);
  }
  if (state_of(optimizer).stage == Stage::Ready) unscale_(optimizer);
  auto& state = state_of(optimizer);  // unscale_ may have added entries; look up again
  if (state.found_inf.empty()) {
    throw Error("loom::amp::GradScaler::step: No inf checks were recorded for this optimizer.");
  }
  double found = 0.0;
  for (const auto& entry : state.found_inf) found += entry.second.item<float>();  // host sync
  const bool applied = found == 0.0;
  if (applied) optimizer.step();
  state_of(optimizer).stage = Stage::Stepped;
  return applied;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  require_scale("update");
  std::vector<at::Tensor> found_infs;
  for (const auto& entry : per_optimizer_) {
    for (const auto& found : entry.second.found_inf) {
      found_infs.push_back(found.second.to(scale_.device(), c10::kFloat, /*non_blocking=*/true));
    }
  }
  if (found_infs.empty()) {
    throw Error("loom::amp::GradScaler::update: No inf checks were recorded prior to update.");
  }
  at::Tensor combined = found_infs.front();  // () f32; only read when there is one
  if (found_infs.size() > 1) {
    combined = combined.clone();
    for (std::size_t i = 1; i < found_infs.size(); ++i) combined.add_(found_infs[i]);
  }
  at::_amp_update_scale_(scale_, growth_tracker_, combined, options_.growth_factor,
                         options_.backoff_factor, options_.growth_interval);
  per_optimizer_.clear();
}

StateDict GradScaler::state_dict() const {
  if (!options_.enabled) return {};
  return {{"scale", c10::IValue(get_scale())},
          {"growth_factor", c10::IValue(options_.growth_factor)},
          {"backoff_factor", c10::IValue(options_.backoff_factor)},
          {"growth_interval", c10::IValue(options_.growth_interval)},
          {"_growth_tracker", c10::IValue(get_growth_tracker())}};
}

void GradScaler::load_state_dict(const StateDict& state) {
  if (!options_.enabled) return;
  if (state.empty()) {
    throw Error(
        "loom::amp::GradScaler::load_state_dict: The source state dict is empty, "
        "possibly because it was saved from a disabled instance of GradScaler.");
  }
  state::Reader r("loom::amp::GradScaler::load_state_dict", state);
  GradScalerOptions loaded = options_;
  loaded.init_scale = r.number("scale");
  loaded.growth_factor = r.number("growth_factor");
  loaded.backoff_factor = r.number("backoff_factor");
  loaded.growth_interval = r.integer("growth_interval");
  const int64_t tracker = r.integer("_growth_tracker");
  r.finish();
  validate(loaded, "load_state_dict");
  options_ = loaded;
  init_growth_tracker_ = tracker;
  if (scale_.defined()) scale_.fill_(options_.init_scale);
  if (growth_tracker_.defined()) growth_tracker_.fill_(tracker);
}

void GradScaler::validate(const GradScalerOptions& o, const char* where) {
  const std::string prefix = std::string("loom::amp::GradScaler::") + where + ": ";
  if (!(o.growth_factor > 1.0)) {
    throw Error(prefix + "growth_factor must be > 1, got " + std::to_string(o.growth_factor));
  }
  if (!(o.backoff_factor > 0.0 && o.backoff_factor < 1.0)) {
    throw Error(prefix + "backoff_factor must be in (0, 1), got " +
                std::to_string(o.backoff_factor));
  }
  if (o.growth_interval < 1) {
    throw Error(prefix + "growth_interval must be >= 1, got " + std::to_string(o.growth_interval));
  }
}

StepResult GradScaler::step_fused(torch::optim::Optimizer& optimizer,
                                  const optim::OptimizerInfo& info) {
  std::optional<at::Tensor> grad_scale;
  if (state_of(optimizer).stage == Stage::Ready) {
    auto found = unscale_grads(optimizer, one_);  // inv_scale 1: check only
    state_of(optimizer).found_inf = std::move(found);
    grad_scale = scale_;
  }
  auto& state = state_of(optimizer);
  if (state.found_inf.empty()) {
    throw Error("loom::amp::GradScaler::step: No inf checks were recorded for this optimizer.");
  }
  at::Tensor found = state.found_inf.front().second.to(scale_.device(), /*non_blocking=*/true);
  for (std::size_t i = 1; i < state.found_inf.size(); ++i) {
    if (i == 1) found = found.clone();
    found.add_(state.found_inf[i].second.to(scale_.device(), /*non_blocking=*/true));
  }
  info.set_amp(optimizer, grad_scale, found);
  optimizer.step();
  state.stage = Stage::Stepped;
  return StepResult(found);
}

void GradScaler::lazy_init(const c10::Device& device) {
  scale_ = at::full({}, options_.init_scale,
                    at::TensorOptions().dtype(c10::kFloat).device(device));  // () f32
  growth_tracker_ = at::full({}, init_growth_tracker_,
                             at::TensorOptions().dtype(c10::kInt).device(device));  // () i32
  one_ = at::full({}, 1.0, at::TensorOptions().dtype(c10::kFloat).device(device));  // () f32
}

void GradScaler::require_scale(const char* where) const {
  if (!scale_.defined()) {
    throw Error(std::string("loom::amp::GradScaler::") + where + ": Attempted " + where +
                " before any scale(). This may indicate your script did not use "
                "scaler.scale(loss or outputs) earlier in the iteration.");
  }
}

std::vector<std::pair<c10::Device, at::Tensor>> GradScaler::unscale_grads(
    torch::optim::Optimizer& optimizer, const at::Tensor& inv_scale) {
  std::vector<at::Tensor> grads;  // share the gradients' storage: unscaled in place
  for (auto& group : optimizer.param_groups()) {
    for (auto& param : group.params()) {
      const at::Tensor& grad = param.grad();
      if (!grad.defined()) continue;
      if (grad.scalar_type() == c10::kHalf) {
        throw Error("loom::amp::GradScaler::unscale_: Attempting to unscale FP16 gradients.");
      }
      if (grad.is_sparse()) {
        throw Error("loom::amp::GradScaler::unscale_: sparse gradients are not supported");
      }
      grads.push_back(grad);
    }
  }
  at::NoGradGuard no_grad;
  // One call per (device, dtype) group. A group only sets its device's flag (to 1) and
  // unscales its own gradients, so the groups' order changes no value; the flags, 0 or 1, are
  // summed exactly whatever their order.
  loom::detail::DeviceReplicas inv_scales(inv_scale);
  loom::detail::DeviceReplicas found_inf;
  for (const auto& g : loom::detail::group_by_device_and_dtype({grads})) {
    const auto& inv = inv_scales.get(g.device);  // () f32
    auto& flag = found_inf.get(g.device, [&] {   // () f32: 0 until an inf or nan is found
      return at::full({}, 0.0, at::TensorOptions().dtype(c10::kFloat).device(g.device));
    });
    at::_amp_foreach_non_finite_check_and_unscale_(g.lists[0], flag, inv);
  }
  return std::move(found_inf).release();
}

bool unscales_itself(const torch::optim::Optimizer& optimizer) {
  return optim::amp_support(optimizer) == optim::AmpSupport::SelfUnscaling ||
         dynamic_cast<const SelfUnscalingOptimizer*>(&optimizer) != nullptr;
}

void refuse_unscalable(const torch::optim::Optimizer& optimizer) {
  const auto* info = optim::find_optimizer(optimizer);
  if (info != nullptr && info->amp == optim::AmpSupport::Refused) {
    throw Error("loom: AMP and the " + std::string(info->name) + " optimizer are not compatible.");
  }
}

}  // namespace loom::amp
