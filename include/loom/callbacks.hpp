#pragma once
// loom::WithCallbacks: a runtime with callbacks (Fabric's `Fabric(callbacks=[...])` and
// `fabric.call("on_x", ...)`, Composer's built-in callbacks), dispatched at compile time.
// Opt-in: #include <loom/callbacks.hpp> (<loom/loom.hpp> leaves it out).
//
//   loom::WithCallbacks rt(loom::Runtime<loom::Cpu, loom::Fp32>{},
//                          loom::EarlyStopper({.metric = "val/loss", .patience = 3}),
//                          loom::NaNMonitor({.interval = 100}));
//   rt.setup(model, optimizer);
//   for (...) {
//     rt.backward(loss, model);                        // on_before_backward, on_after_backward
//     rt.optimizer_step(optimizer);                    // on_before/after_optimizer_step
//     rt.log("val/loss", val_loss, rt.global_step());  // on_log on every rank: EarlyStopper
//     if (rt.should_stop()) break;
//   }
//   rt.call<"on_validation_end">(val_loss);            // fabric.call("on_validation_end", ...)
//
// A callback is a plain type with one member `on` per event it takes, the event's tag first
// and the runtime second (a template over it: the callback sees the whole WithCallbacks):
//
//   struct PrintLoss {
//     template <class R>
//     void on(loom::Event<"on_after_backward">, R& rt, torch::nn::Module&, const at::Tensor& loss);
//   };
//
// rt.call<"name">(args...) calls `c.on(Event<"name">{}, rt, args...)` on each callback that
// has such an overload, in the order the callbacks were given; for the others the call is not
// compiled (`if constexpr`), so an event nobody takes costs nothing. Declare `on` as returning
// void: an `auto` return would be deduced, instantiating the body, only to learn whether the
// callback takes the event. The runtime's events, Lightning's names, and their arguments after
// `rt` (each passed as an lvalue):
//
//   event                       arguments                             fired by
//   on_before_backward          const at::Tensor& loss                rt.backward, before
//   on_after_backward           torch::nn::Module&, const at::Tensor& rt.backward, after (the
//                                                                     detached loss it returns)
//   on_before_optimizer_step    torch::optim::Optimizer&              rt.optimizer_step, after
//                                                                     unscaling (16-mixed)
//   on_after_optimizer_step     torch::optim::Optimizer&,             rt.optimizer_step, after
//                               const StepResult&                     the step is counted
//   on_save_checkpoint          const std::filesystem::path&          rt.save, before writing
//   on_load_checkpoint          const std::filesystem::path&          rt.load, after loading
//   on_log                      std::string_view name,                rt.log, rt.log_dict: each
//                               const MetricValue&, int64_t step      metric, on every rank
//
// WithCallbacks::handles<"name"> says at compile time whether any callback takes an event
// (with these arguments for the runtime's events, with Args for handles<"name", Args...>);
// where none does, the runtime's member is the base Runtime's and nothing more.
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

/// The runtime's events and their arguments (the table at the top of this file); any other
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
  /// events (the table at the top of this file), with arguments of types Args otherwise (none
  /// given: no arguments). A constant expression (static_assert takes it).
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

namespace callbacks {

/// Whether a smaller or a larger value of a metric is better.
enum class Mode {
  Min,  ///< a loss, an error, a perplexity
  Max,  ///< an accuracy
};

/// EarlyStopper's settings (Lightning's EarlyStopping arguments).
struct EarlyStopperOptions {
  /// The metric watched, as logged through rt.log / rt.log_dict.
  std::string metric = "val/loss";
  Mode mode = Mode::Min;
  /// How many logged values without improvement end the run.
  int64_t patience = 3;
  /// An improvement is a value better than the best by more than this (its absolute value).
  double min_delta = 0.0;
  /// A value that is nan or infinite ends the run at once (Lightning's check_finite).
  bool check_finite = true;
};

/// Composer's EarlyStopper with Lightning's EarlyStopping rule: each value of the metric logged
/// through the runtime (on_log) is an improvement when it is better than the best so far by
/// more than min_delta (the first value always is); otherwise the wait grows by one, and at
/// `patience` values without improvement the stopper calls rt.stop(reason).
///
/// The decision is agreed over the ranks: with more than one, each value logged costs one
/// all-reduce (Max of a 0/1 vote) and one read, and every rank stops if one would. Every rank
/// must therefore log the metric at the same steps (the usual pattern: reduce it first, then
/// log on every rank; rt.log reaches callbacks on all ranks and loggers on rank 0 only). A
/// tensor value is read to the host (one sync for each value of the metric logged).
/// State: best, wait.
class EarlyStopper {
 public:
  static constexpr std::string_view kind = "EarlyStopper";

