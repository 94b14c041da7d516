#pragma once
// What Runtime does with a module built under loom::EmptyInit (nn/empty_init.hpp): at setup its
// meta tensors get memory on the device (by the strategy itself where it has the optional row
// `S::takes_empty_modules`: loom::Fsdp allocates only each rank's pieces), and the runtime
// holds no values for it until rt.load or rt.reset_parameters gives them; rt.reset_parameters
// goes through the strategy's optional row `s.reset_parameters(module, init)` or, without one,
// initializes every module whole and broadcasts rank 0's values.
#include <concepts>
#include <string>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/module.h>

#include <loom/detail/module.hpp>
#include <loom/error.hpp>
#include <loom/nn/empty_init.hpp>
#include <loom/state/load_options.hpp>

namespace loom::detail {

/// Where a runtime stands: before setup; set up with a module that holds no values yet (built
/// under loom::EmptyInit, neither loaded nor reset); ready to train.
enum class Stage : unsigned char { Built, Empty, Ready };

/// Why `what` cannot run at `stage` (not Ready).
[[noreturn, gnu::cold, gnu::noinline]] inline void throw_not_ready(Stage stage, const char* what) {
  if (stage == Stage::Built) throw_before_setup(what);
  throw Error(std::string("loom::Runtime::") + what +
              ": the module was built under loom::EmptyInit and holds no values yet: give them "
              "with rt.load(path, state) (or loom::Checkpoints::resume) or "
              "rt.reset_parameters(model) first");
}

/// The optional row `S::takes_empty_modules`: the strategy's setup gives a module's meta
/// tensors their memory itself (the runtime neither materializes nor moves such a module).
template <class S>
constexpr bool strategy_takes_empty_modules() {
  if constexpr (requires {
                  { S::takes_empty_modules } -> std::convertible_to<bool>;
                }) {
    return S::takes_empty_modules;
  } else {
    return false;
  }
}

/// Moves `module` to the device (`move`); a module with meta tensors first gets uninitialized
/// memory for them on `device`, unless the strategy takes empty modules. Whether it had any.
template <class S, class Move>
bool give_memory(torch::nn::Module& module, c10::Device device, Move&& move) {
  const bool empty = nn::has_meta_tensors(module);
  if (empty && strategy_takes_empty_modules<S>()) return true;
  if (empty) nn::materialize(module, device);
  move();
  return empty;
}

/// Every parameter and buffer of `module` set in place to rank `src`'s values through
/// `group.broadcast(at::Tensor&, src)` (a strided one through a contiguous copy): one model on
/// every rank (rt.reset_parameters' default, loom::Fsdp's setup).
template <class Group>
void broadcast_module(Group& group, torch::nn::Module& module, int src) {
  auto broadcast = [&](const at::Tensor& t) {
    at::Tensor held = t.detach();
    if (held.is_contiguous()) {
      group.broadcast(held, src);
    } else {
      at::Tensor c = held.contiguous();
      group.broadcast(c, src);
      held.copy_(c);
    }
  };
  for (const auto& p : module.parameters(/*recurse=*/true)) broadcast(p);
  for (const auto& b : module.buffers(/*recurse=*/true)) broadcast(b);
}

/// rt.load's options at `stage`: only a module built under EmptyInit and given its memory by
/// the runtime (not by the strategy, as loom::Fsdp gives it) may keep the file's pages.
template <class S>
LoadOptions load_options_at(Stage stage, LoadOptions options) {
  options.keep_mapped =
      options.keep_mapped && stage == Stage::Empty && !strategy_takes_empty_modules<S>();
  return options;
}

/// rt.reset_parameters: the strategy's row, or every module initialized whole (nn::init_each)
/// and, with several processes, rank 0's parameters and buffers broadcast.
template <class S>
void reset_parameters(S& strategy, torch::nn::Module& module, const nn::Initializer& init) {
  if constexpr (requires { strategy.reset_parameters(module, init); }) {
    strategy.reset_parameters(module, init);
  } else {
    nn::init_each(
        module, init, [](const at::Tensor& t) { return t.sizes().vec(); },
        [](const at::Tensor& held, const at::Tensor& whole) { held.detach().copy_(whole); });
    if (strategy.world_size() > 1) broadcast_module(strategy, module, 0);
  }
}

}  // namespace loom::detail
