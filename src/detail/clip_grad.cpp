// Gradient clipping by total norm, Python's `clip_grad_norm_(foreach=True)` arithmetic, with
// no host sync: the norm stays a tensor and the gradients are scaled on their device.
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <loom/detail/clip_grad.hpp>
#include <loom/detail/tensor_groups.hpp>

namespace loom::detail {

std::vector<at::Tensor> grads_of(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> grads;
  grads.reserve(params.size());
  for (const auto& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  return grads;
}

namespace {

/// The gradients split by (device, dtype) by ATen's own grouping, the one Python's
/// `_group_tensors_by_device_and_dtype` calls: its groups come in that map's order, not in
/// first-seen order, and the norms are stacked in it (with several dtypes another order can
/// round the total norm differently). Each group keeps the given order.
using Groups = std::vector<TensorGroup>;

at::Tensor total_norm_of(const Groups& groups, const c10::Device& first_device, double norm_type) {
  std::vector<at::Tensor> norms;
  for (const auto& group : groups) {
    for (auto& n : at::_foreach_norm(group.lists[0], norm_type)) {
      norms.push_back(n.to(first_device));
    }
  }
  return at::linalg_vector_norm(at::stack(norms), norm_type);
}

void clip_groups_with_norm(const Groups& groups, double max_norm, const at::Tensor& total) {
  // Python's `max_norm / (total_norm + 1e-6)` is `(total_norm + 1e-6).reciprocal() * max_norm`
  // (Tensor.__rtruediv__); then clamped to 1, so gradients are never scaled up.
  const at::Tensor coef = at::clamp_max((total + 1e-6).reciprocal() * max_norm, 1.0);
  for (const auto& group : groups) at::_foreach_mul_(group.lists[0], coef.to(group.device));
}

}  // namespace

at::Tensor total_norm(const std::vector<at::Tensor>& grads, double norm_type) {
  if (grads.empty()) return at::zeros({}, at::kFloat);
  return total_norm_of(group_by_device_and_dtype({grads}), grads.front().device(), norm_type);
}

void clip_grads_with_norm(const std::vector<at::Tensor>& grads, double max_norm,
                          const at::Tensor& total) {
  if (grads.empty()) return;
  at::NoGradGuard no_grad;
  clip_groups_with_norm(group_by_device_and_dtype({grads}), max_norm, total);
}

at::Tensor clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm,
                          double norm_type) {
  at::NoGradGuard no_grad;
  const auto grads = grads_of(params);
  if (grads.empty()) return at::zeros({}, at::kFloat);
  // One grouping for the norm and the scaling (each step's clip: one ATen map, not two).
  const Groups groups = group_by_device_and_dtype({grads});
  at::Tensor total = total_norm_of(groups, grads.front().device(), norm_type);
  clip_groups_with_norm(groups, max_norm, total);
  return total;
}

}  // namespace loom::detail
