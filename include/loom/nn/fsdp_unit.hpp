#pragma once
// loom::FsdpUnit<Block>: a module that loom::Fsdp gathers, frees and reduces as one unit, as
// Python's fully_shard(block) makes each transformer block one (LibTorch modules have no
// forward hooks, so the unit boundary is a module type of loom's):
//
//   struct NetImpl : torch::nn::Module {
//     loom::FsdpUnit<Block> b1{nullptr}, b2{nullptr};   // in place of Block
//     NetImpl() { b1 = register_module("b1", loom::FsdpUnit<Block>(64)); ... }   // Block's args
//     at::Tensor forward(at::Tensor x) { return head(b2(b1(x))); }
//   };
//
// FsdpUnit<Block> is Block itself (its implementation class derives from Block's, so the
// parameters keep their names: "b1.norm.weight", as under fully_shard) whose forward runs the
// strategy's hooks around Block's: under loom::Fsdp the unit's parameters are gathered whole
// before it and freed after it, gathered again before its backward and their gradients
// reduce-scattered after it (src/dist/fsdp.cpp). Under any other strategy (SingleProcess,
// Ddp, Zero) nothing is attached and the forward is Block's, so one model definition serves
// every strategy. Block's forward must be one function (not a template nor overloaded), with
// tensors among its arguments and its result (a tensor, a tuple or a vector of them).
#include <cstddef>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <loom/nn/impl_of.hpp>

namespace loom::nn {

namespace detail {

/// What a strategy runs around a unit's forward (loom::Fsdp: src/dist/fsdp.cpp).
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  /// Before the forward, with the forward's tensor arguments: returns them as the forward is
  /// to get them (Fsdp: the parameters gathered, the inputs cast to the unit's parameter dtype
  /// and joined to the node that reduces the unit's gradients when its backward is done).
  virtual std::vector<at::Tensor> before_forward(std::vector<at::Tensor> inputs) = 0;
  /// After it, with the tensors of its result (Fsdp: the parameters freed, the outputs watched
  /// to gather them again before the unit's backward).
  virtual void after_forward(const std::vector<at::Tensor>& outputs) = 0;
};

/// The part of every unit a strategy finds (by dynamic_cast from torch::nn::Module) and
/// attaches its hooks to.
class UnitBase {
 public:
  virtual ~UnitBase() = default;
  void attach(std::shared_ptr<UnitHooks> hooks) { hooks_ = std::move(hooks); }
  UnitHooks* hooks() const { return hooks_.get(); }

 private:
  std::shared_ptr<UnitHooks> hooks_;
};

template <class T>
void collect(std::vector<at::Tensor>& out, const T& value) {
  if constexpr (std::is_same_v<T, at::Tensor>) {
    out.push_back(value);
  } else if constexpr (requires { std::tuple_size<T>::value; }) {
    std::apply([&](const auto&... v) { (collect(out, v), ...); }, value);
  } else if constexpr (std::is_same_v<T, std::vector<at::Tensor>>) {
    out.insert(out.end(), value.begin(), value.end());
  }
}

/// `value`, or the next of `replaced` where `value` is a tensor.
template <class T>
std::decay_t<T> substitute(T&& value, std::vector<at::Tensor>& replaced, std::size_t& next) {
  if constexpr (std::is_same_v<std::decay_t<T>, at::Tensor>) {
    return std::move(replaced[next++]);
  } else {
    return std::forward<T>(value);
  }
}

template <class Impl, class Forward>
class UnitImpl;

template <class Impl, class R, class C, class... A>
class UnitImpl<Impl, R (C::*)(A...)> : public Impl, public UnitBase {
 public:
  using Impl::Impl;

  R forward(A... args) {
    UnitHooks* hooks = this->hooks();
    if (hooks == nullptr) return Impl::forward(std::forward<A>(args)...);
    std::vector<at::Tensor> inputs;
    (collect(inputs, static_cast<const std::decay_t<A>&>(args)), ...);
    inputs = hooks->before_forward(std::move(inputs));
    std::size_t next = 0;
    std::tuple<std::decay_t<A>...> ready{substitute(std::forward<A>(args), inputs, next)...};
    R out = std::apply([this](auto&&... a) -> R { return Impl::forward(std::move(a)...); },
                       std::move(ready));
    std::vector<at::Tensor> outputs;
    collect(outputs, out);
    hooks->after_forward(outputs);
    return out;
  }
};

}  // namespace detail

/// The implementation class of FsdpUnit<Block>: Block's, with the unit's forward.
template <class Impl>
using FsdpUnitImpl = detail::UnitImpl<Impl, decltype(&Impl::forward)>;

/// `Block` (a module holder such as torch::nn::Linear or a TORCH_MODULE, or its Impl class)
/// as one unit of loom::Fsdp; see the top of this header. Constructed with Block's arguments.
template <class Block>
class FsdpUnit
    : public torch::nn::ModuleHolder<FsdpUnitImpl<typename detail::ImplOf<Block>::type>> {
  using Holder = torch::nn::ModuleHolder<FsdpUnitImpl<typename detail::ImplOf<Block>::type>>;

 public:
  using Holder::Holder;  // (Holder's operator= would make `b1 = register_module(...)` ambiguous)
};

}  // namespace loom::nn

namespace loom {
using nn::FsdpUnit;
}  // namespace loom
