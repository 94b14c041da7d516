#pragma once
// How Runtime reaches a module: through a torch::nn::Module, a ModuleHolder
// (torch::nn::Linear) or a std::shared_ptr, and how it calls one.
#include <type_traits>
#include <utility>

#include <torch/nn/module.h>

namespace loom::detail {

/// The torch::nn::Module behind a module, a ModuleHolder (torch::nn::Linear) or a shared_ptr.
template <class M>
torch::nn::Module& as_module(M& module) {
  if constexpr (std::is_base_of_v<torch::nn::Module, M>) {
    return module;
  } else {
    return *module;  // ModuleHolder and std::shared_ptr both dereference to the module
  }
}

/// Calls a module's forward (through a holder or pointer) or any other callable.
template <class M, class... A>
decltype(auto) call(M& module, A&&... args) {
  if constexpr (requires { module->forward(std::forward<A>(args)...); }) {
    return module->forward(std::forward<A>(args)...);
  } else if constexpr (requires { module.forward(std::forward<A>(args)...); }) {
    return module.forward(std::forward<A>(args)...);
  } else {
    return module(std::forward<A>(args)...);
  }
}

}  // namespace loom::detail
