#pragma once
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/utils/clip_grad.h>  // clip_grad_value_
#include <torch/optim/optimizer.h>

#include <loom/concepts/precision_policy.hpp>
#include <loom/detail/clip_grad.hpp>
#include <loom/step_result.hpp>

// The bodies of precision::Defaults<Self> that do not depend on Self, as plain inline
// functions: compiled once per translation unit instead of once per precision policy.
namespace loom::detail {

/// Every parameter of every group of `optimizer`, in order.
inline std::vector<at::Tensor> all_params(torch::optim::Optimizer& optimizer) {
  std::vector<at::Tensor> params;
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) params.push_back(p);
  }
  return params;
}

/// Clips the gradients of `params`; returns the total norm (on the device) for
/// ClipAlgorithm::Norm, else 0.
inline GradNorm clip_params(const std::vector<at::Tensor>& params, double value,
                            precision::ClipAlgorithm algorithm, double norm_type) {
  if (algorithm == precision::ClipAlgorithm::Value) {
    torch::nn::utils::clip_grad_value_(params, value);
    return GradNorm(0.0);
  }
  return GradNorm(clip_grad_norm(params, value, norm_type));
}

}  // namespace loom::detail
