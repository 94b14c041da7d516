#pragma once
// loom::WithCallbacks and loom::CallbackList: the runtime with callbacks and their dispatch;
// the events, their tags (loom::Event) and the helpers the built-in callbacks share. What
// each member fires, and how a callback takes an event: <loom/callbacks.hpp>.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <typeindex>
#include <typeinfo>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/_foreach_sub.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/stack.h>
#include <c10/core/GradMode.h>
#include <c10/util/Type.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <loom/amp/grad_scaler.hpp>
#include <loom/concepts/strategy.hpp>
#include <loom/detail/fixed_string.hpp>
#include <loom/error.hpp>
#include <loom/loggers/logger.hpp>
#include <loom/optim/optimizer_table.hpp>
#include <loom/runtime.hpp>
#include <loom/state_dict.hpp>
#include <loom/state_reader.hpp>
#include <loom/step_result.hpp>

namespace loom {

/// The tag of the event `Name`: the first argument of a callback's `on` overload for it.
template <detail::fixed_string Name>
struct Event {
  static constexpr std::string_view name = Name.view();
};

namespace detail {

/// The argument types of an event after the runtime.
template <class... A>
struct event_args {};

/// The runtime's events and their arguments (the table at the top of loom/callbacks.hpp); any other
/// name has none unless handles<Name, Args...> gives them.
template <fixed_string Name>
struct builtin_event {
  using args = event_args<>;
};
template <>
struct builtin_event<"on_before_backward"> {
  using args = event_args<const at::Tensor&>;
};
template <>
struct builtin_event<"on_after_backward"> {
  using args = event_args<torch::nn::Module&, const at::Tensor&>;
};
template <>
struct builtin_event<"on_before_optimizer_step"> {
  using args = event_args<torch::optim::Optimizer&>;
};
template <>
struct builtin_event<"on_after_optimizer_step"> {
  using args = event_args<torch::optim::Optimizer&, const StepResult&>;
};
template <>
struct builtin_event<"on_save_checkpoint"> {
  using args = event_args<const std::filesystem::path&>;
};
template <>
struct builtin_event<"on_load_checkpoint"> {
  using args = event_args<const std::filesystem::path&>;
};
template <>
struct builtin_event<"on_log"> {
  using args = event_args<std::string_view, const loggers::MetricValue&, int64_t>;
};

/// Whether callback C takes Event<Name> with runtime R and lvalue arguments of types A...
template <class C, fixed_string Name, class R, class Args>
inline constexpr bool takes_event = false;
template <class C, fixed_string Name, class R, class... A>
inline constexpr bool takes_event<C, Name, R, event_args<A...>> = requires(C& c, R& rt) {
  c.on(Event<Name>{}, rt, std::declval<A&>()...);
};

/// Args when given, else the runtime's own arguments for Name.
template <fixed_string Name, class... Args>
using event_signature = std::conditional_t<sizeof...(Args) == 0, typename builtin_event<Name>::args,
                                           event_args<Args...>>;

/// Calls `c.on(Event<Name>{}, rt, args...)` if C has it; compiles to nothing otherwise.
template <fixed_string Name, class C, class R, class... A>
void call_one(C& c, R& rt, A&... args) {
  if constexpr (takes_event<C, Name, R, event_args<A...>>) c.on(Event<Name>{}, rt, args...);
}

/// A callback's kind in its checkpoint keys and messages: its `static constexpr
/// std::string_view kind` where it has one, else its type's name without the namespaces.
template <class C>
std::string callback_kind() {
  if constexpr (requires {
                  std::integral_constant<std::size_t, std::string_view(C::kind).size()>{};
                }) {
    return std::string(C::kind);
  } else {
    std::string name = c10::demangle(typeid(C).name());
    const std::size_t args = name.find('<');
    const std::size_t colon = name.rfind("::", args);
    return colon == std::string::npos ? name : name.substr(colon + 2);
  }
}

/// Whether T saves and loads a StateDict (a callback with state of its own).
template <class T>
concept callback_with_state = requires(T& t, const T& ct, const StateDict& s) {
  { ct.state_dict() } -> std::convertible_to<StateDict>;
  t.load_state_dict(s);
};

/// A number for a message, as `<<` writes it ("0.01", "1e-05", "inf").
inline std::string number_text(double x) {
  std::ostringstream s;
  s << x;
  return s.str();
}

/// Whether any rank says yes: `mine` on one process; else one all-reduce (Max) of a 0/1
/// double on the runtime's device, and one read of it.
template <class R>
bool any_rank(R& rt, bool mine) {
  if (rt.strategy().world_size() <= 1) return mine;
  at::Tensor vote = at::full({1}, mine ? 1.0 : 0.0,
                             at::TensorOptions().dtype(at::kDouble).device(rt.device().device()));
  rt.strategy().all_reduce(vote, dist::ReduceOp::Max);
  return vote.item<double>() > 0.0;
}

/// An optimizer's class name, as Composer's `optimizer.__class__.__name__`: the name loom's
/// optimizer table gives its exact type ("loom::optim::AdamW" -> "AdamW"), else the C++ type's
/// name without the namespaces.
inline std::string optimizer_class_name(const torch::optim::Optimizer& optimizer) {
  std::string name;
  const optim::OptimizerInfo* info = optim::find_optimizer(optimizer);
  if (info != nullptr && info->type == std::type_index(typeid(optimizer))) {
    name = std::string(info->name);
  } else {
    name = c10::demangle(typeid(optimizer).name());
  }
  const std::size_t colon = name.rfind("::", name.find('<'));
  return colon == std::string::npos ? name : name.substr(colon + 2);
}

}  // namespace detail

template <class Rt, class... C>
class WithCallbacks;

/// A WithCallbacks' callbacks, in order, and the state the runtime keeps for them: the count
/// of optimizer steps and the stop flag and reason. What `rt.callbacks()` returns, a
/// checkpoint entry of its own: `loom::State state{..., {"callbacks", rt.callbacks()}}`.
///
///   key                   value
///   callbacks             "EarlyStopper,NaNMonitor": each callback's kind, in order
///   global_step           rt.global_step()
///   should_stop           rt.should_stop()
///   stop_reason           rt.stop_reason()
///   I.KIND.KEY            callback I's state_dict()[KEY] (only callbacks that have one)
///
/// load_state_dict refuses the state of other callbacks (another list of kinds) and keys
/// nothing owns.
template <class... C>
class CallbackList {
 public:
  explicit CallbackList(C... given) : items_(std::move(given)...) {}