  explicit EarlyStopper(EarlyStopperOptions options = {}) : o_(std::move(options)) {
    if (o_.patience < 1) throw Error("loom::EarlyStopper: patience must be at least 1");
    o_.min_delta = std::abs(o_.min_delta);
    best_ = initial_best();
  }

  template <class R>
  void on(Event<"on_log">, R& rt, std::string_view name, const MetricValue& value, int64_t) {
    if (name != o_.metric) return;
    const double x = value.is_tensor() ? value.tensor().item<double>() : value.number();
    std::string why;
    if (!std::isfinite(x) && o_.check_finite) {
      why = "EarlyStopper: '" + o_.metric + "' is " + detail::number_text(x) +
            ", not finite (best: " + detail::number_text(best_) + ")";
    } else if (o_.mode == Mode::Min ? x < best_ - o_.min_delta : x > best_ + o_.min_delta) {
      best_ = x;
      wait_ = 0;
    } else if (++wait_ >= o_.patience) {
      why = "EarlyStopper: '" + o_.metric + "' did not improve by more than " +
            detail::number_text(o_.min_delta) + " for " + std::to_string(wait_) +
            " checks (best: " + detail::number_text(best_) + ")";
    }
    if (detail::any_rank(rt, !why.empty())) {
      rt.stop(why.empty() ? "EarlyStopper: another rank's '" + o_.metric + "' ended the run" : why);
    }
  }

  /// The best value so far (+inf for Min, -inf for Max before the first).
  double best() const noexcept { return best_; }
  /// Values logged since the last improvement.
  int64_t wait() const noexcept { return wait_; }
  const EarlyStopperOptions& options() const noexcept { return o_; }

  StateDict state_dict() const {
    return {{"best", c10::IValue(best_)}, {"wait", c10::IValue(wait_)}};
  }
  void load_state_dict(const StateDict& state) {
    state::Reader r("loom::EarlyStopper::load_state_dict", state);
    const double best = r.number("best");
    const int64_t wait = r.integer("wait");
    r.finish();
    best_ = best;
    wait_ = wait;
  }

 private:
  double initial_best() const {
    const double inf = std::numeric_limits<double>::infinity();
    return o_.mode == Mode::Min ? inf : -inf;
  }

  EarlyStopperOptions o_;
  double best_;
  int64_t wait_ = 0;
};

/// ThresholdStopper's settings (Composer's arguments).
struct ThresholdStopperOptions {
  std::string metric = "val/loss";
  double threshold = 0.0;
  /// Min: stop once a value is below the threshold (a loss low enough); Max: above it (an
  /// accuracy high enough).
  Mode mode = Mode::Min;
};

/// Composer's ThresholdStopper: stops the run (rt.stop) at the first value of the metric
/// logged through the runtime that crosses the threshold: value < threshold under Min,
/// value > threshold under Max (strictly, as Composer's torch.less / torch.greater; nan never
/// crosses). Agreed over the ranks as EarlyStopper's decision is (one all-reduce per value
/// logged when there is more than one rank; every rank logs the metric at the same steps).
/// No state.
class ThresholdStopper {
 public:
  static constexpr std::string_view kind = "ThresholdStopper";

  explicit ThresholdStopper(ThresholdStopperOptions options = {}) : o_(std::move(options)) {}

  template <class R>
  void on(Event<"on_log">, R& rt, std::string_view name, const MetricValue& value, int64_t) {
    if (name != o_.metric) return;
    const double x = value.is_tensor() ? value.tensor().item<double>() : value.number();
    const bool crossed = o_.mode == Mode::Min ? x < o_.threshold : x > o_.threshold;
    if (detail::any_rank(rt, crossed)) {
      rt.stop(crossed
                  ? "ThresholdStopper: '" + o_.metric + "' = " + detail::number_text(x) +
                        (o_.mode == Mode::Min ? " < " : " > ") + detail::number_text(o_.threshold)
                  : "ThresholdStopper: another rank's '" + o_.metric + "' ended the run");
    }
  }

