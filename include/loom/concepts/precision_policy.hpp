#pragma once
#include <concepts>

#include <loom/detail/requirements.hpp>

namespace loom {

/// What `Runtime`'s second argument must provide: its name, scopes, casts and backward steps.
///
///   p: P&  cp: const P&  t: const torch::Tensor&  m: torch::nn::Module&
///   o: torch::optim::Optimizer&  dt: c10::DeviceType  sd: const StateDict&
///   v, n: double  a: precision::ClipAlgorithm
///
///   expression               returns                   precision::Defaults does
///   P::precision()           std::string_view, const   (none: each policy names itself)
///   p.forward_context(dt)    ScopeGuard                nothing (NullGuard)
///   p.tensor_init_context()  ScopeGuard                nothing
///   p.module_init_context()  ScopeGuard                nothing
///   p.convert_module(m)      void                      nothing: weights stay as built
///   p.convert_input(t)       torch::Tensor             returns t
///   p.convert_output(t)      torch::Tensor             returns t
///   p.pre_backward(t, m)     torch::Tensor             returns t; backward uses the result
///   p.backward(t, m)         void                      t.backward()
///   p.post_backward(t, m)    torch::Tensor             returns t.detach()
///   p.optimizer_step(o)      bool: the step applied    o.step(); true
///   p.main_params(o)         std::vector<Tensor>       every param of every group
///   p.unscale_gradients(o)   void                      nothing (no loss scaling)
///   p.clip_gradients(o, v, a, n)  double               clip main_params; norm or 0
///   cp.state_dict()          StateDict                 {}
///   p.load_state_dict(sd)    void                      non-empty sd: loom::Error
///   p.teardown()             void                      nothing
///
/// dt is the device policy's device type: autocast scopes bind to it, never to a fixed device.
/// convert_* see one tensor at a time; batch/walk.hpp applies them to nested batches.
/// Laws: conversions keep shape and device; non-floating tensors come back unchanged; a
/// context restores on exit (exceptions included) what it changed on entry.
/// Models: precision::Fp32, Fp64, Fp16True, Bf16True, Fp16Mixed, Bf16Mixed.
/// Page: docs/concepts/precision_policy.md
template <class P>
concept PrecisionPolicy =
    std::move_constructible<P> && detail::precision_has_name<P> &&
    detail::precision_has_forward_context<P> && detail::precision_has_tensor_init_context<P> &&
    detail::precision_has_module_init_context<P> && detail::precision_has_convert_module<P> &&
    detail::precision_has_convert_input<P> && detail::precision_has_convert_output<P> &&
    detail::precision_has_pre_backward<P> && detail::precision_has_backward<P> &&
    detail::precision_has_post_backward<P> && detail::precision_has_optimizer_step<P> &&
    detail::precision_has_main_params<P> && detail::precision_has_unscale_gradients<P> &&
    detail::precision_has_clip_gradients<P> && detail::precision_has_state_dict<P> &&
    detail::precision_has_load_state_dict<P> && detail::precision_has_teardown<P>;

}  // namespace loom
