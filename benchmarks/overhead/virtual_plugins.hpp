#pragma once
// The dynamic-dispatch baseline: loom's hooks behind virtual functions, as a Lightning-like
// class hierarchy would have them (an Accelerator and a PrecisionPlugin chosen at run time by
// name). Each override forwards to the loom policy, so both designs do the same tensor work
// and the difference is the dispatch alone: an indirect call per hook, no inlining across the
// call, and a heap-allocated scope object for forward_context (a virtual function cannot
// return guards of different types by value; Python's context managers are objects too).
#include <memory>
#include <string_view>
#include <utility>

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <loom/loom.hpp>

namespace vbench {

/// A type-erased scope: what forward_context returns through a virtual call.
struct ContextManager {
  virtual ~ContextManager() = default;
};

template <class Guard>
struct GuardContext final : ContextManager {
  template <class Make>
  explicit GuardContext(Make&& make) : guard(std::forward<Make>(make)()) {}
  Guard guard;
};

/// Lightning's Precision plugin, in C++.
struct PrecisionPlugin {
  virtual ~PrecisionPlugin() = default;
  virtual void convert_module(torch::nn::Module& m) = 0;
  virtual at::Tensor convert_input(const at::Tensor& t) = 0;
  virtual at::Tensor convert_output(const at::Tensor& t) = 0;
  virtual std::unique_ptr<ContextManager> forward_context() = 0;
  virtual at::Tensor pre_backward(const at::Tensor& loss, torch::nn::Module& m) = 0;
  virtual void backward(const at::Tensor& loss, torch::nn::Module& m) = 0;
  virtual at::Tensor post_backward(const at::Tensor& loss, torch::nn::Module& m) = 0;
  virtual bool optimizer_step(torch::optim::Optimizer& o) = 0;
};

/// Lightning's Accelerator, reduced to what a step uses.
struct Accelerator {
  virtual ~Accelerator() = default;
  virtual c10::DeviceType device_type() const = 0;
  virtual void module_to_device(torch::nn::Module& m) = 0;
  virtual at::Tensor tensor_to_device(const at::Tensor& t) = 0;
};

template <class P>
struct PluginOf final : PrecisionPlugin {
  explicit PluginOf(c10::DeviceType device) : device_(device) {}
  void convert_module(torch::nn::Module& m) override { p_.convert_module(m); }
  at::Tensor convert_input(const at::Tensor& t) override { return p_.convert_input(t); }
  at::Tensor convert_output(const at::Tensor& t) override { return p_.convert_output(t); }
  std::unique_ptr<ContextManager> forward_context() override {
    using G = decltype(p_.forward_context(device_));
    return std::make_unique<GuardContext<G>>([&] { return p_.forward_context(device_); });
  }
  at::Tensor pre_backward(const at::Tensor& l, torch::nn::Module& m) override {
    return p_.pre_backward(l, m);
  }
  void backward(const at::Tensor& l, torch::nn::Module& m) override { p_.backward(l, m); }
  at::Tensor post_backward(const at::Tensor& l, torch::nn::Module& m) override {
    return p_.post_backward(l, m);
  }
  bool optimizer_step(torch::optim::Optimizer& o) override {
    return static_cast<bool>(p_.optimizer_step(o));
  }

 private:
  P p_;
  c10::DeviceType device_;
};

struct CpuAccelerator final : Accelerator {
  c10::DeviceType device_type() const override { return c10::kCPU; }
  void module_to_device(torch::nn::Module& m) override { d_.module_to_device(m); }
  at::Tensor tensor_to_device(const at::Tensor& t) override { return d_.tensor_to_device(t); }

 private:
  loom::Cpu d_;
};

/// Chosen at run time by Lightning's precision name; out of line, so that no call site can
/// see the dynamic type and devirtualise.
[[gnu::noinline]] inline std::unique_ptr<PrecisionPlugin> make_plugin(std::string_view name,
                                                                      c10::DeviceType device) {
  return loom::with_precision(name, [&](auto policy) -> std::unique_ptr<PrecisionPlugin> {
    return std::make_unique<PluginOf<decltype(policy)>>(device);
  });
}

[[gnu::noinline]] inline std::unique_ptr<Accelerator> make_accelerator(std::string_view name) {
  if (name != "cpu") throw loom::Error("vbench: only the cpu accelerator is built");
  return std::make_unique<CpuAccelerator>();
}

/// A Fabric-like object: the same step as loom::Runtime, every hook a virtual call.
struct DynamicFabric {
  DynamicFabric(std::string_view accelerator, std::string_view precision)
      : acc(make_accelerator(accelerator)), prec(make_plugin(precision, acc->device_type())) {}

  void setup(torch::nn::Module& m) {
    prec->convert_module(m);
    acc->module_to_device(m);
  }
  at::Tensor to_device(const at::Tensor& t) { return acc->tensor_to_device(t); }

  template <class M>
  at::Tensor forward(M& module, const at::Tensor& x) {
    at::Tensor in = prec->convert_input(x);
    at::Tensor out;
    {
      auto ctx = prec->forward_context();
      out = module->forward(in);
    }
    return prec->convert_output(out);
  }
  at::Tensor backward(const at::Tensor& loss, torch::nn::Module& m) {
    at::Tensor l = prec->pre_backward(loss, m);
    prec->backward(l, m);
    return prec->post_backward(l, m);
  }
  bool optimizer_step(torch::optim::Optimizer& o) { return prec->optimizer_step(o); }

  std::unique_ptr<Accelerator> acc;
  std::unique_ptr<PrecisionPlugin> prec;
};

}  // namespace vbench
