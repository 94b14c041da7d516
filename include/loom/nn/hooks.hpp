#pragma once
// Module hooks LibTorch lacks: Python's register_forward_pre_hook / register_forward_hook on a
// module, and register_post_accumulate_grad_hook on a parameter.
//
//   struct NetImpl : torch::nn::Module {
//     loom::Hooked<torch::nn::Linear> fc1{nullptr};           // in place of torch::nn::Linear
//     NetImpl() { fc1 = register_module("fc1", loom::Hooked<torch::nn::Linear>(8, 16)); }
//     at::Tensor forward(at::Tensor x) { return fc1(x).relu(); }
//   };
//
//   std::vector<at::Tensor> seen;
//   auto h = net->fc1->register_forward_hook(
//       [&](auto& module, const auto& args, at::Tensor& out) { seen.push_back(out.detach()); });
//   ...
//   h.remove();
//
// A LibTorch module's forward is a plain member function its parent calls directly, so there
// is nothing to hook at run time: the hookable boundary is a type, as loom::FsdpUnit's is.
// Hooked<Block> is Block itself (its implementation class derives from Block's, so parameter
// names and state_dict keys do not change) whose forward runs the hooks around Block's. With
// no hook registered the forward is Block's after one test of two empty lists. Block's forward
// must be one function (not a template nor overloaded); Hooked and FsdpUnit nest either way.
//
// Python's semantics: hooks run in the order registered (`prepend` puts one first); a
// pre-hook gets the arguments as a tuple it may change in place (Python: returning new
// arguments), a forward hook gets those arguments and the output it may change in place
// (Python: returning a new output); hooks added or removed while a forward runs take effect at
// the next one; a HookHandle's remove() (Python's RemovableHandle) takes its hook out, once.
#include <cstdint>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <loom/error.hpp>
#include <loom/nn/impl_of.hpp>

namespace loom::nn {

namespace detail {

/// What a HookHandle removes from: a list of hooks by id.
class HookRegistry {
 public:
  virtual ~HookRegistry() = default;
  virtual void remove(std::uint64_t id) = 0;
};

/// Hooks of one kind in call order, each with the id its handle names.
template <class Fn>
class HookList final : public HookRegistry {
 public:
  std::uint64_t add(Fn fn, bool prepend) {
    const std::uint64_t id = next_++;
    auto hook = std::make_shared<const Fn>(std::move(fn));
    if (prepend) {
      hooks_.insert(hooks_.begin(), {id, std::move(hook)});
    } else {
      hooks_.emplace_back(id, std::move(hook));
    }
    return id;
  }
  void remove(std::uint64_t id) override {
    std::erase_if(hooks_, [id](const auto& h) { return h.first == id; });
  }
  bool empty() const noexcept { return hooks_.empty(); }
  std::size_t size() const noexcept { return hooks_.size(); }
  /// Calls every hook registered when the call began (held by this call: a hook may add or
  /// remove hooks, itself included).
  template <class... A>
  void run(A&... args) const {
    if (hooks_.size() == 1) {
      const std::shared_ptr<const Fn> only = hooks_.front().second;
      (*only)(args...);
      return;
    }
    const auto now = hooks_;
    for (const auto& h : now) (*h.second)(args...);
  }

 private:
  std::vector<std::pair<std::uint64_t, std::shared_ptr<const Fn>>> hooks_;
  std::uint64_t next_ = 0;
};

}  // namespace detail

/// Python's RemovableHandle: remove() takes the hook out (again: nothing); a handle outliving
/// its module or parameter does nothing. Dropping a handle leaves the hook in place, as in
/// Python.
class HookHandle {
 public:
  HookHandle() = default;
  HookHandle(std::weak_ptr<detail::HookRegistry> registry, std::uint64_t id)
      : registry_(std::move(registry)), id_(id) {}

  void remove() {
    if (auto r = registry_.lock()) r->remove(id_);
    registry_.reset();
  }
  /// Whether remove() has yet to be called (and the hook's owner is alive).
  bool active() const noexcept { return !registry_.expired(); }

 private:
  std::weak_ptr<detail::HookRegistry> registry_;
  std::uint64_t id_ = 0;
};

namespace detail {

template <class Impl, class Forward>
class HookedImpl;

template <class Impl, class R, class C, class... A>
class HookedImpl<Impl, R (C::*)(A...)> : public Impl {
 public:
  using Impl::Impl;

  /// The forward's arguments, as the hooks see them.
  using Args = std::tuple<std::decay_t<A>...>;
  /// Python's `hook(module, args) -> None or new args`: changes `args` in place.
  using ForwardPreHook = std::function<void(Impl& module, Args& args)>;
  /// Python's `hook(module, args, output) -> None or new output`: changes `output` in place.
  using ForwardHook = std::function<void(Impl& module, const Args& args, R& output)>;

