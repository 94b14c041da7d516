#pragma once
// The rows of loom::StrategyPolicy (concepts/strategy.hpp): one concept per row, the list that
// makes the concept and its diagnostics, and the check Runtime runs on its Strategy argument.
#include <concepts>
#include <filesystem>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include <loom/concepts/scope_guard.hpp>
#include <loom/detail/checkpointable_rows.hpp>
#include <loom/detail/meta.hpp>
#include <loom/detail/rows.hpp>
#include <loom/state_dict.hpp>
#include <loom/step_result.hpp>

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}
namespace loom::dist {
enum class ReduceOp : int;  // defined with its concept, concepts/strategy.hpp
struct DdpOptions;          // dist/ddp.hpp
}  // namespace loom::dist
namespace loom::checkpoint {
class CheckpointIO;  // checkpoint/checkpoint_io.hpp
}

namespace loom::detail {

/// The least the step a strategy's backward runs must be: called once, with no arguments.
struct backward_step_archetype {
  void operator()() const {}
};

/// The least the unscale callable a strategy's optimizer_step gets must be.
struct unscale_archetype {
  void operator()() const {}
};
/// The least the precision's step a strategy's optimizer_step runs must be.
struct optimizer_step_archetype {
  std::vector<StepResult> operator()() const { return {}; }
};
/// The least the precision's clip a strategy's clip_gradients runs must be: the norm before
/// clipping at a given threshold.
struct clip_archetype {
  GradNorm operator()(double) const { return GradNorm(0.0); }
};

template <class S>
concept strategy_has_name = requires {
  { S::strategy() } -> std::same_as<std::string_view>;
  typename constant<S::strategy().size()>;
};
template <class S>
concept strategy_has_setup = requires(S& s, torch::nn::Module& m, c10::Device d,
                                      std::string_view backend) {
  { s.setup(m, d, backend) } -> std::same_as<void>;
};
template <class S>
concept strategy_has_pre_forward = requires(S& s) {
  { s.pre_forward() } -> std::same_as<void>;
};
template <class S>
concept strategy_has_backward = requires(S& s, const at::Tensor& loss,
                                         backward_step_archetype step) {
  { s.backward(loss, step) } -> std::same_as<void>;
};
template <class S>
concept strategy_has_no_sync = requires(S& s) {
  { s.no_sync() } -> ScopeGuard;
};
template <class S>
concept strategy_has_rank = requires(const S& s) {
  { s.rank() } -> std::same_as<int>;
};
template <class S>
concept strategy_has_world_size = requires(const S& s) {
  { s.world_size() } -> std::same_as<int>;
};
template <class S>
concept strategy_has_local_rank = requires(const S& s) {
  { s.local_rank() } -> std::same_as<int>;
};
template <class S>
concept strategy_has_node_rank = requires(const S& s) {
  { s.node_rank() } -> std::same_as<int>;
};
template <class S>
concept strategy_has_is_global_zero = requires(const S& s) {
  { s.is_global_zero() } -> std::same_as<bool>;
};
template <class S>
concept strategy_has_barrier = requires(S& s) {
  { s.barrier() } -> std::same_as<void>;
};
template <class S>
concept strategy_has_named_barrier = requires(S& s, std::string_view name) {
  { s.barrier(name) } -> std::same_as<void>;
};
template <class S>
concept strategy_has_all_reduce = requires(S& s, at::Tensor& t, dist::ReduceOp op) {
  { s.all_reduce(t, op) } -> std::same_as<void>;
};
template <class S>
concept strategy_has_broadcast = requires(S& s, at::Tensor& t, int src) {
  { s.broadcast(t, src) } -> std::same_as<void>;
};
template <class S>
concept strategy_has_all_gather = requires(S& s, const at::Tensor& t) {
  { s.all_gather(t) } -> std::same_as<std::vector<at::Tensor>>;
};
template <class S>
concept strategy_has_broadcast_object = requires(S& s, const std::string& text,
                                                 const StateDict& dict, int src) {
  { s.broadcast_object(text, src) } -> std::same_as<std::string>;
  { s.broadcast_object(dict, src) } -> std::same_as<StateDict>;
};
template <class S>
concept strategy_has_agree = requires(S& s, const std::string& failure, const std::string& what) {
  { s.agree(failure, what) } -> std::same_as<void>;
};

template <class S>
concept strategy_has_optimizer_step = requires(S& s, Optimizers o, unscale_archetype unscale,
                                               optimizer_step_archetype step) {
  { s.optimizer_step(o, unscale, step) } -> std::same_as<std::vector<StepResult>>;
};
template <class S>
concept strategy_has_clip_gradients = requires(S& s, torch::optim::Optimizer& o, double max_norm,
                                               double norm_type, clip_archetype clip) {
  { s.clip_gradients(o, max_norm, norm_type, clip) } -> std::same_as<GradNorm>;
};
template <class S>
concept strategy_has_save_checkpoint = requires(S& s, const std::filesystem::path& p,
                                                const State& state,
                                                const checkpoint::CheckpointIO& io) {
  { s.save_checkpoint(p, state, io) } -> std::same_as<void>;
};
template <class S>
concept strategy_has_load_checkpoint = requires(S& s, const std::filesystem::path& p,
                                                const State& state,
                                                const checkpoint::CheckpointIO& io, c10::Device d) {
  { s.load_checkpoint(p, state, io, d) } -> std::same_as<c10::IValue>;
};

// clang-format off
/// The rows of loom::Collectives: what the library calls on a strategy outside the runtime's
/// hooks (collectives.hpp, rank_zero.hpp, DistributedSampler, Checkpoints, state/).
#define LOOM_DETAIL_COLLECTIVES_ROWS(X, ...)                                                    \
  X(__VA_ARGS__, strategy_has_rank, "`int rank() const`")                                       \
  X(__VA_ARGS__, strategy_has_world_size, "`int world_size() const`")                           \
  X(__VA_ARGS__, strategy_has_local_rank, "`int local_rank() const`")                           \
  X(__VA_ARGS__, strategy_has_node_rank, "`int node_rank() const`")                             \
  X(__VA_ARGS__, strategy_has_is_global_zero, "`bool is_global_zero() const`")                  \
  X(__VA_ARGS__, strategy_has_barrier, "`void barrier()`")                                      \
  X(__VA_ARGS__, strategy_has_named_barrier, "`void barrier(std::string_view name)`")           \
  X(__VA_ARGS__, strategy_has_all_reduce,                                                       \
    "`void all_reduce(torch::Tensor&, loom::dist::ReduceOp)`")                                  \
  X(__VA_ARGS__, strategy_has_broadcast, "`void broadcast(torch::Tensor&, int src)`")           \
  X(__VA_ARGS__, strategy_has_all_gather,                                                       \
    "`std::vector<torch::Tensor> all_gather(const torch::Tensor&)`")                            \
  X(__VA_ARGS__, strategy_has_broadcast_object,                                                 \
    "`std::string broadcast_object(const std::string&, int src)` and "                          \
    "`loom::StateDict broadcast_object(const loom::StateDict&, int src)`")                      \
  X(__VA_ARGS__, strategy_has_agree,                                                            \
    "`void agree(const std::string& failure, const std::string& what)`")

/// StrategyPolicy's rows: the runtime's hooks, then the Collectives rows.
#define LOOM_DETAIL_STRATEGY_ROWS(X, ...)                                                       \
  X(__VA_ARGS__, movable, "a move constructor")                                                 \
  X(__VA_ARGS__, strategy_has_name, "`static constexpr std::string_view strategy()`")           \
  X(__VA_ARGS__, strategy_has_setup,                                                            \
    "`void setup(torch::nn::Module&, torch::Device, std::string_view backend)`")               \
  X(__VA_ARGS__, strategy_has_pre_forward, "`void pre_forward()`")                              \
  X(__VA_ARGS__, strategy_has_backward,                                                         \
    "`void backward(const torch::Tensor& loss, Step&& step)` that calls step()")                \
  X(__VA_ARGS__, strategy_has_no_sync, "`no_sync()` returning a ScopeGuard")                    \
  X(__VA_ARGS__, strategy_has_optimizer_step,                                                   \
    "`R optimizer_step(loom::Optimizers, Unscale&& unscale, Step&& step)` that returns "        \
    "step()'s R")                                                                               \
  X(__VA_ARGS__, strategy_has_clip_gradients,                                                   \
    "`loom::GradNorm clip_gradients(torch::optim::Optimizer&, double max_norm, "                \
    "double norm_type, Clip&& clip)`")                                                          \
  X(__VA_ARGS__, strategy_has_save_checkpoint,                                                  \
    "`void save_checkpoint(const std::filesystem::path&, const loom::State&, "                  \
    "const loom::checkpoint::CheckpointIO&)`")                                                  \
  X(__VA_ARGS__, strategy_has_load_checkpoint,                                                  \
    "`c10::IValue load_checkpoint(const std::filesystem::path&, const loom::State&, "           \
    "const loom::checkpoint::CheckpointIO&, torch::Device)`")                                   \
  LOOM_DETAIL_COLLECTIVES_ROWS(X, __VA_ARGS__)

#define LOOM_DETAIL_STRATEGY_LACKS \
  "loom::Runtime: the Strategy argument does not model StrategyPolicy: it lacks "
#define LOOM_DETAIL_STRATEGY_PAGE " (docs/concepts/strategy.md)"
// clang-format on

/// One static_assert per StrategyPolicy row (Checkpointable's included), each naming the
/// member a policy lacks.
LOOM_DETAIL_ROWS_CHECK(strategy_rows_check, LOOM_DETAIL_STRATEGY_ROWS, LOOM_DETAIL_STRATEGY_LACKS,
                       LOOM_DETAIL_STRATEGY_PAGE)

/// Runtime's check of its Strategy argument: the options struct in place of the policy is the
/// known mistake.
template <class S>
struct strategy_check {
  static constexpr bool mistake = std::is_same_v<S, dist::DdpOptions>;
  static_assert(!mistake,
                "loom::Runtime: the Strategy argument is loom::DdpOptions, not a strategy policy. "
                "Common mistake: pass loom::Ddp as the type and the options to its constructor, "
                "Runtime<Cpu, Fp32, loom::Ddp> rt(Cpu{}, Fp32{}, loom::Ddp(options)) "
                "(docs/concepts/strategy.md)");
  static constexpr bool value =
      strategy_rows_check<std::conditional_t<mistake, skip_checks, S>>::value;
};

/// The optional row `S::takes_precision(name)`: a strategy may refuse a precision (by its
/// Lightning name) at compile time; one without the row takes every precision.
template <class S, class P>
constexpr bool strategy_takes_precision() {
  if constexpr (requires {
                  { S::takes_precision(P::precision()) } -> std::same_as<bool>;
                }) {
    return S::takes_precision(P::precision());
  } else {
    return true;
  }
}

}  // namespace loom::detail
