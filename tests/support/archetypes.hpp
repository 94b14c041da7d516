#pragma once
// Minimal policies written without the Defaults bases: PrecisionArchetype<-1> and
// DeviceArchetype<-1> provide exactly the concept's rows; PrecisionArchetype<k> (k >= 0)
// lacks row k, so each requirement is shown to be necessary.
#include <ranges>
#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <loom/guards.hpp>
#include <loom/precision/defaults.hpp>
#include <loom/state_dict.hpp>

namespace loom::testing {

enum PrecisionRow {
  p_name, p_forward_context, p_tensor_init_context, p_module_init_context, p_convert_module,
  p_convert_input, p_convert_output, p_pre_backward, p_backward, p_post_backward,
  p_optimizer_step, p_main_params, p_unscale_gradients, p_clip_gradients, p_state_dict, p_load_state_dict, p_teardown, p_rows
};

template <int Missing>
struct PrecisionArchetype {
  static constexpr std::string_view precision() requires(Missing != p_name) { return "arch"; }
  NullGuard forward_context(c10::DeviceType) requires(Missing != p_forward_context) { return {}; }
  NullGuard tensor_init_context() requires(Missing != p_tensor_init_context) { return {}; }
  NullGuard module_init_context() requires(Missing != p_module_init_context) { return {}; }
  void convert_module(torch::nn::Module&) requires(Missing != p_convert_module) {}
  at::Tensor convert_input(const at::Tensor& t) requires(Missing != p_convert_input) { return t; }
  at::Tensor convert_output(const at::Tensor& t) requires(Missing != p_convert_output) { return t; }
  at::Tensor pre_backward(const at::Tensor& t, torch::nn::Module&)
    requires(Missing != p_pre_backward)
  { return t; }
  void backward(const at::Tensor& t, torch::nn::Module&) requires(Missing != p_backward) {
    t.backward();
  }
  at::Tensor post_backward(const at::Tensor& t, torch::nn::Module&)
    requires(Missing != p_post_backward)
  { return t; }
  bool optimizer_step(torch::optim::Optimizer&) requires(Missing != p_optimizer_step) {
    return true;
  }
  std::vector<at::Tensor> main_params(torch::optim::Optimizer&) requires(Missing != p_main_params)
  { return {}; }
  void unscale_gradients(torch::optim::Optimizer&) requires(Missing != p_unscale_gradients) {}
  double clip_gradients(torch::optim::Optimizer&, double, precision::ClipAlgorithm, double)
    requires(Missing != p_clip_gradients)
  { return 0.0; }
  StateDict state_dict() const requires(Missing != p_state_dict) { return {}; }
  void load_state_dict(const StateDict&) requires(Missing != p_load_state_dict) {}
  void teardown() requires(Missing != p_teardown) {}
};

enum DeviceRow {
  d_device_type, d_name, d_ddp_backend, d_device, d_prepare, d_module_to_device,
  d_tensor_to_device, d_optimizer_to_device, d_dataloader_to_device, d_precision_context,
  d_state_dict, d_load_state_dict, d_rows
};

template <int Missing>
struct DeviceArchetype {
  static constexpr c10::DeviceType device_type() requires(Missing != d_device_type) {
    return c10::kCPU;
  }
  static constexpr std::string_view name() requires(Missing != d_name) { return "arch"; }
  static constexpr std::string_view ddp_backend() requires(Missing != d_ddp_backend) {
    return "gloo";
  }
  c10::Device device() const requires(Missing != d_device) { return c10::Device(c10::kCPU); }
  void prepare() requires(Missing != d_prepare) {}
  void module_to_device(torch::nn::Module&) requires(Missing != d_module_to_device) {}
  at::Tensor tensor_to_device(const at::Tensor& t) const requires(Missing != d_tensor_to_device) {
    return t;
  }
  torch::optim::Optimizer& optimizer_to_device(torch::optim::Optimizer& o)
    requires(Missing != d_optimizer_to_device)
  { return o; }
  template <class Source, class Fn>
  std::vector<at::Tensor> dataloader_to_device(Source&, Fn)
    requires(Missing != d_dataloader_to_device)
  { return {}; }
  template <class P>
  auto precision_context(P& p) const requires(Missing != d_precision_context) {
    return p.forward_context(c10::kCPU);
  }
  StateDict state_dict() const requires(Missing != d_state_dict) { return {}; }
  void load_state_dict(const StateDict&) requires(Missing != d_load_state_dict) {}
};

}  // namespace loom::testing