  /// Python's register_forward_pre_hook(hook, prepend=False).
  HookHandle register_forward_pre_hook(ForwardPreHook hook, bool prepend = false) {
    return HookHandle(pre_, pre_->add(std::move(hook), prepend));
  }
  /// Python's register_forward_hook(hook, prepend=False).
  HookHandle register_forward_hook(ForwardHook hook, bool prepend = false) {
    return HookHandle(post_, post_->add(std::move(hook), prepend));
  }
  /// How many hooks of each kind are registered.
  std::size_t forward_pre_hooks() const noexcept { return pre_->size(); }
  std::size_t forward_hooks() const noexcept { return post_->size(); }

  R forward(A... args) {
    if (pre_->empty() && post_->empty()) return Impl::forward(std::forward<A>(args)...);
    Args in{std::forward<A>(args)...};
    Impl& self = *this;
    pre_->run(self, in);
    R out = std::apply([this](const auto&... a) -> R { return Impl::forward(a...); }, in);
    post_->run(self, std::as_const(in), out);
    return out;
  }

 private:
  std::shared_ptr<HookList<ForwardPreHook>> pre_ = std::make_shared<HookList<ForwardPreHook>>();
  std::shared_ptr<HookList<ForwardHook>> post_ = std::make_shared<HookList<ForwardHook>>();
};

}  // namespace detail

/// The implementation class of Hooked<Block>: Block's, with hooks around its forward.
template <class Impl>
using HookedImpl = detail::HookedImpl<Impl, decltype(&Impl::forward)>;

/// `Block` (a module holder such as torch::nn::Linear or a TORCH_MODULE, or its Impl class)
/// with forward pre-hooks and forward hooks; see the top of this header. Constructed with
/// Block's arguments.
template <class Block>
class Hooked : public torch::nn::ModuleHolder<HookedImpl<typename detail::ImplOf<Block>::type>> {
  using Holder = torch::nn::ModuleHolder<HookedImpl<typename detail::ImplOf<Block>::type>>;

 public:
  using Holder::Holder;  // (Holder's operator= would make `h = register_module(...)` ambiguous)
};

/// Python's `hook(param) -> None`, called with the parameter once its .grad holds this
/// backward's accumulated gradient.
using PostAccumulateGradHook = std::function<void(const at::Tensor& param)>;

namespace detail {

/// The parameter's one post-accumulate-grad slot (LibTorch keeps one object per tensor, as
/// Python keeps one dict): every loom hook of the parameter, in order.
class PostAccumulateGradHooks final : public torch::autograd::PostAccumulateGradHook {
 public:
  PostAccumulateGradHooks() : hooks_(std::make_shared<HookList<nn::PostAccumulateGradHook>>()) {}
  void operator()(const torch::autograd::Variable& param) override {
    at::Tensor p = param;
    hooks_->run(p);
  }
  const std::shared_ptr<HookList<nn::PostAccumulateGradHook>>& hooks() const { return hooks_; }

 private:
  std::shared_ptr<HookList<nn::PostAccumulateGradHook>> hooks_;
};

}  // namespace detail

/// Python's `param.register_post_accumulate_grad_hook(hook)`: after backward has accumulated
/// the parameter's gradient into `param.grad()` (every backward, each micro-batch), `hook`
/// runs with the parameter, on the thread running the backward; the gradients of parameters
/// whose hooks have not run yet are still being computed. The recipe it serves, the optimizer
/// step inside backward, is loom::optim::OptimizerInBackward. `param` must be a leaf that
/// requires grad (Python's rule); anything else is a loom::Error.
inline HookHandle register_post_accumulate_grad_hook(const at::Tensor& param,
                                                     PostAccumulateGradHook hook) {
  if (!param.defined() || !param.requires_grad() || !param.is_leaf()) {
    throw Error(
        "loom::register_post_accumulate_grad_hook: the tensor must be a leaf that requires "
        "grad (a parameter); post-accumulate-grad hooks run where a leaf's gradient is "
        "accumulated");
  }
  auto& slot = torch::autograd::impl::post_acc_grad_hooks(param);
  if (!slot) slot = std::make_unique<detail::PostAccumulateGradHooks>();
  auto* ours = dynamic_cast<detail::PostAccumulateGradHooks*>(slot.get());
  if (ours == nullptr) {
    throw Error(
        "loom::register_post_accumulate_grad_hook: the tensor already holds a "
        "post-accumulate-grad hook that is not loom's (LibTorch keeps one per tensor)");
  }
  const auto& list = ours->hooks();
  return HookHandle(list, list->add(std::move(hook), false));
}

}  // namespace loom::nn

namespace loom {
using nn::Hooked;
using nn::HookHandle;
using nn::register_post_accumulate_grad_hook;
}  // namespace loom
