#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>

#include <loom/detail/fp16_cpu.hpp>
#include <loom/guards.hpp>
#include <loom/precision/cast.hpp>
#include <loom/precision/defaults.hpp>

namespace loom::precision {

/// The hooks of a "-true" precision: weights, inputs and activations all in `Dtype`.
///
/// convert_module casts floating parameters and buffers; the three contexts make `Dtype` the
/// default dtype and restore the previous one on exit; convert_input casts floating leaves
/// to `Dtype`; convert_output casts them back to the default dtype, read after the forward
/// context has closed. No loss scaling, no fp32 master copy: optimizer state is in `Dtype`.
/// Self is the final policy (CRTP, passed on to Defaults).
template <class Self, c10::ScalarType Dtype>
struct Uniform : Defaults<Self> {
  /// The dtype weights and activations use.
  static constexpr c10::ScalarType dtype() { return Dtype; }

  DefaultDtypeGuard<Dtype> forward_context(c10::DeviceType device) const {
    if constexpr (Dtype == c10::kHalf) detail::warn_if_fp16_on_cpu(Self::precision(), device);
    return {};
  }
  DefaultDtypeGuard<Dtype> tensor_init_context() const { return {}; }
  DefaultDtypeGuard<Dtype> module_init_context() const { return {}; }

  void convert_module(torch::nn::Module& module) const { cast_module(module, Dtype); }
  at::Tensor convert_input(const at::Tensor& t) const { return cast_floating(t, Dtype); }
  at::Tensor convert_output(const at::Tensor& t) const { return cast_to_default(t); }
};

}  // namespace loom::precision
