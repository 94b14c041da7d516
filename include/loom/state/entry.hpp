#pragma once
// loom::State: what rt.save(path, state) writes and rt.load(path, state) restores in place,
// as Fabric's `state` dict: names to references.
//
//   int64_t step = 0;
//   loom::State state{{"model", model}, {"optimizer", opt}, {"runtime", rt},
//                     {"scheduler", sched}, {"sampler", sampler}, {"step", step}};
//   rt.save(dir / "last.pt", state);
//   auto rest = rt.load(dir / "last.pt", state);   // what the file holds beyond `state`
//
// An entry turns its object (a T, or a const T that only saves) into a value of the file and
// back through loom::state::entry_traits<T>:
//
//   t: T&   v: const c10::IValue&   path: const std::string& (the entry's name)
//   o: const LoadOptions&
//
//   member                  type          StateEntry
//   kind                    EntryKind     kind()
//   copies_tensors          bool          copies_tensors()
//   save(t, path)           c10::IValue   save(): the value written under the entry's name
//   load(t, v, path, o)     void          load(): restores t; errors name `path`
//
// loom's specialisations, in their order of precedence (each requires-clause excludes the
// ones above it, so a type matches one):
//
//   T                                               kind       in the file
//   a module (torch::nn::Module, a ModuleHolder,    Module     state_dict() names -> tensors
//     a shared_ptr to one)
//   an optimizer (derived from torch::optim::       Optimizer  Python's optimizer layout
//     Optimizer: SGD, Adam, AdamW, loom::optim's)
//   a loom::Runtime                                 Runtime    state/runtime.hpp's entry
//   integers (not bool); floating point numbers     Value      an int; a float
//   bool, std::string, at::Tensor (copied in        Value      itself
//     place), c10::IValue (full specialisations)
//   anything else (the primary template), by the    Object     what those return
//     first it has of checkpoint_state() /
//     load_checkpoint_state(v, strict), StateDict
//     state_dict() / load_state_dict(StateDict),
//     state_dict() / load_state_dict(IValue)
//     (schedulers, samplers, GradScaler, EMA)
//
// A type that has none of these, and cannot be given the members, gets a full specialisation
// of its own, which is chosen before loom's partial ones (docs/checkpoints.md, "Your own types"):
//
//   template <>
//   struct loom::state::entry_traits<Point> {
//     static constexpr loom::state::EntryKind kind = loom::state::EntryKind::Object;
//     static constexpr bool copies_tensors = false;
//     static c10::IValue save(Point& p, const std::string& path);
//     static void load(Point& p, const c10::IValue& v, const std::string& path,
//                      const loom::LoadOptions& o);
//   };
#include <concepts>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <loom/detail/module.hpp>
#include <loom/error.hpp>
#include <loom/state/load_options.hpp>
#include <loom/state/module.hpp>
#include <loom/state/optimizer.hpp>
#include <loom/state/runtime.hpp>
#include <loom/state/values.hpp>
#include <loom/state_dict.hpp>

namespace loom {

namespace state::detail {

template <class T>
concept module_like = std::is_base_of_v<torch::nn::Module, T> || requires(T& m) {
  { *m } -> std::convertible_to<torch::nn::Module&>;
};

template <class T>
concept checkpoint_stateful = requires(T& x, const c10::IValue& v, bool strict) {
  { x.checkpoint_state() } -> std::convertible_to<c10::IValue>;
  x.load_checkpoint_state(v, strict);
};

template <class T>
concept dict_stateful = requires(T& x, const StateDict& s) {
  { x.state_dict() } -> std::convertible_to<StateDict>;
  x.load_state_dict(s);
};

template <class T>
concept value_stateful = requires(T& x, const c10::IValue& v) {
  { x.state_dict() } -> std::convertible_to<c10::IValue>;
  x.load_state_dict(v);
};

// The requires-clauses of entry_traits' partial specialisations: each excludes the kinds that
// come before it, so that no type matches two.
template <class T>
concept optimizer_entry = !module_like<T> && std::is_base_of_v<torch::optim::Optimizer, T>;

template <class T>
concept runtime_entry =
    !module_like<T> && !std::is_base_of_v<torch::optim::Optimizer, T> && runtime_like<T>;

template <class T>
concept integer_entry = std::is_integral_v<T> && !std::is_same_v<T, bool>;

}  // namespace state::detail

namespace state {

/// What a State entry refers to: its entry_traits' `kind`.
enum class EntryKind {
  Module,     ///< a torch::nn::Module, a ModuleHolder or a shared_ptr to one
  Optimizer,  ///< a torch::optim::Optimizer
  Runtime,    ///< a loom::Runtime
  Object,     ///< an object with its own state: a scheduler, a sampler, a GradScaler, an EMA
  Value,      ///< a tensor, a number, a string or a c10::IValue
};

/// How a State entry saves and loads a T: an object with checkpoint_state() or state_dict()
/// (see the top of this file); specialise it for a type of your own.
template <class T>
struct entry_traits {
  static constexpr EntryKind kind = EntryKind::Object;
  static constexpr bool copies_tensors = false;

