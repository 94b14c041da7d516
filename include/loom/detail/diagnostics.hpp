#pragma once
// Runtime's per-row checks: one static_assert per requirement row, each naming the member
// a policy lacks. Message text is interface: tests/compile_fail matches it.
#include <concepts>

#include <loom/detail/requirements.hpp>

namespace loom::detail {

/// Stands in for a policy whose checks must not run (after a swapped-arguments error).
struct skip_checks {};

template <class P>
struct precision_diagnostics {
#define LOOM_PRECISION_ROW(ok, member)                                                      \
  static_assert(ok, "loom::Runtime<Device, Precision>: Precision does not model "           \
                    "PrecisionPolicy: it lacks " member " (docs/concepts/precision_policy.md)")
  LOOM_PRECISION_ROW(std::move_constructible<P>, "a move constructor");
  LOOM_PRECISION_ROW(precision_has_name<P>,
                     "`static constexpr std::string_view precision()`, its name such as \"32-true\"");
  LOOM_PRECISION_ROW(precision_has_forward_context<P>,
                     "`forward_context(c10::DeviceType)` returning a ScopeGuard");
  LOOM_PRECISION_ROW(precision_has_tensor_init_context<P>,
                     "`tensor_init_context()` returning a ScopeGuard");
  LOOM_PRECISION_ROW(precision_has_module_init_context<P>,
                     "`module_init_context()` returning a ScopeGuard");
  LOOM_PRECISION_ROW(precision_has_convert_module<P>,
                     "`void convert_module(torch::nn::Module&)`");
  LOOM_PRECISION_ROW(precision_has_convert_input<P>,
                     "`torch::Tensor convert_input(const torch::Tensor&)`");
  LOOM_PRECISION_ROW(precision_has_convert_output<P>,
                     "`torch::Tensor convert_output(const torch::Tensor&)`");
  LOOM_PRECISION_ROW(precision_has_pre_backward<P>,
                     "`torch::Tensor pre_backward(const torch::Tensor&, torch::nn::Module&)`");
  LOOM_PRECISION_ROW(precision_has_backward<P>,
                     "`void backward(const torch::Tensor&, torch::nn::Module&)`");
  LOOM_PRECISION_ROW(precision_has_post_backward<P>,
                     "`torch::Tensor post_backward(const torch::Tensor&, torch::nn::Module&)`");
  LOOM_PRECISION_ROW(precision_has_optimizer_step<P>,
                     "`bool optimizer_step(torch::optim::Optimizer&)`");
  LOOM_PRECISION_ROW(precision_has_main_params<P>,
                     "`std::vector<torch::Tensor> main_params(torch::optim::Optimizer&)`");
  LOOM_PRECISION_ROW(precision_has_unscale_gradients<P>,
                     "`void unscale_gradients(torch::optim::Optimizer&)`");
  LOOM_PRECISION_ROW(precision_has_clip_gradients<P>,
                     "`double clip_gradients(torch::optim::Optimizer&, double, "
                     "loom::precision::ClipAlgorithm, double)`");
  LOOM_PRECISION_ROW(precision_has_state_dict<P>, "`loom::StateDict state_dict() const`");
  LOOM_PRECISION_ROW(precision_has_load_state_dict<P>,
                     "`void load_state_dict(const loom::StateDict&)`");
  LOOM_PRECISION_ROW(precision_has_teardown<P>, "`void teardown()`");
#undef LOOM_PRECISION_ROW
  static constexpr bool value = true;
};
template <>
struct precision_diagnostics<skip_checks> {
  static constexpr bool value = true;
};

template <class D>
struct device_diagnostics {
#define LOOM_DEVICE_ROW(ok, member)                                                    \
  static_assert(ok, "loom::Runtime<Device, Precision>: Device does not model "         \
                    "DevicePolicy: it lacks " member " (docs/concepts/device_policy.md)")
  LOOM_DEVICE_ROW(std::move_constructible<D>, "a move constructor");
  LOOM_DEVICE_ROW(device_has_device_type<D>, "`static constexpr c10::DeviceType device_type()`");
  LOOM_DEVICE_ROW(device_has_name<D>, "`static constexpr std::string_view name()`");
  LOOM_DEVICE_ROW(device_has_ddp_backend<D>,
                  "`static constexpr std::string_view ddp_backend()` naming \"gloo\", \"nccl\" "
                  "or \"mpi\"");
  LOOM_DEVICE_ROW(device_has_device<D>, "`torch::Device device() const`");
  LOOM_DEVICE_ROW(device_has_prepare<D>, "`void prepare()`");
  LOOM_DEVICE_ROW(device_has_module_to_device<D>, "`void module_to_device(torch::nn::Module&)`");
  LOOM_DEVICE_ROW(device_has_tensor_to_device<D>,
                  "`torch::Tensor tensor_to_device(const torch::Tensor&) const`");
  LOOM_DEVICE_ROW(device_has_optimizer_to_device<D>,
                  "`torch::optim::Optimizer& optimizer_to_device(torch::optim::Optimizer&)`");
  LOOM_DEVICE_ROW(device_has_dataloader_to_device<D>,
                  "`dataloader_to_device(source, prefetch_fn)` returning an input range");
  LOOM_DEVICE_ROW(device_has_precision_context<D>,
                  "`precision_context(precision) const` returning a ScopeGuard");
  LOOM_DEVICE_ROW(device_has_state_dict<D>, "`loom::StateDict state_dict() const`");
  LOOM_DEVICE_ROW(device_has_load_state_dict<D>, "`void load_state_dict(const loom::StateDict&)`");
#undef LOOM_DEVICE_ROW
  static constexpr bool value = true;
};
template <>
struct device_diagnostics<skip_checks> {
  static constexpr bool value = true;
};

}  // namespace loom::detail
