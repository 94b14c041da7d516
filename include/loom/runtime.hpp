#pragma once
// loom::Runtime<Device, Precision>: the order of a training step's hooks, nothing else.
//
//   setup  d.prepare -> p.convert_module -> d.module_to_device [-> d.optimizer_to_device]
//   1  batch = rt.to_device(batch)                  every tensor leaf       device/
//   2  args  = batch::map(args, p.convert_input)    floating leaves         precision/
//   3  { auto guard = d.precision_context(p);       autocast / dtype scope  precision/
//   4      out = module->forward(args...); }        user code
//   5  out = batch::map(out, p.convert_output)      back to default dtype   precision/
//   6  l = p.pre_backward(loss, module)             loss scaling            precision/
//   7  p.backward(l, module); p.post_backward(l, module)
//      [clip: p.clip_gradients(opt, ...)            unscales first           precision/, amp/]
//   8  applied = p.optimizer_step(opt)              may skip on inf/nan     precision/, amp/
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <loom/batch/walk.hpp>
#include <loom/concepts/device_policy.hpp>
#include <loom/concepts/precision_policy.hpp>
#include <loom/detail/diagnostics.hpp>
#include <loom/error.hpp>
#include <loom/precision/defaults.hpp>
#include <loom/state_dict.hpp>

namespace loom {

namespace runtime_detail {

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

}  // namespace runtime_detail

/// A training runtime: a device policy and a precision policy, called in Lightning Fabric's
/// order. Stores its policies at no cost (two empty policies make an empty class) and calls
/// every hook directly, so each call inlines to the policy's code.
///
///   loom::Runtime<loom::Cpu, loom::Fp32> rt;
///   rt.setup(model, optimizer);
///   auto out = rt.forward(model, rt.to_device(x));           // (B, classes) fp32
///   rt.backward(loss, model); rt.optimizer_step(optimizer);
template <class Device, class Precision>
class Runtime {
  static constexpr bool swapped = PrecisionPolicy<Device> && DevicePolicy<Precision>;
  static_assert(!swapped,
                "loom::Runtime<Device, Precision>: the arguments are swapped; the device "
                "policy comes first, as in Runtime<loom::Cpu, loom::Fp32>");
  static_assert(detail::device_diagnostics<
                    std::conditional_t<swapped, detail::skip_checks, Device>>::value &&
                    (swapped || DevicePolicy<Device>),
                "loom::Runtime<Device, Precision>: Device does not model DevicePolicy. "
                "Common mistake: passing torch::Device; pass a policy such as "
                "loom::Cpu, which holds one (docs/concepts/device_policy.md)");
  static_assert(detail::precision_diagnostics<
                    std::conditional_t<swapped, detail::skip_checks, Precision>>::value &&
                    (swapped || PrecisionPolicy<Precision>),
                "loom::Runtime<Device, Precision>: Precision does not model PrecisionPolicy. "
                "Common mistake: passing an element type such as c10::Half; pass a policy "
                "such as loom::Fp32 (docs/concepts/precision_policy.md)");

 public:
  using device_policy = Device;
  using precision_policy = Precision;

  Runtime() = default;
  explicit Runtime(Device device, Precision precision = Precision())
      : device_(std::move(device)), precision_(std::move(precision)) {}

  /// The precision's Lightning name, e.g. "32-true".
  static constexpr std::string_view precision_name() { return Precision::precision(); }

  Device& device() noexcept { return device_; }
  const Device& device() const noexcept { return device_; }
  Precision& precision() noexcept { return precision_; }
  const Precision& precision() const noexcept { return precision_; }

  /// The scope to build a model in: parameters get the precision's dtype.
  [[nodiscard]] auto module_init_context() { return precision_.module_init_context(); }
  /// The scope to create tensors in: floating factories give the precision's dtype.
  [[nodiscard]] auto tensor_init_context() { return precision_.tensor_init_context(); }
  /// The forward scope (autocast or default dtype) bound to this runtime's device.
  [[nodiscard]] auto forward_context() { return device_.precision_context(precision_); }

  /// Prepares the device, converts the module's weights, then moves them to the device.
  template <class M>
  void setup(M& module) {
    torch::nn::Module& m = runtime_detail::as_module(module);
    device_.prepare();
    precision_.convert_module(m);
    device_.module_to_device(m);
  }

  /// setup(module), then moves the optimizer's state to the device.
  template <class M>
  void setup(M& module, torch::optim::Optimizer& optimizer) {
    setup(module);
    device_.optimizer_to_device(optimizer);
  }

  /// A copy of a (nested) batch with every tensor on the device.
  template <class B>
  B to_device(const B& batch) const {
    return batch::map(batch, [this](const at::Tensor& t) { return device_.tensor_to_device(t); });
  }