  static c10::IValue save(T& object, const std::string&) {
    static_assert(
        detail::checkpoint_stateful<T> || detail::dict_stateful<T> || detail::value_stateful<T>,
        "loom::State: this type cannot be checkpointed; an entry refers to a module, "
        "an optimizer, a loom::Runtime, something with state_dict()/load_state_dict() "
        "or checkpoint_state()/load_checkpoint_state(), a tensor, a number, a string "
        "or a c10::IValue; for another type, specialise loom::state::entry_traits "
        "(docs/checkpoints.md, \"Your own types\")");
    if constexpr (detail::checkpoint_stateful<T>) {
      return c10::IValue(object.checkpoint_state());
    } else if constexpr (detail::dict_stateful<T>) {
      return c10::IValue(detail::to_dict(object.state_dict()));
    } else if constexpr (detail::value_stateful<T>) {
      return c10::IValue(object.state_dict());
    } else {
      return {};  // not reached: the static_assert above has failed
    }
  }
  static void load(T& object, const c10::IValue& value, const std::string& path,
                   const LoadOptions& options) {
    if constexpr (detail::checkpoint_stateful<T>) {
      object.load_checkpoint_state(value, options.strict);
    } else if constexpr (detail::dict_stateful<T>) {
      object.load_state_dict(detail::from_dict(value, path));
    } else if constexpr (detail::value_stateful<T>) {
      object.load_state_dict(value);
    }
  }
};

/// A module: Python's module.state_dict(), loaded by copying into the module's tensors.
template <class T>
requires detail::module_like<T>
struct entry_traits<T> {
  static constexpr EntryKind kind = EntryKind::Module;
  static constexpr bool copies_tensors = true;

  static c10::IValue save(T& module, const std::string&) {
    return c10::IValue(module_state(loom::detail::as_module(module)));
  }
  static void load(T& module, const c10::IValue& value, const std::string& path,
                   const LoadOptions& options) {
    load_module_state(loom::detail::as_module(module), value, path, options.strict);
  }
};

/// An optimizer: Python's optimizer.state_dict() (state/optimizer.hpp).
template <class T>
requires detail::optimizer_entry<T>
struct entry_traits<T> {
  static constexpr EntryKind kind = EntryKind::Optimizer;
  static constexpr bool copies_tensors = true;

  static c10::IValue save(T& optimizer, const std::string& path) {
    return c10::IValue(optimizer_state(optimizer, path));
  }
  static void load(T& optimizer, const c10::IValue& value, const std::string& path,
                   const LoadOptions&) {
    load_optimizer_state(optimizer, value, path, /*adopt=*/true);
  }
};

/// A loom::Runtime (which has state_dict() too): state/runtime.hpp's entry.
template <class T>
requires detail::runtime_entry<T>
struct entry_traits<T> {
  static constexpr EntryKind kind = EntryKind::Runtime;
  static constexpr bool copies_tensors = false;

