#pragma once
// The rows of loom::PrecisionPolicy (concepts/precision_policy.hpp): one concept per row, the
// list that makes the concept and its diagnostics, and the check Runtime runs on its
// Precision argument.
#include <concepts>
#include <string_view>
#include <type_traits>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <c10/util/typeid.h>

#include <loom/concepts/scope_guard.hpp>
#include <loom/detail/checkpointable_rows.hpp>
#include <loom/detail/meta.hpp>
#include <loom/detail/rows.hpp>
#include <loom/step_result.hpp>

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}
namespace loom::precision {
enum class ClipAlgorithm : int;  // defined with its concept, concepts/precision_policy.hpp
}

namespace loom::detail {

template <class P>
concept precision_has_name = requires {
  { P::precision() } -> std::same_as<std::string_view>;
  typename constant<P::precision().size()>;  // a constant expression
};
template <class P>
concept precision_has_bind_device = requires(P& p, c10::Device d) {
  { p.bind_device(d) } -> std::same_as<void>;
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
/// What optimizer_step may return: a bool, or a loom::StepResult decided on the device.
template <class T>
concept step_result_like = std::same_as<T, bool> || std::same_as<T, StepResult>;
template <class P>
concept precision_has_optimizer_step = requires(P& p, torch::optim::Optimizer& o) {
  { p.optimizer_step(o) } -> step_result_like;
};
template <class P>
concept precision_has_optimizer_steps = requires(P& p, Optimizers os) {
  { p.optimizer_steps(os) } -> std::same_as<std::vector<StepResult>>;
};
template <class P>
concept precision_has_max_reduced_before_step = requires(P& p) {
  { p.max_reduced_before_step() } -> std::same_as<at::Tensor>;
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
concept precision_has_clip_gradients = requires(P& p, torch::optim::Optimizer& o, double v,
                                                precision::ClipAlgorithm a) {
  { p.clip_gradients(o, v, a, v) } -> std::same_as<GradNorm>;
};
template <class P>
concept precision_has_loss_scale = requires(const P& p) {
  { p.loss_scale() } -> std::same_as<double>;
};

// clang-format off
#define LOOM_DETAIL_PRECISION_ROWS(X, ...)                                                      \
  X(__VA_ARGS__, movable, "a move constructor")                                                 \
  X(__VA_ARGS__, precision_has_name,                                                            \
    "`static constexpr std::string_view precision()`, its name such as \"32-true\"")            \
  X(__VA_ARGS__, precision_has_bind_device, "`void bind_device(torch::Device)`")                \
  X(__VA_ARGS__, precision_has_forward_context,                                                 \
    "`forward_context(c10::DeviceType)` returning a ScopeGuard")                                \
  X(__VA_ARGS__, precision_has_tensor_init_context, "`tensor_init_context()` returning a ScopeGuard") \
  X(__VA_ARGS__, precision_has_module_init_context, "`module_init_context()` returning a ScopeGuard") \
  X(__VA_ARGS__, precision_has_convert_module, "`void convert_module(torch::nn::Module&)`")     \
  X(__VA_ARGS__, precision_has_convert_input,                                                   \
    "`torch::Tensor convert_input(const torch::Tensor&)`")                                      \
  X(__VA_ARGS__, precision_has_convert_output,                                                  \
    "`torch::Tensor convert_output(const torch::Tensor&)`")                                     \
  X(__VA_ARGS__, precision_has_pre_backward,                                                    \
    "`torch::Tensor pre_backward(const torch::Tensor&, torch::nn::Module&)`")                   \
  X(__VA_ARGS__, precision_has_backward, "`void backward(const torch::Tensor&, torch::nn::Module&)`") \
  X(__VA_ARGS__, precision_has_post_backward,                                                   \
    "`torch::Tensor post_backward(const torch::Tensor&, torch::nn::Module&)`")                  \
  X(__VA_ARGS__, precision_has_max_reduced_before_step,                                         \
    "`torch::Tensor max_reduced_before_step()`")                                                \
  X(__VA_ARGS__, precision_has_optimizer_step, "`bool optimizer_step(torch::optim::Optimizer&)`") \
  X(__VA_ARGS__, precision_has_optimizer_steps,                                                 \
    "`std::vector<loom::StepResult> optimizer_steps(loom::Optimizers)`")                        \
  X(__VA_ARGS__, precision_has_main_params,                                                     \
    "`std::vector<torch::Tensor> main_params(torch::optim::Optimizer&)`")                       \
  X(__VA_ARGS__, precision_has_unscale_gradients,                                               \
    "`void unscale_gradients(torch::optim::Optimizer&)`")                                       \
  X(__VA_ARGS__, precision_has_clip_gradients,                                                  \
    "`loom::GradNorm clip_gradients(torch::optim::Optimizer&, double, "                         \
    "loom::precision::ClipAlgorithm, double)`")                                                 \
  X(__VA_ARGS__, precision_has_loss_scale, "`double loss_scale() const`")

#define LOOM_DETAIL_PRECISION_LACKS \
  "loom::Runtime: the Precision argument does not model PrecisionPolicy: it lacks "
#define LOOM_DETAIL_PRECISION_PAGE " (docs/concepts/precision_policy.md)"
// clang-format on

/// One static_assert per PrecisionPolicy row (Checkpointable's included), each naming the
/// member a policy lacks.
LOOM_DETAIL_ROWS_CHECK(precision_rows_check, LOOM_DETAIL_PRECISION_ROWS,
                       LOOM_DETAIL_PRECISION_LACKS, LOOM_DETAIL_PRECISION_PAGE)

/// Element types and dtypes: what a Precision argument often is by mistake.
template <class T>
inline constexpr bool is_element_type =
    std::is_arithmetic_v<T> || std::is_same_v<T, c10::Half> || std::is_same_v<T, c10::BFloat16> ||
    std::is_same_v<T, c10::ScalarType> || std::is_same_v<T, caffe2::TypeMeta>;

/// Runtime's check of its Precision argument: the known mistake alone if it is one, else
/// every row.
template <class P>
struct precision_check {
  static constexpr bool mistake = is_element_type<P>;
  static_assert(!mistake,
                "loom::Runtime: the Precision argument is an element type or a dtype (such as "
                "c10::Half or torch::Dtype), not a precision policy. Common mistake: pass a "
                "policy such as loom::Fp16Mixed, or loom::precision_t<\"16-mixed\"> "
                "(docs/concepts/precision_policy.md)");
  static constexpr bool value =
      precision_rows_check<std::conditional_t<mistake, skip_checks, P>>::value;
};

}  // namespace loom::detail
