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
#include <loom/callbacks/monitors.hpp>
#include <loom/callbacks/stoppers.hpp>
#include <loom/callbacks/with_callbacks.hpp>