  /// How many callbacks there are.
  static constexpr std::size_t size() noexcept { return sizeof...(C); }

  /// The one callback of type T.
  template <class T>
  T& get() noexcept {
    static_assert((std::is_same_v<T, C> + ... + 0) == 1,
                  "loom::WithCallbacks::callback<T>: T must be the type of exactly one callback");
    return std::get<T>(items_);
  }
  template <class T>
  const T& get() const noexcept {
    return const_cast<CallbackList&>(*this).template get<T>();
  }
  /// The callbacks, in order.
  std::tuple<C...>& items() noexcept { return items_; }
  const std::tuple<C...>& items() const noexcept { return items_; }

  int64_t global_step() const noexcept { return global_step_; }
  bool should_stop() const noexcept { return should_stop_; }
  const std::string& stop_reason() const noexcept { return stop_reason_; }

  /// The kinds of the callbacks, in order, joined by ",".
  static std::string kinds() {
    std::string out;
    ((out += (out.empty() ? "" : ",") + detail::callback_kind<C>()), ...);
    return out;
  }

  StateDict state_dict() const {
    StateDict out{{"callbacks", c10::IValue(kinds())},
                  {"global_step", c10::IValue(global_step_)},
                  {"should_stop", c10::IValue(should_stop_)},
                  {"stop_reason", c10::IValue(stop_reason_)}};
    for_each_indexed([&](std::size_t i, const auto& c) {
      using T = std::remove_cvref_t<decltype(c)>;
      if constexpr (detail::callback_with_state<T>) {
        const std::string prefix = key_prefix<T>(i);
        for (const auto& [key, value] : StateDict(c.state_dict())) out.emplace(prefix + key, value);
      }
    });
    return out;
  }