  const ThresholdStopperOptions& options() const noexcept { return o_; }

 private:
  ThresholdStopperOptions o_;
};

/// NaNMonitor's settings.
struct NaNMonitorOptions {
  /// The checks are read every `interval` backwards (one host sync each time), and before
  /// every checkpoint.
  int64_t interval = 100;
};

/// Composer's NaNMonitor without a host sync per step: after each backward it computes on the
/// device one vector of flags, whether the loss and each parameter's gradient are finite (the
/// gradients' inf-norms by one _foreach_norm, so a nan or an inf anywhere shows), and keeps it
/// with the step. Every `interval` backwards, and before every checkpoint (on_save_checkpoint:
/// none is written after an unnoticed non-finite value), it reads them all at once and throws
/// loom::Error naming the step (rt.global_step() at that backward) and the first non-finite
/// thing, the loss first, then the parameters in the module's order:
///
///   loom::NaNMonitor: step 17: the loss is nan
///   loom::NaNMonitor: step 17: the gradient of 'fc2.weight' is not finite
///
/// Under 16-mixed only the loss is checked: a gradient overflow there is the GradScaler's to
/// find, and its step is skipped. Under loom::Zero and loom::Fsdp each rank checks what its
/// own parameters hold (its shards where they are sharded); with more than one rank each read
/// also agrees over the ranks (one all-reduce), so every rank throws, the ones that found
/// nothing saying another rank did. check(rt) reads now (at the end of a run, say).
class NaNMonitor {
 public:
  static constexpr std::string_view kind = "NaNMonitor";

  explicit NaNMonitor(NaNMonitorOptions options = {}) : o_(options) {
    if (o_.interval < 1) throw Error("loom::NaNMonitor: interval must be at least 1");
  }

  template <class R>
  void on(Event<"on_after_backward">, R& rt, torch::nn::Module& module, const at::Tensor& loss) {
    at::NoGradGuard no_grad;
    Pending p{rt.global_step(), {}, loss, {}};  // rt.backward's loss: detached already
    // The inf-norm (max |x|) of the loss and of each gradient: not finite exactly when an
    // element is nan or inf. Three operators whatever the model: one _foreach_norm, one stack
    // (promoting mixed dtypes), one isfinite.
    std::vector<at::Tensor> norms_of{loss};
    if constexpr (R::precision_name() != "16-mixed") {
      if (module_ != &module) {
        module_ = &module;
        params_ = module.named_parameters(/*recurse=*/true).pairs();
      }
      norms_of.reserve(1 + params_.size());
      for (std::size_t i = 0; i < params_.size(); ++i) {
        const at::Tensor& g = params_[i].second.grad();
        // An empty gradient has no inf-norm (and nothing to be non-finite).
        if (!g.defined() || g.numel() == 0) continue;
        norms_of.push_back(g);
        p.index.push_back(static_cast<uint32_t>(i));
      }
    } else {
      (void)module;
    }
    const auto norms = at::_foreach_norm(norms_of, std::numeric_limits<double>::infinity());
    p.flags = at::isfinite(at::stack(norms));  // (1 + gradients,) bool
    pending_.push_back(std::move(p));
    if (++backwards_ % o_.interval == 0) check(rt);
  }

  template <class R>
  void on(Event<"on_save_checkpoint">, R& rt, const std::filesystem::path&) {
    check(rt);
  }

  /// Reads every check kept (one host sync; none kept: nothing) and throws on the first
  /// non-finite value.
  template <class R>
  void check(R& rt) {
    std::string failure = first_failure();
    if (detail::any_rank(rt, !failure.empty())) {
      if (failure.empty()) {
        failure = "loom::NaNMonitor: another rank found a non-finite value (its error names it)";
      }
      throw Error(failure);
    }
  }

  /// Backwards seen.
  int64_t backwards() const noexcept { return backwards_; }
  /// Checks kept, not read yet.
  std::size_t pending() const noexcept { return pending_.size(); }

