#pragma once
// loom's optimizer table: one OptimizerInfo per optimizer type, built from its
// optimizer_traits (optim/optimizer_traits.hpp) by register_optimizer<O>(). Everything in loom
// that needs to know an optimizer asks it, by the optimizer's dynamic type:
//
//   who asks                                     for
//   state/optimizer.hpp (rt.save, rt.load)       Python's layout
//   optim/lr_scheduler_base.hpp                  the momentum option (OneCycleLR, roll-backs)
//   device/optimizer_state.hpp                   the state mover (optimizer_to_device)
//   amp/grad_scaler.hpp, precision/mixed.hpp     the AMP support and the fused hand-over
//
// LibTorch's SGD, Adam, AdamW, RMSprop, Adagrad and LBFGS are in it from the first lookup
// (optim/libtorch_traits.hpp); loom::optim's SGD, Adam and AdamW enter when the first of each
// is constructed. A user's optimizer enters with register_optimizer<O>() (docs/optim.md, "Your
// own optimizer"; examples/07_custom_optimizer). A subclass of a registered optimizer that is
// not registered itself is looked up as the registered base it derives from (the last
// registered one, if several).
#include <atomic>
#include <concepts>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeindex>
#include <typeinfo>
#include <unordered_map>
#include <utility>

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/Type.h>
#include <torch/optim/optimizer.h>

#include <loom/detail/meta.hpp>
#include <loom/error.hpp>
#include <loom/optim/libtorch_traits.hpp>
#include <loom/optim/optimizer_traits.hpp>

namespace loom::optim {

/// One row of loom's optimizer table: optimizer_traits<O>, type-erased over LibTorch's base
/// classes. Every function checks the dynamic type of the options or state it is handed.
struct OptimizerInfo {
  std::string_view name;       ///< the traits' name, for messages
  std::type_index type;        ///< O
  std::type_index state_type;  ///< optimizer_traits<O>::param_state
  /// Whether an optimizer is an O (or derives from O).
  bool (*is)(const torch::optim::Optimizer&);

  /// Python's layout; the four functions are null when python_layout is false.
  bool python_layout;
  void (*save_options)(const torch::optim::OptimizerOptions&, c10::impl::GenericDict&);
  std::unique_ptr<torch::optim::OptimizerOptions> (*load_options)(
      const torch::optim::OptimizerOptions& current, const PythonReader&);
  void (*save_state)(const torch::optim::OptimizerParamState&, c10::impl::GenericDict&);
  std::unique_ptr<torch::optim::OptimizerParamState> (*load_state)(
      const PythonReader&, const torch::optim::OptimizerOptions& group);

  /// Moves one parameter's state (of state_type) to a device.
  void (*move_state)(torch::optim::OptimizerParamState&, const c10::Device&);

  MomentumKind momentum;
  /// The group's momentum option, or null (MomentumKind::None, or options of another type).
  double* (*momentum_of)(torch::optim::OptimizerOptions&);