  /// A copy of a (nested) batch cast for the model's input.
  template <class B>
  B convert_input(const B& batch) {
    return batch::map(batch, [this](const at::Tensor& t) { return precision_.convert_input(t); });
  }

  /// A copy of a (nested) output cast back to the default dtype.
  template <class B>
  B convert_output(const B& batch) {
    return batch::map(batch, [this](const at::Tensor& t) { return precision_.convert_output(t); });
  }

  /// convert_input on every argument, the call inside forward_context, convert_output after
  /// the scope has closed.
  template <class M, class... Args>
  auto forward(M&& module, const Args&... args) {
    auto out = [&] {
      auto inputs = std::make_tuple(convert_input(args)...);
      [[maybe_unused]] auto guard = forward_context();
      return std::apply([&](auto&... a) { return runtime_detail::call(module, a...); }, inputs);
    }();
    return convert_output(out);
  }

  /// pre_backward, backward, post_backward; returns post_backward's (detached) loss.
  template <class M>
  at::Tensor backward(const at::Tensor& loss, M& module) {
    torch::nn::Module& m = runtime_detail::as_module(module);
    at::Tensor l = precision_.pre_backward(loss, m);
    precision_.backward(l, m);
    return precision_.post_backward(l, m);
  }

  /// The precision's optimizer step; false when it was skipped (non-finite gradients).
  bool optimizer_step(torch::optim::Optimizer& optimizer) {
    return precision_.optimizer_step(optimizer);
  }

  /// Undoes loss scaling on the optimizer's gradients (16-mixed), so they can be inspected or
  /// clipped; does nothing for precisions without a scaler. Idempotent until the next step.
  void unscale_gradients(torch::optim::Optimizer& optimizer) {
    precision_.unscale_gradients(optimizer);
  }

  /// Clips the total gradient norm of the optimizer's parameters to `max_norm` (nothing if
  /// max_norm <= 0) and returns the norm before clipping; unscales first under 16-mixed.
  double clip_gradients(torch::optim::Optimizer& optimizer, double max_norm, double norm_type = 2.0) {
    return precision_.clip_gradients(optimizer, max_norm, precision::ClipAlgorithm::norm, norm_type);
  }

  /// Clips every gradient element of the optimizer's parameters to [-value, value] (nothing
  /// if value <= 0); unscales first under 16-mixed.
  void clip_gradients_by_value(torch::optim::Optimizer& optimizer, double value) {
    precision_.clip_gradients(optimizer, value, precision::ClipAlgorithm::value, 0.0);
  }

  /// The device's view of a batch source: batches moved, then passed through `fn`.
  template <class Source, class... Fn>
  auto dataloader(Source& source, Fn... fn) {
    return device_.dataloader_to_device(source, std::move(fn)...);
  }

  /// Both policies' state, keys prefixed "device." and "precision.", plus "precision": the
  /// precision's name, which load_state_dict checks.
  StateDict state_dict() const {
    StateDict out;
    out.emplace("precision", std::string(precision_name()));
    for (auto& [k, v] : device_.state_dict()) out.emplace("device." + k, v);
    for (auto& [k, v] : precision_.state_dict()) out.emplace("precision." + k, v);
    return out;
  }

  /// Loads what state_dict() saved; refuses a state saved under another precision.
  void load_state_dict(const StateDict& state) {
    auto name = state.find("precision");
    if (name == state.end() || !name->second.isString()) {
      throw Error("loom::Runtime::load_state_dict: the state has no \"precision\" entry; it was "
                  "not saved by loom::Runtime::state_dict()");
    }
    if (name->second.toStringRef() != precision_name()) {
      throw Error("loom::Runtime::load_state_dict: the state was saved with precision \"" +
                  name->second.toStringRef() + "\", but this runtime uses \"" +
                  std::string(precision_name()) + "\"");
    }
    StateDict device_state, precision_state;
    for (auto& [k, v] : state) {
      if (k == "precision") continue;
      if (k.starts_with("device.")) {
        device_state.emplace(k.substr(7), v);
      } else if (k.starts_with("precision.")) {
        precision_state.emplace(k.substr(10), v);
      } else {
        throw Error("loom::Runtime::load_state_dict: unexpected key \"" + k + "\"");
      }
    }
    device_.load_state_dict(device_state);
    precision_.load_state_dict(precision_state);
  }

  /// Releases what the precision policy holds.
  void teardown() { precision_.teardown(); }

 private:
  [[no_unique_address]] Device device_;
  [[no_unique_address]] Precision precision_;
};

}  // namespace loom