  void load_state_dict(const StateDict& state) {
    static constexpr std::string_view owner = "loom::CallbackList::load_state_dict";
    state::Reader r(std::string(owner), state);
    const std::string saved = r.string("callbacks");
    if (saved != kinds()) {
      // Loading an EarlyStopper's best into a NaNMonitor (or into the second of two stoppers)
      // would resume another run than the one saved.
      state::fail_key(owner, "callbacks",
                      "the checkpoint holds the state of the callbacks [" + saved +
                          "]; this runtime has [" + kinds() + "]");
    }
    const int64_t step = r.integer("global_step");
    const bool stop = r.boolean("should_stop");
    std::string reason = r.string("stop_reason");
    std::vector<StateDict> parts(sizeof...(C));
    for_each_indexed([&](std::size_t i, const auto& c) {
      using T = std::remove_cvref_t<decltype(c)>;
      const std::string prefix = key_prefix<T>(i);
      for (const auto& [key, value] : state) {
        if (key.starts_with(prefix) && r.find(key) != nullptr) {
          parts[i].emplace(key.substr(prefix.size()), value);
        }
      }
      if constexpr (!detail::callback_with_state<T>) parts[i].clear();  // finish() refuses them
    });
    // Every key read but those of callbacks without state: refused, whatever their prefix.
    std::vector<std::string> stray;
    for_each_indexed([&](std::size_t i, const auto& c) {
      using T = std::remove_cvref_t<decltype(c)>;
      if constexpr (!detail::callback_with_state<T>) {
        for (const auto& [key, value] : state) {
          if (key.starts_with(key_prefix<T>(i))) stray.push_back(key);
        }
      }
    });
    if (!stray.empty()) state::fail_unexpected(owner, stray);
    r.finish();
    for_each_indexed([&](std::size_t i, auto& c) {
      using T = std::remove_cvref_t<decltype(c)>;
      if constexpr (detail::callback_with_state<T>) c.load_state_dict(parts[i]);
    });
    global_step_ = step;
    should_stop_ = stop;
    stop_reason_ = std::move(reason);
  }

 private:
  template <class Rt, class... D>
  friend class WithCallbacks;

  template <class T>
  static std::string key_prefix(std::size_t i) {
    return std::to_string(i) + "." + detail::callback_kind<T>() + ".";
  }

  template <class F>
  void for_each_indexed(F&& f) {
    std::apply([&](auto&... c) { each(f, std::index_sequence_for<C...>{}, c...); }, items_);
  }
  template <class F>
  void for_each_indexed(F&& f) const {
    std::apply([&](const auto&... c) { each(f, std::index_sequence_for<C...>{}, c...); }, items_);
  }
  template <class F, std::size_t... I, class... T>
  static void each(F& f, std::index_sequence<I...>, T&... c) {
    (f(I, c), ...);
  }

  // Empty callbacks (most stateless ones) take no space.
  [[no_unique_address]] std::tuple<C...> items_;
  int64_t global_step_ = 0;
  bool should_stop_ = false;
  std::string stop_reason_;
};

/// A loom::Runtime with callbacks: the runtime's steps, each firing the events of the table at
/// the top of this file on the callbacks that take them, in the order given; plus
/// `rt.call<"name">(args...)`, global_step(), and Lightning's should_stop. Its members shadow
/// the Runtime's (statically: nothing is virtual); where no callback takes a member's events,
/// the member is the Runtime's call alone (handles<...> is false: if constexpr drops the rest).
///
///   loom::WithCallbacks rt(loom::Runtime<loom::Cuda, loom::Bf16Mixed>{},
///                          loom::EarlyStopper({.metric = "val/loss", .patience = 3}));
///
/// Built from a runtime (moved in, before rt.setup: every shipped policy moves) and the
/// callbacks (moved in; get one back with rt.callback<T>()). Write the runtime with braces:
/// `WithCallbacks rt(Runtime<...>(), NaNMonitor())` would declare a function. A callback sees the
/// WithCallbacks itself as `rt`, so it can log (rt.log_dict), stop (rt.stop(reason)) and read
/// rt.global_step().
template <class Rt, class... C>
class WithCallbacks : public Rt {
  static_assert(
      requires {
        typename Rt::device_policy;
        typename Rt::strategy_policy;
      },
      "loom::WithCallbacks<Runtime, Callbacks...>: the first argument must be a "
      "loom::Runtime, as in WithCallbacks(loom::Runtime<loom::Cpu, loom::Fp32>{}, "
      "loom::NaNMonitor{})");
  static_assert((std::is_object_v<C> && ...) && (!std::is_const_v<C> && ...),
                "loom::WithCallbacks<Runtime, Callbacks...>: a callback is held by value (pass "
                "it moved, get it back with rt.callback<T>())");