  AmpSupport amp;
  /// The fused hand-over (AmpSupport::Fused only, else null): the next step divides the
  /// gradients by grad_scale and does nothing where found_inf is set.
  void (*set_amp)(torch::optim::Optimizer&, std::optional<at::Tensor> grad_scale,
                  std::optional<at::Tensor> found_inf);
};

namespace detail {

template <class T>
concept complete = requires {
  sizeof(T);
};

template <class T>
concept traits_types = requires {
  typename T::options;
  typename T::param_state;
}
&&std::is_base_of_v<torch::optim::OptimizerOptions, typename T::options>&&
    std::is_base_of_v<torch::optim::OptimizerParamState, typename T::param_state>;

template <class T>
concept traits_name = requires {
  { T::name } -> std::convertible_to<std::string_view>;
};

template <class T>
concept traits_base = requires {
  { T::python_layout } -> std::convertible_to<bool>;
  { T::momentum } -> std::convertible_to<MomentumKind>;
  { T::amp } -> std::convertible_to<AmpSupport>;
};

template <class T>
concept traits_mover = requires(typename T::param_state& s, const c10::Device& d) {
  T::move_state(s, d);
};

template <class T>
concept traits_layout = requires(const typename T::options& co, typename T::options& o,
                                 const typename T::param_state& s, c10::impl::GenericDict& d,
                                 const PythonReader& r) {
  T::save_options(co, d);
  T::load_options(o, r);
  T::save_state(s, d);
  { T::load_state(r, co) } -> std::convertible_to<std::unique_ptr<typename T::param_state>>;
};

template <class T>
concept traits_momentum = requires(typename T::options& o) {
  { T::momentum_of(o) } -> std::same_as<double&>;
};

template <class T, class O>
concept traits_set_amp = requires(O& opt, std::optional<at::Tensor> t) {
  T::set_amp(opt, t, t);
};

/// Checks optimizer_traits<O> against the table at the top of optim/optimizer_traits.hpp; one
/// message, naming the first member that is missing.
template <class O>
constexpr bool check_traits() {
  using T = optimizer_traits<O>;
  if constexpr (!std::is_base_of_v<torch::optim::Optimizer, O>) {
    static_assert(loom::detail::always_false<O>,
                  "loom::optim::register_optimizer<O>: O must derive from torch::optim::Optimizer");
    return false;
  } else if constexpr (!complete<T>) {
    static_assert(
        loom::detail::always_false<O>,
        "loom::optim::register_optimizer<O>: there is no loom::optim::optimizer_traits<O>; "
        "specialize it first (optim/optimizer_traits.hpp, docs/optim.md \"Your own "
        "optimizer\")");
    return false;
  } else if constexpr (!traits_types<T>) {
    static_assert(
        loom::detail::always_false<O>,
        "loom::optim::optimizer_traits<O>: `options` and `param_state` must name O's "
        "options type (a torch::optim::OptimizerOptions) and its per-parameter state type "
        "(a torch::optim::OptimizerParamState)");
    return false;
  } else if constexpr (!traits_name<T>) {
    static_assert(loom::detail::always_false<O>,
                  "loom::optim::optimizer_traits<O>: `static constexpr std::string_view name` is "
                  "missing (O's name in loom's messages)");
    return false;
  } else if constexpr (!traits_base<T>) {
    static_assert(loom::detail::always_false<O>,
                  "loom::optim::optimizer_traits<O>: derive it from loom::optim::TraitsDefaults "
                  "(python_layout, momentum and amp)");
    return false;
  } else if constexpr (!traits_mover<T>) {
    static_assert(loom::detail::always_false<O>,
                  "loom::optim::optimizer_traits<O>: `static void move_state(param_state&, const "
                  "c10::Device&)` is missing (it moves every tensor of one parameter's state)");
    return false;
  } else if constexpr (T::python_layout && !traits_layout<T>) {
    static_assert(
        loom::detail::always_false<O>,
        "loom::optim::optimizer_traits<O>: Python's layout needs save_options(const "
        "options&, c10::impl::GenericDict&), load_options(options&, const PythonReader&), "
        "save_state(const param_state&, c10::impl::GenericDict&) and load_state(const "
        "PythonReader&, const options&) -> std::unique_ptr<param_state>; or set "
        "python_layout = false");
    return false;
  } else if constexpr (T::momentum != MomentumKind::None && !traits_momentum<T>) {
    static_assert(
        loom::detail::always_false<O>,
        "loom::optim::optimizer_traits<O>: a momentum other than MomentumKind::None needs "
        "`static double& momentum_of(options&)`");
    return false;
  } else if constexpr (T::amp == AmpSupport::Fused && !traits_set_amp<T, O>) {
    static_assert(loom::detail::always_false<O>,
                  "loom::optim::optimizer_traits<O>: AmpSupport::Fused needs `static void "
                  "set_amp(O&, std::optional<at::Tensor> grad_scale, std::optional<at::Tensor> "
                  "found_inf)`");
    return false;
  } else {
    return true;
  }
}

/// `base` as the traits' type; a loom::Error naming the optimizer when it is another type.
template <class To, class From>
To& checked_cast(From& base, std::string_view name, const char* what) {
  auto* p = dynamic_cast<To*>(&base);
  if (p == nullptr) {
    throw Error(std::string("loom::optim: ") + std::string(name) + " holds " + what +
                " of another type (" + c10::demangle(typeid(base).name()) + ")");
  }
  return *p;
}

/// optimizer_traits<O> as a row of the table (check_traits<O>() holds).
template <class O>
OptimizerInfo make_info() {
  using T = optimizer_traits<O>;
  using Options = typename T::options;
  using State = typename T::param_state;
  OptimizerInfo info{
      T::name,
      std::type_index(typeid(O)),
      std::type_index(typeid(State)),
      [](const torch::optim::Optimizer& o) { return dynamic_cast<const O*>(&o) != nullptr; },
      T::python_layout,
      nullptr,
      nullptr,
      nullptr,
      nullptr,
      [](torch::optim::OptimizerParamState& s, const c10::Device& d) {
        T::move_state(checked_cast<State>(s, T::name, "a parameter state"), d);
      },
      T::momentum,
      nullptr,
      T::amp,
      nullptr};
  if constexpr (T::python_layout) {
    info.save_options = [](const torch::optim::OptimizerOptions& o, c10::impl::GenericDict& g) {
      T::save_options(checked_cast<const Options>(o, T::name, "param group options"), g);
    };
    info.load_options =
        [](const torch::optim::OptimizerOptions& current,
           const PythonReader& r) -> std::unique_ptr<torch::optim::OptimizerOptions> {
      auto o = std::make_unique<Options>(
          checked_cast<const Options>(current, T::name, "param group options"));
      T::load_options(*o, r);
      return o;
    };
    info.save_state = [](const torch::optim::OptimizerParamState& s, c10::impl::GenericDict& d) {
      T::save_state(checked_cast<const State>(s, T::name, "a parameter state"), d);
    };
    info.load_state = [](const PythonReader& r, const torch::optim::OptimizerOptions& group)
        -> std::unique_ptr<torch::optim::OptimizerParamState> {
      return T::load_state(r, checked_cast<const Options>(group, T::name, "param group options"));
    };
  }
  if constexpr (T::momentum != MomentumKind::None) {
    info.momentum_of = [](torch::optim::OptimizerOptions& o) -> double* {
      auto* typed = dynamic_cast<Options*>(&o);
      return typed == nullptr ? nullptr : &T::momentum_of(*typed);
    };
  }
  if constexpr (T::amp == AmpSupport::Fused) {
    info.set_amp = [](torch::optim::Optimizer& o, std::optional<at::Tensor> grad_scale,
                      std::optional<at::Tensor> found_inf) {
      T::set_amp(checked_cast<O>(o, T::name, "an optimizer"), std::move(grad_scale),
                 std::move(found_inf));
    };
  }
  return info;
}

/// Moves one parameter's optimizer state of one type to a device.
using StateMover = std::function<void(torch::optim::OptimizerParamState&, const c10::Device&)>;

/// The table itself: rows in registration order (stable addresses: a deque, never erased),
/// indexes by optimizer type and by state type. Lookups of a subclass are remembered until the
/// next registration.
struct Table {
  std::mutex mutex;
  std::deque<OptimizerInfo> rows;
  std::unordered_map<std::type_index, const OptimizerInfo*> by_type;
  std::unordered_map<std::type_index, const OptimizerInfo*> by_subclass;
  std::unordered_map<std::type_index, StateMover> movers;
  std::atomic<std::uint64_t> generation{0};

