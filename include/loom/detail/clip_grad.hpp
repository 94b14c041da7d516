#pragma once
// Gradient clipping by total norm on the device, Python's `clip_grad_norm_(foreach=True)`
// arithmetic without a host sync (src/detail/clip_grad.cpp): the precisions' clip and
// loom::Zero's sharded one.
#include <vector>

#include <ATen/core/Tensor.h>

namespace loom::detail {

/// The defined gradients of `params`, in order.
std::vector<at::Tensor> grads_of(const std::vector<at::Tensor>& params);

/// Python's `_get_total_norm(grads, norm_type, foreach=True)`: one `_foreach_norm` per
/// (device, dtype) group (in the order of ATen's grouping, which Python uses), then the norm
/// of the stacked norms, on the first gradient's device; a 0-dim tensor, never read on the
/// host. No gradients: a CPU f32 zero.
at::Tensor total_norm(const std::vector<at::Tensor>& grads, double norm_type);

/// Python's `_clip_grads_with_norm_(grads, max_norm, total, foreach=True)`: every gradient
/// multiplied by min(max_norm / (total + 1e-6), 1), computed on the device.
void clip_grads_with_norm(const std::vector<at::Tensor>& grads, double max_norm,
                          const at::Tensor& total);

/// Python's `clip_grad_norm_(params, max_norm, norm_type, foreach=True)` without a host sync:
/// returns the total norm before clipping as a 0-dim tensor (src/detail/clip_grad.cpp).
at::Tensor clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm, double norm_type);

}  // namespace loom::detail