 public:
  WithCallbacks(Rt runtime, C... given) : Rt(std::move(runtime)), callbacks_(std::move(given)...) {}

  /// Whether any callback takes the event `Name`: with the runtime's arguments for its own
  /// events (the table at the top of loom/callbacks.hpp), with arguments of types Args otherwise
  /// (none given: no arguments). A constant expression (static_assert takes it).
  template <detail::fixed_string Name, class... Args>
  static constexpr bool handles =
      (detail::takes_event<C, Name, WithCallbacks, detail::event_signature<Name, Args...>> || ... ||
       false);

  /// Fabric's `fabric.call("name", args...)`: `c.on(Event<"name">{}, rt, args...)` on each
  /// callback that takes it, in order; the others are skipped at compile time. Arguments are
  /// passed to each as lvalues (a callback may change them; the next one sees the change).
  template <detail::fixed_string Name, class... A>
  void call(A&&... args) {
    std::apply([&](auto&... c) { (detail::call_one<Name>(c, *this, args...), ...); },
               callbacks_.items_);
  }

  /// The callbacks and the state kept for them: a checkpoint entry
  /// (`{"callbacks", rt.callbacks()}`) that saves every callback's state_dict(), global_step,
  /// should_stop and stop_reason.
  CallbackList<C...>& callbacks() noexcept { return callbacks_; }
  const CallbackList<C...>& callbacks() const noexcept { return callbacks_; }
  /// The one callback of type T.
  template <class T>
  T& callback() noexcept {
    return callbacks_.template get<T>();
  }
  template <class T>
  const T& callback() const noexcept {
    return callbacks_.template get<T>();
  }

  /// The optimizer steps taken (optimizer_step calls; a step of several optimizers counts
  /// once). In on_before_optimizer_step, the index of the step about to be taken (0 first); in
  /// on_after_optimizer_step it counts that step. Saved by the callbacks' entry.
  int64_t global_step() const noexcept { return callbacks_.global_step_; }
  /// Lightning's trainer.should_stop: whether a callback (or the user) asked the loop to end.
  /// The loop reads it: `if (rt.should_stop()) break;`.
  bool should_stop() const noexcept { return callbacks_.should_stop_; }
  /// Asks the loop to end; the first reason given is kept.
  void stop(std::string reason) {
    if (!callbacks_.should_stop_) callbacks_.stop_reason_ = std::move(reason);
    callbacks_.should_stop_ = true;
  }
  /// Why the loop was asked to end (empty: it was not).
  const std::string& stop_reason() const noexcept { return callbacks_.stop_reason_; }

  /// Runtime::backward between on_before_backward(loss) and on_after_backward(module, the
  /// detached loss backward returns).
  template <class M>
  at::Tensor backward(const at::Tensor& loss, M& module) {
    if constexpr (handles<"on_before_backward">) call<"on_before_backward">(loss);
    at::Tensor detached = Rt::backward(loss, module);
    if constexpr (handles<"on_after_backward">) {
      torch::nn::Module& m = detail::as_module(module);
      const at::Tensor& l = detached;
      call<"on_after_backward">(m, l);
    }
    return detached;
  }

