#pragma once
#include <loom/concepts/checkpointable.hpp>
#include <loom/detail/precision_rows.hpp>

namespace loom::precision {

/// How clip_gradients limits gradients: each element to [-v, v], or the total norm to v.
enum class ClipAlgorithm : int { Value, Norm };

}  // namespace loom::precision

namespace loom {

/// What `Runtime`'s Precision argument must provide: its name, scopes, casts and backward steps.
///
///   p: P&  cp: const P&  t: const torch::Tensor&  m: torch::nn::Module&
///   o: torch::optim::Optimizer&  os: loom::Optimizers  dev: torch::Device  dt: c10::DeviceType  v,
///   n: double a: precision::ClipAlgorithm
///
///   expression               returns                   precision::Defaults<P> does
///   P::precision()           std::string_view, const   (none: each policy names itself)
///   p.bind_device(dev)       void                      nothing (called once, when built)
///   p.forward_context(dt)    ScopeGuard                nothing (NullGuard)
///   p.tensor_init_context()  ScopeGuard                nothing
///   p.module_init_context()  ScopeGuard                nothing
///   p.convert_module(m)      void                      nothing: weights stay as built
///   p.convert_input(t)       torch::Tensor             returns t
///   p.convert_output(t)      torch::Tensor             returns t
///   p.pre_backward(t, m)     torch::Tensor             returns t; backward uses the result
///   p.backward(t, m)         void                      t.backward()
///   p.post_backward(t, m)    torch::Tensor             returns t.detach()
///   p.max_reduced_before_step()  torch::Tensor         undefined; else Runtime all-reduces it
///                                                      (Max) across ranks before each step
///   p.optimizer_step(o)      bool: the step applied    o.step(); true
///   p.optimizer_steps(os)    std::vector<StepResult>   optimizer_step(o) for each o, in order
///                                                      (one step of several optimizers)
///   p.main_params(o)         std::vector<Tensor>       every param of every group
///   p.unscale_gradients(o)   void                      nothing (no loss scaling)
///   p.clip_gradients(o, v, a, n)  GradNorm             unscale_gradients(o), then clip
///                                                      main_params(o); the norm, or 0
///   cp.loss_scale()          double                    1.0 (no loss scaling)
///   + Checkpointable<P>: state_dict {}, load_state_dict (non-empty: loom::Error), teardown
///
/// Minimal complete definition, on precision::Defaults<P>: `P::precision()`. The defaults
/// call the policy's own members (CRTP): an overridden main_params is what clip_gradients uses.
/// dt is the device policy's device type: autocast scopes bind to it, never to a fixed device.
/// convert_* see one tensor at a time; batch/walk.hpp applies them to nested batches.
/// Laws: conversions keep shape and device; non-floating tensors come back unchanged; a
/// context restores on exit (exceptions included) what it changed on entry.
/// Models: precision::Fp32, Fp64, Fp16True, Bf16True, Fp16Mixed, Bf16Mixed, Fp8Mixed.
/// Page: docs/concepts/precision_policy.md
template <class P>
concept PrecisionPolicy =
    true LOOM_DETAIL_PRECISION_ROWS(LOOM_DETAIL_ROW_AND, P) && Checkpointable<P>;

}  // namespace loom
