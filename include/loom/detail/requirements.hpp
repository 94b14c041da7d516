#pragma once
// One concept per row of the PrecisionPolicy and DevicePolicy tables, so that the public
// concepts are their conjunction and Runtime can name the exact row a policy misses.
#include <concepts>
#include <ranges>
#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>

#include <loom/concepts/scope_guard.hpp>
#include <loom/detail/meta.hpp>
#include <loom/guards.hpp>
#include <loom/state_dict.hpp>

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}
namespace loom::precision {
enum class ClipAlgorithm;
}

namespace loom::detail {

// ---- PrecisionPolicy rows ----------------------------------------------------------------

template <class P>
concept precision_has_name = requires {
  { P::precision() } -> std::same_as<std::string_view>;
  typename constant<P::precision().size()>;  // a constant expression
};
template <class P>
concept precision_has_forward_context = requires(P& p, c10::DeviceType dt) {
  { p.forward_context(dt) } -> ScopeGuard;
};
template <class P>
concept precision_has_tensor_init_context = requires(P& p) {
  { p.tensor_init_context() } -> ScopeGuard;
};
template <class P>
concept precision_has_module_init_context = requires(P& p) {
  { p.module_init_context() } -> ScopeGuard;
};
template <class P>
concept precision_has_convert_module = requires(P& p, torch::nn::Module& m) {
  { p.convert_module(m) } -> std::same_as<void>;
};
template <class P>
concept precision_has_convert_input = requires(P& p, const at::Tensor& t) {
  { p.convert_input(t) } -> std::same_as<at::Tensor>;
};
template <class P>
concept precision_has_convert_output = requires(P& p, const at::Tensor& t) {
  { p.convert_output(t) } -> std::same_as<at::Tensor>;
};
template <class P>
concept precision_has_pre_backward = requires(P& p, const at::Tensor& t, torch::nn::Module& m) {
  { p.pre_backward(t, m) } -> std::same_as<at::Tensor>;
};
template <class P>
concept precision_has_backward = requires(P& p, const at::Tensor& t, torch::nn::Module& m) {
  { p.backward(t, m) } -> std::same_as<void>;
};
template <class P>
concept precision_has_post_backward = requires(P& p, const at::Tensor& t, torch::nn::Module& m) {
  { p.post_backward(t, m) } -> std::same_as<at::Tensor>;
};
template <class P>
concept precision_has_optimizer_step = requires(P& p, torch::optim::Optimizer& o) {
  { p.optimizer_step(o) } -> std::same_as<bool>;
};
template <class P>
concept precision_has_main_params = requires(P& p, torch::optim::Optimizer& o) {
  { p.main_params(o) } -> std::same_as<std::vector<at::Tensor>>;
};
template <class P>
concept precision_has_unscale_gradients = requires(P& p, torch::optim::Optimizer& o) {
  { p.unscale_gradients(o) } -> std::same_as<void>;
};
template <class P>
concept precision_has_clip_gradients =
    requires(P& p, torch::optim::Optimizer& o, double v, precision::ClipAlgorithm a) {
      { p.clip_gradients(o, v, a, v) } -> std::same_as<double>;
    };
template <class P>
concept precision_has_state_dict = requires(const P& p) {
  { p.state_dict() } -> std::same_as<StateDict>;
};
template <class P>
concept precision_has_load_state_dict = requires(P& p, const StateDict& sd) {
  { p.load_state_dict(sd) } -> std::same_as<void>;
};
template <class P>
concept precision_has_teardown = requires(P& p) {
  { p.teardown() } -> std::same_as<void>;
};

// ---- DevicePolicy rows -------------------------------------------------------------------

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
} && is_ddp_backend(D::ddp_backend());
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
concept device_has_dataloader_to_device =
    requires(D& d, std::vector<at::Tensor>& source, prefetch_archetype fn) {
      { d.dataloader_to_device(source, fn) } -> std::ranges::input_range;
    };
template <class D>
concept device_has_precision_context = requires(const D& d, precision_archetype& p) {
  { d.precision_context(p) } -> ScopeGuard;
};
template <class D>
concept device_has_state_dict = requires(const D& d) {
  { d.state_dict() } -> std::same_as<StateDict>;
};
template <class D>
concept device_has_load_state_dict = requires(D& d, const StateDict& sd) {
  { d.load_state_dict(sd) } -> std::same_as<void>;
};

}  // namespace loom::detail
