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
// Each entry knows how to turn its object into a value of the file and back:
//   modules (torch::nn::Module, a ModuleHolder, a shared_ptr)   state_dict() names -> tensors
//   optimizers (SGD, Adam, AdamW; LibTorch's and loom::optim's) Python's optimizer layout
//   a loom::Runtime                                             state/runtime.hpp's entry
//   anything with checkpoint_state() / load_checkpoint_state(v, strict)
//   anything with state_dict() / load_state_dict(...) (schedulers, samplers, GradScaler)
//   at::Tensor (copied in place), bool, integers, floating point numbers, std::string,
//   c10::IValue (any value the file can hold)
#include <concepts>
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
#include <loom/state/state_dict.hpp>
#include <loom/state/values.hpp>

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

inline void load_tensor(at::Tensor& t, const c10::IValue& v, const std::string& path) {
  at::Tensor src = as_tensor(v, path);
  if (!t.defined()) {
    t = src;
    return;
  }
  if (src.sizes() != t.sizes()) {
    fail(path, "has shape " + shape_string(src.sizes()) + " in the checkpoint, " +
                   shape_string(t.sizes()) + " here");
  }
  if (src.scalar_type() != t.scalar_type()) {
    fail(path, "is " + std::string(c10::toString(src.scalar_type())) + " in the checkpoint, " +
                   c10::toString(t.scalar_type()) + " here");
  }
  at::NoGradGuard no_grad;
  t.copy_(src);
}

}  // namespace state::detail

/// One named object of a State; see the top of this file for what it can refer to.
class StateEntry {
 public:
  template <class T>
  StateEntry(std::string name, T& object)  // NOLINT: implicit, for {{"model", model}, ...}
      : name_(std::move(name)) {
    using U = std::remove_const_t<T>;
    [[maybe_unused]] constexpr bool writable = !std::is_const_v<T>;
    U* mut = const_cast<U*>(&object);
    [[maybe_unused]] const std::string& path = name_;
    if constexpr (state::detail::module_like<U>) {
      save_ = [mut] { return c10::IValue(state::module_state(loom::detail::as_module(*mut))); };
      load_ = [mut, path](const c10::IValue& v, const LoadOptions& o) {
        state::load_module_state(loom::detail::as_module(*mut), v, path, o.strict);
      };
      copies_tensors_ = true;
    } else if constexpr (std::is_base_of_v<torch::optim::Optimizer, U>) {
      save_ = [mut, path] { return c10::IValue(state::optimizer_state(*mut, path)); };
      load_ = [mut, path](const c10::IValue& v, const LoadOptions&) {
        state::load_optimizer_state(*mut, v, path, /*adopt=*/true);
      };
      copies_tensors_ = true;
    } else if constexpr (state::detail::runtime_like<U>) {
      save_ = [mut] { return c10::IValue(state::runtime_state(*mut)); };
      load_ = [mut](const c10::IValue& v, const LoadOptions& o) {
        state::load_runtime_state(*mut, v, o);
      };
    } else if constexpr (state::detail::checkpoint_stateful<U>) {
      save_ = [mut] { return c10::IValue(mut->checkpoint_state()); };
      load_ = [mut](const c10::IValue& v, const LoadOptions& o) {
        mut->load_checkpoint_state(v, o.strict);
      };
    } else if constexpr (state::detail::dict_stateful<U>) {
      save_ = [mut] { return c10::IValue(state::detail::to_dict(mut->state_dict())); };
      load_ = [mut, path](const c10::IValue& v, const LoadOptions&) {
        mut->load_state_dict(state::detail::from_dict(v, path));
      };
    } else if constexpr (state::detail::value_stateful<U>) {
      save_ = [mut] { return c10::IValue(mut->state_dict()); };
      load_ = [mut](const c10::IValue& v, const LoadOptions&) { mut->load_state_dict(v); };
    } else if constexpr (std::is_same_v<U, at::Tensor>) {
      save_ = [mut] { return c10::IValue(mut->detach()); };
      load_ = [mut, path](const c10::IValue& v, const LoadOptions&) {
        state::detail::load_tensor(*mut, v, path);
      };
    } else if constexpr (std::is_same_v<U, bool>) {
      save_ = [mut] { return c10::IValue(*mut); };
      load_ = [mut, path](const c10::IValue& v, const LoadOptions&) {
        *mut = state::as_bool(v, path);
      };
    } else if constexpr (std::is_integral_v<U>) {
      save_ = [mut] { return c10::IValue(static_cast<int64_t>(*mut)); };
      load_ = [mut, path](const c10::IValue& v, const LoadOptions&) {
        const int64_t x = state::as_int(v, path);
        if (static_cast<int64_t>(static_cast<U>(x)) != x || (std::is_unsigned_v<U> && x < 0)) {
          state::fail(path, "the value " + std::to_string(x) + " does not fit this integer type");
        }
        *mut = static_cast<U>(x);
      };
    } else if constexpr (std::is_floating_point_v<U>) {
      save_ = [mut] { return c10::IValue(static_cast<double>(*mut)); };
      load_ = [mut, path](const c10::IValue& v, const LoadOptions&) {
        *mut = static_cast<U>(state::as_double(v, path));
      };
    } else if constexpr (std::is_same_v<U, std::string>) {
      save_ = [mut] { return c10::IValue(*mut); };
      load_ = [mut, path](const c10::IValue& v, const LoadOptions&) {
        *mut = state::string_of(v, state::load_owner, path);
      };
    } else if constexpr (std::is_same_v<U, c10::IValue>) {
      save_ = [mut] { return *mut; };
      load_ = [mut](const c10::IValue& v, const LoadOptions&) { *mut = v; };
    } else {
      static_assert(
          sizeof(U) == 0,
          "loom::State: this type cannot be checkpointed; an entry refers to a module, "
          "an optimizer, a loom::Runtime, something with state_dict()/load_state_dict() or "
          "checkpoint_state()/load_checkpoint_state(), a tensor, a number, a string "
          "or a c10::IValue");
    }
    if constexpr (!writable) {
      load_ = [path](const c10::IValue&, const LoadOptions&) {
        state::fail(path, "refers to a const object, which cannot be loaded");
      };
    }
  }

  const std::string& name() const noexcept { return name_; }
  /// The object's value for the file.
  c10::IValue save() const { return save_(); }
  /// Restores the object from the value rt.load just read from a file (an optimizer keeps
  /// the value's tensors that need no cast); throws loom::Error naming the key at fault.
  void load(const c10::IValue& value, const LoadOptions& options) const { load_(value, options); }
  /// Whether load() keeps none of the value's tensors (a module copies them into its own, an
  /// optimizer copies or keeps only those not mapped: state/optimizer.hpp), so rt.load may hand
  /// it tensors that view a mapped file (checkpoint/mapped.hpp); other entries get their own.
  bool copies_tensors() const noexcept { return copies_tensors_; }

 private:
  bool copies_tensors_ = false;
  std::string name_;
  std::function<c10::IValue()> save_;
  std::function<void(const c10::IValue&, const LoadOptions&)> load_;
};

}  // namespace loom
