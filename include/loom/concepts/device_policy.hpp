#pragma once
#include <concepts>

#include <loom/detail/requirements.hpp>

namespace loom {

/// What `Runtime`'s first argument must provide: where tensors live and how they get there.
///
///   d: D&  cd: const D&  t: const torch::Tensor&  m: torch::nn::Module&
///   o: torch::optim::Optimizer&  p: a precision policy  src: a range of batches
///   fn: batch -> batch  sd: const StateDict&
///
///   expression                    returns                    device::Defaults<D> does
///   D::device_type()              c10::DeviceType, const     (none)
///   D::name()                     std::string_view, const    (none) "cpu", "cuda"
///   D::ddp_backend()              "gloo" | "nccl" | "mpi"    (none)
///   cd.device()                   torch::Device              torch::Device(device_type())
///   d.prepare()                   void                       nothing (validate only)
///   d.module_to_device(m)         void                       m.to(device()), identity kept
///   cd.tensor_to_device(t)        torch::Tensor              t.to(device())
///   d.optimizer_to_device(o)      torch::optim::Optimizer&   moves o's state tensors
///   d.dataloader_to_device(src, fn)  an input range          batches moved, then fn applied
///   cd.precision_context(p)       ScopeGuard                 p.forward_context(device_type())
///   cd.state_dict()               StateDict                  {}
///   d.load_state_dict(sd)         void                       non-empty sd: loom::Error
///
/// Laws: tensor_to_device keeps dtype and values and returns t itself when t is already
/// there; the three names are constant expressions; prepare is idempotent.
/// Models: device::Cpu.
/// Page: docs/concepts/device_policy.md
template <class D>
concept DevicePolicy =
    std::move_constructible<D> && detail::device_has_device_type<D> && detail::device_has_name<D> &&
    detail::device_has_ddp_backend<D> && detail::device_has_device<D> &&
    detail::device_has_prepare<D> && detail::device_has_module_to_device<D> &&
    detail::device_has_tensor_to_device<D> && detail::device_has_optimizer_to_device<D> &&
    detail::device_has_dataloader_to_device<D> && detail::device_has_precision_context<D> &&
    detail::device_has_state_dict<D> && detail::device_has_load_state_dict<D>;

}  // namespace loom
