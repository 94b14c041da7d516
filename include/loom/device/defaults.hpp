#pragma once
#include <string>
#include <utility>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <loom/detail/refuse_state.hpp>
#include <loom/device/loader.hpp>
#include <loom/device/optimizer_state.hpp>
#include <loom/device/prefetch.hpp>
#include <loom/error.hpp>
#include <loom/state_dict.hpp>

namespace loom::device {

/// The behaviour of every DevicePolicy member that a device can derive from its device().
///
/// Self is the policy deriving from it (CRTP), which supplies the three constant names:
///   struct Cpu : device::Defaults<Cpu> {
///     static constexpr c10::DeviceType device_type() { return c10::kCPU; }
///     static constexpr std::string_view name() { return "cpu"; }
///     static constexpr std::string_view ddp_backend() { return "gloo"; }
///   };
/// Empty and non-virtual: a policy without data members stays an empty class.
template <class Self>
struct Defaults {
  /// Names this base for loom::is_default (is_default.hpp).
  using defaults_type = Defaults;

  /// The torch device this policy places tensors on (index 0-less for single-device types).
  c10::Device device() const { return c10::Device(Self::device_type()); }

  /// Validates the device; changes nothing else, and may be called again.
  void prepare() {}

  /// Moves parameters and buffers in place (TensorImpls kept); never changes a dtype.
  void module_to_device(torch::nn::Module& module) { module.to(self().device()); }

  /// The tensor on this device: `t` itself when it is already there.
  at::Tensor tensor_to_device(const at::Tensor& t) const { return t.to(self().device()); }

  /// Moves every tensor in the optimizer's state; parameters are left to module_to_device.
  torch::optim::Optimizer& optimizer_to_device(torch::optim::Optimizer& optimizer) {
    return move_optimizer_state(optimizer, self().device());
  }

  /// A view of `source` whose batches arrive on this device, then pass through `fn`, inline
  /// on the iterating thread (grad mode off while `fn` runs).
  template <class Source, class Fn = NoPrefetch>
  auto dataloader_to_device(Source& source, Fn fn = {}) const {
    auto move = [self = self()](const at::Tensor& t) { return self.tensor_to_device(t); };
    return DeviceLoader<Source, decltype(move), Fn>(source, std::move(move), std::move(fn));
  }

  /// The same batches, made by a producer thread `prefetch.depth` batches ahead
  /// (device/prefetch.hpp): the source, the move and `fn` run there, with grad mode off.
  template <class Source, class Fn>
  auto dataloader_to_device(Source& source, Fn fn, Prefetch prefetch) const {
    auto move = [self = self()](const at::Tensor& t) { return self.tensor_to_device(t); };
    using Stage = HostStage<decltype(move)>;
    return PrefetchLoader<Source, Stage, Fn>(source, Stage(std::move(move)), std::move(fn),
                                             prefetch);
  }

  /// The precision policy's forward scope, bound to this device's type.
  template <class Precision>
  auto precision_context(Precision& precision) const {
    return precision.forward_context(Self::device_type());
  }

  /// The device's checkpointable state: none.
  StateDict state_dict() const { return {}; }

  /// Accepts only an empty state: a device without state cannot load one.
  void load_state_dict(const StateDict& state) {
    loom::detail::refuse_state(Self::name(), "device", state);
  }

  /// Releases what the device holds at the end of training: nothing here.
  void teardown() {}

 private:
  const Self& self() const { return static_cast<const Self&>(*this); }
};

}  // namespace loom::device