 private:
  struct Pending {
    int64_t step;
    at::Tensor flags;             // (1 + k,) bool: the loss, then k gradients
    at::Tensor loss;              // detached, read only to say what it is
    std::vector<uint32_t> index;  // the gradients' parameters, in params_
  };

  // The message of the first non-finite value kept (empty: none); forgets them all.
  std::string first_failure() {
    if (pending_.empty()) return {};
    std::vector<at::Tensor> all;
    all.reserve(pending_.size());
    for (const Pending& p : pending_) all.push_back(p.flags);
    const at::Tensor flags = at::cat(all).cpu();  // the one sync
    std::vector<Pending> kept = std::move(pending_);
    pending_.clear();
    const bool* ok = flags.const_data_ptr<bool>();
    std::size_t pos = 0;
    for (const Pending& p : kept) {
      const std::string where = "loom::NaNMonitor: step " + std::to_string(p.step) + ": ";
      if (!ok[pos]) {
        if (p.loss.numel() != 1) return where + "the loss is not finite";
        return where + "the loss is " + detail::number_text(p.loss.item<double>());
      }
      for (std::size_t i = 0; i < p.index.size(); ++i) {
        if (!ok[pos + 1 + i]) {
          return where + "the gradient of '" + params_[p.index[i]].first + "' is not finite";
        }
      }
      pos += 1 + p.index.size();
    }
    return {};
  }

  NaNMonitorOptions o_;
  int64_t backwards_ = 0;
  const torch::nn::Module* module_ = nullptr;
  std::vector<std::pair<std::string, at::Tensor>> params_;
  std::vector<Pending> pending_;
};

/// LRMonitor's settings.
struct LRMonitorOptions {
  /// Logs at the steps whose global_step() is a multiple of `interval`.
  int64_t interval = 1;
};

/// Composer's LRMonitor: before each optimizer step (every `interval`), the learning rate of
/// each parameter group under Composer's key `lr-<OptimizerName>/group<i>` (the optimizer's
/// class name: "SGD", "AdamW", loom::optim's "AdamW" as well), logged through
/// rt.log_dict(metrics, rt.global_step()): the loggers, and on_log for the other callbacks.
/// Reads the options' lr: no device work.
class LRMonitor {
 public:
  static constexpr std::string_view kind = "LRMonitor";

  explicit LRMonitor(LRMonitorOptions options = {}) : o_(options) {
    if (o_.interval < 1) throw Error("loom::LRMonitor: interval must be at least 1");
  }

  template <class R>
  void on(Event<"on_before_optimizer_step">, R& rt, torch::optim::Optimizer& optimizer) {
    const int64_t step = rt.global_step();
    if (step % o_.interval != 0) return;
    const std::string prefix = "lr-" + detail::optimizer_class_name(optimizer) + "/group";
    std::vector<std::pair<std::string, MetricValue>> metrics;
    const auto& groups = optimizer.param_groups();
    for (std::size_t i = 0; i < groups.size(); ++i) {
      metrics.emplace_back(prefix + std::to_string(i), MetricValue(groups[i].options().get_lr()));
    }
    rt.log_dict(metrics, step);
  }

 private:
  LRMonitorOptions o_;
};

/// OptimizerMonitor's settings.
struct OptimizerMonitorOptions {
  /// Reports the steps whose global_step() is a multiple of `interval`.
  int64_t interval = 10;
};

/// Composer's OptimizerMonitor: every `interval` steps, L2 norms under Composer's keys,
/// logged through rt.log_dict(metrics, step) at on_after_optimizer_step (step: the index of
/// the step taken, as LRMonitor logs it):
///
///   l2_norm/grad/global       the norm of all the gradients together
///   l2_norm/grad/NAME         each parameter's gradient (before the step; unscaled under
///                             16-mixed)
///   l2_norm/param/NAME        each parameter, after the step
///   l2_norm/update/NAME       what the step changed: the parameter after minus before
///
/// NAME is the parameter's name in the module rt.backward last saw; parameters without a
/// gradient are left out. The norms stay device tensors (one _foreach_norm per kind, no host
/// sync; the loggers read them when they flush), and the parameters are copied for the update
/// only on the steps reported. Under loom::Zero and loom::Fsdp the norms are of what this
/// rank's parameters and gradients hold (its shards where they are sharded), not of the whole
/// model.
class OptimizerMonitor {
 public:
  static constexpr std::string_view kind = "OptimizerMonitor";

