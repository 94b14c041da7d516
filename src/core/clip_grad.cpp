// Gradient clipping by total norm, Python's `clip_grad_norm_(foreach=True)` arithmetic, with
// no host sync: the norm stays a tensor and the gradients are scaled on their device.
#include <optional>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/native/ForeachUtils.h>

#include <loom/detail/clip_grad.hpp>

namespace loom::detail {

namespace {

/// `tensors` split by (device, dtype) by ATen's own grouping, the one Python's
/// `_group_tensors_by_device_and_dtype` calls: its groups come in that map's order, not in
/// first-seen order, and the norms are stacked in it (with several dtypes another order can
/// round the total norm differently). Each group keeps the given order.
std::vector<std::vector<at::Tensor>> by_device_and_dtype(const std::vector<at::Tensor>& tensors) {
  const std::vector<std::optional<at::Tensor>> list(tensors.begin(), tensors.end());
  std::vector<std::vector<at::Tensor>> groups;
  for (const auto& [key, value] :
       at::native::_group_tensors_by_first_tensors_device_and_dtype({list}, false)) {
    auto& group = groups.emplace_back();
    group.reserve(value.first[0].size());
    for (const auto& t : value.first[0]) group.push_back(*t);
  }
  return groups;
}

}  // namespace

std::vector<at::Tensor> grads_of(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> grads;
  grads.reserve(params.size());
  for (const auto& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  return grads;
}

namespace {

using Groups = std::vector<std::vector<at::Tensor>>;

at::Tensor total_norm_of(const Groups& groups, const c10::Device& first_device, double norm_type) {
  std::vector<at::Tensor> norms;
  for (const auto& group : groups) {
    for (auto& n : at::_foreach_norm(group, norm_type)) norms.push_back(n.to(first_device));
  }
  return at::linalg_vector_norm(at::stack(norms), norm_type);
}

void clip_groups_with_norm(const Groups& groups, double max_norm, const at::Tensor& total) {
  // Python's `max_norm / (total_norm + 1e-6)` is `(total_norm + 1e-6).reciprocal() * max_norm`
  // (Tensor.__rtruediv__); then clamped to 1, so gradients are never scaled up.
  const at::Tensor coef = at::clamp_max((total + 1e-6).reciprocal() * max_norm, 1.0);
  for (const auto& group : groups) {
    at::_foreach_mul_(group, coef.to(group.front().device()));
  }
}

}  // namespace

at::Tensor total_norm(const std::vector<at::Tensor>& grads, double norm_type) {
  if (grads.empty()) return at::zeros({}, at::kFloat);
  return total_norm_of(by_device_and_dtype(grads), grads.front().device(), norm_type);
}

void clip_grads_with_norm(const std::vector<at::Tensor>& grads, double max_norm,
                          const at::Tensor& total) {
  if (grads.empty()) return;
  at::NoGradGuard no_grad;
  clip_groups_with_norm(by_device_and_dtype(grads), max_norm, total);
}

at::Tensor clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm,
                          double norm_type) {
  at::NoGradGuard no_grad;
  const auto grads = grads_of(params);
  if (grads.empty()) return at::zeros({}, at::kFloat);
  // One grouping for the norm and the scaling (each step's clip: one ATen map, not two).
  const Groups groups = by_device_and_dtype(grads);
  at::Tensor total = total_norm_of(groups, grads.front().device(), norm_type);
  clip_groups_with_norm(groups, max_norm, total);
  return total;
}

}  // namespace loom::detail
