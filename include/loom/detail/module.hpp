#pragma once
// How Runtime reaches a module: through a torch::nn::Module, a ModuleHolder
// (torch::nn::Linear) or a std::shared_ptr, how it calls one, and its refusal of a forward
// before setup.
#include <string>
#include <type_traits>
#include <utility>

#include <loom/error.hpp>

namespace torch::nn {
class Module;
}  // namespace torch::nn

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

/// Runtime::forward (or no_backward_sync) before Runtime::setup: refused on every strategy, as
/// loom::Ddp must (it has no process group and no reducer yet), so a loop that forgets setup
/// fails in one process too instead of training a model on the wrong device or in the wrong
/// dtype.
[[noreturn, gnu::cold, gnu::noinline]] inline void throw_before_setup(const char* what) {
  throw Error(std::string("loom::Runtime::") + what + ": " + what +
              " before setup; call rt.setup(model) or rt.setup(model, optimizer) first (it "
              "converts the module, moves it to the device and hands it to the strategy)");
}

}  // namespace loom::detail
