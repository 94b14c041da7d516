#pragma once
#include <loom/concepts/checkpointable.hpp>
#include <loom/detail/device_rows.hpp>

namespace loom {

/// What `Runtime`'s Device argument must provide: where tensors live and how they get there.
///
///   d: D&  cd: const D&  t: const torch::Tensor&  m: torch::nn::Module&
///   o: torch::optim::Optimizer&  p: a precision policy  src: a range of batches
///   fn: batch -> batch
///
///   expression                    returns                    device::Defaults<D> does
///   D::device_type()              c10::DeviceType, const     (none)
///   D::name()                     std::string_view, const    (none) "cpu", "cuda"
///   D::ddp_backend()              "gloo" | "nccl" | "mpi"    (none; read by data parallelism)
///   cd.device()                   torch::Device              torch::Device(device_type())
///   d.prepare()                   void                       nothing (validate only)
///   d.module_to_device(m)         void                       m.to(device()), identity kept
///   cd.tensor_to_device(t)        torch::Tensor              t.to(device())
///   d.optimizer_to_device(o)      torch::optim::Optimizer&   moves o's state tensors
///   d.dataloader_to_device(src, fn)  an input range          batches moved, then fn applied
///   cd.precision_context(p)       ScopeGuard                 p.forward_context(device_type())
///   + Checkpointable<D>: state_dict {}, load_state_dict (non-empty: loom::Error), teardown
///
/// Minimal complete definition, on device::Defaults<D>: `D::device_type()`, `D::name()`,
/// `D::ddp_backend()`. The defaults call the device's own members (CRTP).
/// precision_context is the device's row (Composer's Device owns it) so that a device can
/// change how precision scopes bind to it; the default only passes its device type on.
/// Laws: tensor_to_device keeps dtype and values and returns t itself when t is already
/// there; the three names are constant expressions; prepare is idempotent.
/// Models: device::Cpu, device::Cuda.
/// Page: docs/concepts/device_policy.md
template <class D>
concept DevicePolicy = true LOOM_DETAIL_DEVICE_ROWS(LOOM_DETAIL_ROW_AND, D) && Checkpointable<D>;

}  // namespace loom