  explicit OptimizerMonitor(OptimizerMonitorOptions options = {}) : o_(options) {
    if (o_.interval < 1) throw Error("loom::OptimizerMonitor: interval must be at least 1");
  }

  template <class R>
  void on(Event<"on_after_backward">, R&, torch::nn::Module& module, const at::Tensor&) {
    module_ = &module;
  }

  template <class R>
  void on(Event<"on_before_optimizer_step">, R& rt, torch::optim::Optimizer&) {
    const int64_t step = rt.global_step();
    // One report per step: a step of several optimizers fires this once for each.
    if (step % o_.interval != 0 || step == pending_step_) return;
    if (module_ == nullptr) {
      throw Error(
          "loom::OptimizerMonitor: an optimizer step without a backward through the runtime "
          "first; the parameters' names come from the module rt.backward(loss, module) gets");
    }
    at::NoGradGuard no_grad;
    pending_step_ = step;
    names_.clear();
    params_.clear();
    std::vector<at::Tensor> grads;
    for (const auto& p : module_->named_parameters(/*recurse=*/true)) {
      if (!p.value().grad().defined()) continue;
      names_.push_back(p.key());
      params_.push_back(p.value());
      grads.push_back(p.value().grad());
    }
    metrics_.clear();
    if (grads.empty()) return;
    const auto norms = at::_foreach_norm(grads, 2);
    metrics_.emplace_back("l2_norm/grad/global",
                          MetricValue(at::linalg_vector_norm(at::stack(norms).to(at::kDouble), 2)));
    for (std::size_t i = 0; i < norms.size(); ++i) {
      metrics_.emplace_back("l2_norm/grad/" + names_[i], MetricValue(norms[i]));
    }
    before_.clear();
    before_.reserve(params_.size());
    for (const at::Tensor& p : params_) before_.push_back(p.detach().clone());
  }

  template <class R>
  void on(Event<"on_after_optimizer_step">, R& rt, torch::optim::Optimizer&, const StepResult&) {
    // The step is counted before this event: the one just taken is global_step() - 1.
    if (pending_step_ != rt.global_step() - 1) return;
    const int64_t step = pending_step_;
    pending_step_ = -1;
    if (params_.empty()) return;
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> now;
    now.reserve(params_.size());
    for (const at::Tensor& p : params_) now.push_back(p.detach());
    const auto param_norms = at::_foreach_norm(now, 2);
    const auto update_norms = at::_foreach_norm(at::_foreach_sub(now, before_), 2);
    for (std::size_t i = 0; i < names_.size(); ++i) {
      metrics_.emplace_back("l2_norm/param/" + names_[i], MetricValue(param_norms[i]));
    }
    for (std::size_t i = 0; i < names_.size(); ++i) {
      metrics_.emplace_back("l2_norm/update/" + names_[i], MetricValue(update_norms[i]));
    }
    before_.clear();
    std::vector<std::pair<std::string, MetricValue>> metrics = std::move(metrics_);
    metrics_.clear();
    rt.log_dict(metrics, step);
  }

 private:
  OptimizerMonitorOptions o_;
  torch::nn::Module* module_ = nullptr;
  int64_t pending_step_ = -1;
  std::vector<std::string> names_;
  std::vector<at::Tensor> params_, before_;
  std::vector<std::pair<std::string, MetricValue>> metrics_;
};

}  // namespace callbacks

// The callbacks' names in loom::, where users write them.
using callbacks::EarlyStopper;
using callbacks::EarlyStopperOptions;
using callbacks::LRMonitor;
using callbacks::LRMonitorOptions;
using callbacks::NaNMonitor;
using callbacks::NaNMonitorOptions;
using callbacks::OptimizerMonitor;
using callbacks::OptimizerMonitorOptions;
using callbacks::ThresholdStopper;
using callbacks::ThresholdStopperOptions;
using MetricMode = callbacks::Mode;

}  // namespace loom