  static c10::IValue save(T& rt, const std::string&) { return c10::IValue(runtime_state(rt)); }
  static void load(T& rt, const c10::IValue& value, const std::string&,
                   const LoadOptions& options) {
    load_runtime_state(rt, value, options);
  }
};

/// What every value's traits say: EntryKind::Value, and load takes no tensor as it is.
struct ValueEntry {
  static constexpr EntryKind kind = EntryKind::Value;
  static constexpr bool copies_tensors = false;
};

/// An integer (not bool): an int in the file; a value that does not fit T is an error.
template <class T>
requires detail::integer_entry<T>
struct entry_traits<T> : ValueEntry {
  static c10::IValue save(T& number, const std::string&) {
    return c10::IValue(static_cast<int64_t>(number));
  }
  static void load(T& number, const c10::IValue& value, const std::string& path,
                   const LoadOptions&) {
    const int64_t x = as_int(value, path);
    if (static_cast<int64_t>(static_cast<T>(x)) != x || (std::is_unsigned_v<T> && x < 0)) {
      fail(path, "the value " + std::to_string(x) + " does not fit this integer type");
    }
    number = static_cast<T>(x);
  }
};

/// A floating point number: a double in the file.
template <class T>
requires std::floating_point<T>
struct entry_traits<T> : ValueEntry {
  static c10::IValue save(T& number, const std::string&) {
    return c10::IValue(static_cast<double>(number));
  }
  static void load(T& number, const c10::IValue& value, const std::string& path,
                   const LoadOptions&) {
    number = static_cast<T>(as_double(value, path));
  }
};

/// A bool.
template <>
struct entry_traits<bool> : ValueEntry {
  static c10::IValue save(bool& flag, const std::string&) { return c10::IValue(flag); }
  static void load(bool& flag, const c10::IValue& value, const std::string& path,
                   const LoadOptions&) {
    flag = as_bool(value, path);
  }
};

/// A std::string.
template <>
struct entry_traits<std::string> : ValueEntry {
  static c10::IValue save(std::string& text, const std::string&) { return c10::IValue(text); }
  static void load(std::string& text, const c10::IValue& value, const std::string& path,
                   const LoadOptions&) {
    text = string_of(value, load_owner, path);
  }
};

/// A tensor: saved detached; loaded by copying into it (same shape and dtype), or taken as it
/// is when undefined.
template <>
struct entry_traits<at::Tensor> : ValueEntry {
  static c10::IValue save(at::Tensor& tensor, const std::string&) {
    return c10::IValue(tensor.detach());
  }
  static void load(at::Tensor& tensor, const c10::IValue& value, const std::string& path,
                   const LoadOptions&) {
    at::Tensor src = as_tensor(value, path);
    if (!tensor.defined()) {
      tensor = src;
      return;
    }
    if (src.sizes() != tensor.sizes()) {
      fail(path, "has shape " + shape_string(src.sizes()) + " in the checkpoint, " +
                     shape_string(tensor.sizes()) + " here");
    }
    if (src.scalar_type() != tensor.scalar_type()) {
      fail(path, "is " + std::string(c10::toString(src.scalar_type())) + " in the checkpoint, " +
                     c10::toString(tensor.scalar_type()) + " here");
    }
    at::NoGradGuard no_grad;
    tensor.copy_(src);
  }
};

/// A c10::IValue: any value the file can hold, saved and loaded as it is.
template <>
struct entry_traits<c10::IValue> : ValueEntry {
  static c10::IValue save(c10::IValue& held, const std::string&) { return held; }
  static void load(c10::IValue& held, const c10::IValue& value, const std::string&,
                   const LoadOptions&) {
    held = value;
  }
};

}  // namespace state

/// One named object of a State, saved and loaded through state::entry_traits (see the top of
/// this file).
class StateEntry {
 public:
  template <class T>
  StateEntry(std::string name, T& object)  // NOLINT: implicit, for {{"model", model}, ...}
      : name_(std::move(name)) {
    using Traits = state::entry_traits<std::remove_const_t<T>>;
    auto* mut = const_cast<std::remove_const_t<T>*>(&object);
    kind_ = Traits::kind;
    copies_tensors_ = Traits::copies_tensors;
    if constexpr (state::detail::module_like<std::remove_const_t<T>>) {
      module_ = &loom::detail::as_module(*mut);
    } else if constexpr (state::detail::optimizer_entry<std::remove_const_t<T>>) {
      optimizer_ = mut;
    }
    save_ = [mut](const std::string& path) { return c10::IValue(Traits::save(*mut, path)); };
    if constexpr (std::is_const_v<T>) {
      load_ = [](const c10::IValue&, const std::string& path, const LoadOptions&) {
        state::fail(path, "refers to a const object, which cannot be loaded");
      };
    } else {
      load_ = [mut](const c10::IValue& v, const std::string& path, const LoadOptions& o) {
        Traits::load(*mut, v, path, o);
      };
    }
  }

  const std::string& name() const noexcept { return name_; }
  /// What the object is (a module, an optimizer, the runtime...): entry_traits<T>::kind.
  state::EntryKind kind() const noexcept { return kind_; }
  /// The module of an entry that refers to one (a module, a holder, a shared_ptr to one),
  /// else null: what a strategy that shards the module's tensors maps its pieces through.
  torch::nn::Module* module() const noexcept { return module_; }
  /// The optimizer of an entry that refers to one (derived from torch::optim::Optimizer), else
  /// null: its parameters number the entry's per-parameter states.
  torch::optim::Optimizer* optimizer() const noexcept { return optimizer_; }
  /// The object's value for the file.
  c10::IValue save() const { return save_(name_); }
  /// Restores the object from the value rt.load just read from a file (an optimizer keeps
  /// the value's tensors that need no cast); throws loom::Error naming the key at fault.
  void load(const c10::IValue& value, const LoadOptions& options) const {
    load_(value, name_, options);
  }
  /// Whether load() keeps none of the value's tensors (a module copies them into its own, an
  /// optimizer copies or keeps only those not mapped: state/optimizer.hpp), so rt.load may hand
  /// it tensors that view a mapped file (checkpoint/mapped.hpp); other entries get their own.
  bool copies_tensors() const noexcept { return copies_tensors_; }

 private:
  state::EntryKind kind_ = state::EntryKind::Value;
  bool copies_tensors_ = false;
  torch::nn::Module* module_ = nullptr;
  torch::optim::Optimizer* optimizer_ = nullptr;
  std::string name_;
  std::function<c10::IValue(const std::string&)> save_;
  std::function<void(const c10::IValue&, const std::string&, const LoadOptions&)> load_;
};

}  // namespace loom
