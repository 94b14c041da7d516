#pragma once
// loom::nn::detail::ImplOf<M>::type: the module class a module type names. The wrappers that
// derive from a user's module class (FsdpUnit<Block>, Hooked<Block>) and loom::Published<M>
// take a module holder (torch::nn::Linear, a TORCH_MODULE), a std::shared_ptr to a module, or
// the module class itself.
#include <memory>

#include <torch/nn/pimpl.h>

namespace loom::nn::detail {

template <class T>
struct ImplOf {
  using type = T;
};
template <class T>
requires torch::detail::is_module_holder<T>::value struct ImplOf<T> {
  using type = typename T::ContainedType;
};
template <class T>
struct ImplOf<std::shared_ptr<T>> {
  using type = T;
};

}  // namespace loom::nn::detail
