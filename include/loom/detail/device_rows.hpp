#pragma once
// The rows of loom::DevicePolicy (concepts/device_policy.hpp): one concept per row, the list
// that makes the concept and its diagnostics, and the check Runtime runs on its Device argument.
#include <concepts>
#include <ranges>
#include <string_view>
#include <type_traits>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>

#include <loom/concepts/scope_guard.hpp>
#include <loom/detail/checkpointable_rows.hpp>
#include <loom/detail/meta.hpp>
#include <loom/detail/rows.hpp>
#include <loom/guards.hpp>

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace loom::detail {

/// The least a precision policy must offer for a device's precision_context to use it.
struct precision_archetype {
  NullGuard forward_context(c10::DeviceType) const { return {}; }
};
/// The least a prefetch function must be: a batch in, the batch out.
struct prefetch_archetype {
  template <class B>
  B operator()(B b) const {
    return b;
  }
};

template <class D>
concept device_has_device_type = requires {
  { D::device_type() } -> std::same_as<c10::DeviceType>;
  typename constant<D::device_type()>;
};
template <class D>
concept device_has_name = requires {
  { D::name() } -> std::same_as<std::string_view>;
  typename constant<D::name().size()>;
};
template <class D>
concept device_has_ddp_backend = requires {
  { D::ddp_backend() } -> std::same_as<std::string_view>;
  typename constant<D::ddp_backend().size()>;
}
&&is_ddp_backend(D::ddp_backend());
template <class D>
concept device_has_device = requires(const D& d) {
  { d.device() } -> std::same_as<c10::Device>;
};
template <class D>
concept device_has_prepare = requires(D& d) {
  { d.prepare() } -> std::same_as<void>;
};
template <class D>
concept device_has_module_to_device = requires(D& d, torch::nn::Module& m) {
  { d.module_to_device(m) } -> std::same_as<void>;
};
template <class D>
concept device_has_tensor_to_device = requires(const D& d, const at::Tensor& t) {
  { d.tensor_to_device(t) } -> std::same_as<at::Tensor>;
};
template <class D>
concept device_has_optimizer_to_device = requires(D& d, torch::optim::Optimizer& o) {
  { d.optimizer_to_device(o) } -> std::same_as<torch::optim::Optimizer&>;
};
template <class D>
concept device_has_dataloader_to_device = requires(D& d, std::vector<at::Tensor>& source,
                                                   prefetch_archetype fn) {
  { d.dataloader_to_device(source, fn) } -> std::ranges::input_range;
};
template <class D>
concept device_has_precision_context = requires(const D& d, precision_archetype& p) {
  { d.precision_context(p) } -> ScopeGuard;
};

// clang-format off
#define LOOM_DETAIL_DEVICE_ROWS(X, ...)                                                         \
  X(__VA_ARGS__, movable, "a move constructor")                                                 \
  X(__VA_ARGS__, device_has_device_type, "`static constexpr c10::DeviceType device_type()`")    \
  X(__VA_ARGS__, device_has_name, "`static constexpr std::string_view name()`")                 \
  X(__VA_ARGS__, device_has_ddp_backend,                                                        \
    "`static constexpr std::string_view ddp_backend()` naming \"gloo\", \"nccl\" or \"mpi\"")   \
  X(__VA_ARGS__, device_has_device, "`torch::Device device() const`")                           \
  X(__VA_ARGS__, device_has_prepare, "`void prepare()`")                                        \
  X(__VA_ARGS__, device_has_module_to_device, "`void module_to_device(torch::nn::Module&)`")    \
  X(__VA_ARGS__, device_has_tensor_to_device,                                                   \
    "`torch::Tensor tensor_to_device(const torch::Tensor&) const`")                             \
  X(__VA_ARGS__, device_has_optimizer_to_device,                                                \
    "`torch::optim::Optimizer& optimizer_to_device(torch::optim::Optimizer&)`")                 \
  X(__VA_ARGS__, device_has_dataloader_to_device,                                               \
    "`dataloader_to_device(source, prefetch_fn)` returning an input range")                     \
  X(__VA_ARGS__, device_has_precision_context,                                                  \
    "`precision_context(precision) const` returning a ScopeGuard")

#define LOOM_DETAIL_DEVICE_LACKS \
  "loom::Runtime: the Device argument does not model DevicePolicy: it lacks "
#define LOOM_DETAIL_DEVICE_PAGE " (docs/concepts/device_policy.md)"
// clang-format on

/// One static_assert per DevicePolicy row (Checkpointable's included), each naming the
/// member a policy lacks.
LOOM_DETAIL_ROWS_CHECK(device_rows_check, LOOM_DETAIL_DEVICE_ROWS, LOOM_DETAIL_DEVICE_LACKS,
                       LOOM_DETAIL_DEVICE_PAGE)

/// torch's own device types: what a Device argument often is by mistake.
template <class T>
inline constexpr bool is_torch_device =
    std::is_same_v<T, c10::Device> || std::is_same_v<T, c10::DeviceType>;

/// Runtime's check of its Device argument: the known mistake alone if it is one, else every row.
template <class D>
struct device_check {
  static constexpr bool mistake = is_torch_device<D>;
  static_assert(!mistake,
                "loom::Runtime: the Device argument is torch::Device (or c10::DeviceType), not a "
                "device policy. Common mistake: pass a policy such as loom::Cpu or loom::Cuda, "
                "which holds a torch::Device (docs/concepts/device_policy.md)");
  static constexpr bool value =
      device_rows_check<std::conditional_t<mistake, skip_checks, D>>::value;
};

}  // namespace loom::detail
