#pragma once
// The casts every non-fp32 precision shares: floating tensors only, in place for modules.
#include <ATen/core/Tensor.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>
#include <torch/utils.h>

namespace loom::precision {

/// `t` cast to `dtype` if it is a floating-point tensor; otherwise `t` itself (integer, bool
/// and complex tensors are never cast). Differentiable; never changes the device.
inline at::Tensor cast_floating(const at::Tensor& t, c10::ScalarType dtype) {
  return t.is_floating_point() && t.scalar_type() != dtype ? t.to(dtype) : t;
}

/// `t` cast back to LibTorch's default dtype, read at call time, if it is floating-point.
inline at::Tensor cast_to_default(const at::Tensor& t) {
  return cast_floating(t, c10::get_default_dtype_as_scalartype());
}

/// Casts a module's floating parameters and buffers to `dtype` in place (set_data keeps each
/// TensorImpl, so optimizers built earlier stay attached). Unlike Module::to(dtype), integer
/// buffers such as BatchNorm's num_batches_tracked and complex buffers are left alone.
inline void cast_module(torch::nn::Module& module, c10::ScalarType dtype) {
  torch::NoGradGuard no_grad;
  for (auto& p : module.parameters(/*recurse=*/true)) {
    if (p.is_floating_point() && p.scalar_type() != dtype) p.set_data(p.to(dtype));
  }
  for (auto& b : module.buffers(/*recurse=*/true)) {
    if (b.defined() && b.is_floating_point() && b.scalar_type() != dtype) b.set_data(b.to(dtype));
  }
}

}  // namespace loom::precision