  Table();

  /// Enters a row (the caller holds the mutex, or is the constructor); a row for the same type
  /// replaces the old one in the indexes (the old row stays alive: lookups may hold it). The
  /// state index keeps the first mover of a state type: optimizers that share LibTorch's state
  /// types (a subclass of SGD) move their own states through their own rows.
  void add(OptimizerInfo info);
};

Table& table();

/// The mover of a parameter state's dynamic type, for a state its optimizer's row does not
/// know: the first row with that state type, or register_optimizer_state's; else empty.
StateMover state_mover(const std::type_info& state);

/// Registers a mover for one state type (device::register_optimizer_state); replaces one.
void add_state_mover(std::type_index state, StateMover mover);

}  // namespace detail

/// Enters the optimizer type O in loom's table, from optimizer_traits<O>: from then on rt.save
/// and rt.load write and read its state in Python's layout, optimizer_to_device moves it, the
/// schedulers find its momentum and 16-mixed steps it as its traits say. Call it once before
/// O's first use (calling it again does nothing); a missing or incomplete traits
/// specialization is a compile error naming the member.
template <class O>
void register_optimizer() {
  if constexpr (detail::check_traits<O>()) {
    static const bool once = [] {
      auto& t = detail::table();
      std::lock_guard<std::mutex> lock(t.mutex);
      t.add(detail::make_info<O>());
      return true;
    }();
    (void)once;
  }
}

/// The table's row for `optimizer`'s dynamic type (or the registered type it derives from);
/// null when loom's table does not know it. Repeated lookups of one type take no lock.
const OptimizerInfo* find_optimizer(const torch::optim::Optimizer& optimizer);

/// Which momentum option `optimizer` has (None when loom's table does not know it).
inline MomentumKind momentum_kind(const torch::optim::Optimizer& optimizer) {
  const auto* info = find_optimizer(optimizer);
  return info == nullptr ? MomentumKind::None : info->momentum;
}

/// How a GradScaler steps `optimizer` (HostCheck when loom's table does not know it).
inline AmpSupport amp_support(const torch::optim::Optimizer& optimizer) {
  const auto* info = find_optimizer(optimizer);
  return info == nullptr ? AmpSupport::HostCheck : info->amp;
}

}  // namespace loom::optim
