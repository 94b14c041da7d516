// The scaled half of a 16-mixed step written by hand in plain LibTorch, the baseline that the
// overhead and compile-time benchmarks compare loom against: backward on the scaled loss,
// unscale and check the gradients in one ATen call, skip the step on inf/nan, update the scale.
#pragma once
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/_amp_update_scale.h>
#include <ATen/ops/zeros.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/utils.h>

namespace hand {

/// The loss scale, by hand: two 0-dim tensors on the loss's device.
struct Scale {
  at::Tensor scale;   // () f32
  at::Tensor growth;  // () i32
};

/// backward(loss * scale), unscale, opt.step() unless a gradient is inf/nan, update the scale
/// (torch.amp.GradScaler's defaults: x2 after 2000 clean steps, x0.5 on inf).
inline void scaled_backward_and_step(const at::Tensor& loss, torch::nn::Module& model,
                                     torch::optim::Optimizer& opt, Scale& s) {
  (loss * s.scale).backward();
  auto inv = s.scale.to(at::kDouble).reciprocal().to(at::kFloat);  // () f32
  auto found_inf = at::zeros({}, s.scale.options());               // () f32
  std::vector<at::Tensor> grads;
  for (auto& p : model.parameters()) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  {
    at::NoGradGuard no_grad;
    at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv);
  }
  if (found_inf.item<float>() == 0.0f) opt.step();
  at::_amp_update_scale_(s.scale, s.growth, found_inf, 2.0, 0.5, 2000);
}

}  // namespace hand