  /// Runtime::optimizer_step with on_before_optimizer_step before it (the gradients unscaled
  /// first under 16-mixed, as Lightning does, so callbacks see their true values) and
  /// on_after_optimizer_step after it, global_step() counting the step.
  StepResult optimizer_step(torch::optim::Optimizer& optimizer) {
    if constexpr (handles<"on_before_optimizer_step">) {
      unscale_for_callbacks(optimizer);
      call<"on_before_optimizer_step">(optimizer);
    }
    const StepResult result = Rt::optimizer_step(optimizer);
    ++callbacks_.global_step_;
    if constexpr (handles<"on_after_optimizer_step">)
      call<"on_after_optimizer_step">(optimizer, result);
    return result;
  }
  /// One step of several optimizers: the before events for each, in order (each unscaled
  /// first), the step, the after events for each with its result; one global step.
  std::vector<StepResult> optimizer_step(Optimizers optimizers) {
    if constexpr (handles<"on_before_optimizer_step">) {
      for (torch::optim::Optimizer& o : optimizers) unscale_for_callbacks(o);
      for (torch::optim::Optimizer& o : optimizers) call<"on_before_optimizer_step">(o);
    }
    std::vector<StepResult> results = Rt::optimizer_step(optimizers);
    ++callbacks_.global_step_;
    if constexpr (handles<"on_after_optimizer_step">) {
      for (std::size_t i = 0; i < optimizers.size(); ++i) {
        torch::optim::Optimizer& o = optimizers[i];
        const StepResult& r = results[i];
        call<"on_after_optimizer_step">(o, r);
      }
    }
    return results;
  }
  /// `rt.optimizer_step({o1, o2})`.
  std::vector<StepResult> optimizer_step(std::initializer_list<OptimizerRef> optimizers) {
    return optimizer_step(Optimizers(optimizers.begin(), optimizers.size()));
  }

  /// on_save_checkpoint(path), then Runtime::save: a callback may settle what it owes first
  /// (NaNMonitor reads its pending checks, so no checkpoint follows an unnoticed nan).
  template <class S = State>
  void save(const std::filesystem::path& path, const S& state,
            checkpoint::SaveOptions options = {}) {
    if constexpr (handles<"on_save_checkpoint">) call<"on_save_checkpoint">(path);
    Rt::save(path, state, options);
  }

  /// Runtime::load, then on_load_checkpoint(path).
  template <class S = State>
  StateDict load(const std::filesystem::path& path, const S& state, bool strict = true) {
    return load(path, state, LoadOptions{.strict = strict});
  }
  template <class S = State>
  StateDict load(const std::filesystem::path& path, const S& state, const LoadOptions& options) {
    StateDict rest = Rt::load(path, state, options);
    if constexpr (handles<"on_load_checkpoint">) call<"on_load_checkpoint">(path);
    return rest;
  }

  /// on_log(name, value, step) on every rank (so a stopper sees what every rank logs), then
  /// Runtime::log (the loggers, on rank 0).
  void log(std::string_view name, const MetricValue& value, int64_t step) {
    if constexpr (handles<"on_log">) call<"on_log">(name, value, step);
    Rt::log(name, value, step);
  }
  /// on_log for each metric, in order, then Runtime::log_dict.
  void log_dict(std::initializer_list<std::pair<std::string_view, MetricValue>> metrics,
                int64_t step) {
    if constexpr (handles<"on_log">) {
      for (const auto& [name, value] : metrics) {
        std::string_view n = name;
        call<"on_log">(n, value, step);
      }
    }
    Rt::log_dict(metrics, step);
  }
  void log_dict(const std::vector<std::pair<std::string, MetricValue>>& metrics, int64_t step) {
    if constexpr (handles<"on_log">) {
      for (const auto& [name, value] : metrics) {
        std::string_view n = name;
        call<"on_log">(n, value, step);
      }
    }
    Rt::log_dict(metrics, step);
  }

 private:
  // Under 16-mixed the gradients are scaled until the step unscales them; callbacks get them
  // unscaled (idempotent: the step does not unscale twice). An optimizer that unscales its own
  // gradients inside step() is left alone: unscaling here would make it unscale them twice.
  void unscale_for_callbacks(torch::optim::Optimizer& optimizer) {
    if constexpr (Rt::precision_name() == "16-mixed") {
      if (!amp::unscales_itself(optimizer)) this->unscale_gradients(optimizer);
    }
  }

  CallbackList<C...> callbacks_;
};

template <class Rt, class... C>
WithCallbacks(Rt, C...) -> WithCallbacks<Rt, C...>;

}  // namespace loom
