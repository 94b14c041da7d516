#pragma once
// Policies that record every hook call, in order, so tests can assert the call sequence and
// prove that a custom policy's own members run (a misspelt override would keep the default).
#include <string>
#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <loom/device/defaults.hpp>
#include <loom/precision/defaults.hpp>

namespace loom::testing {

/// The shared log of hook calls.
struct CallLog {
  std::vector<std::string> calls;
  void add(std::string s) { calls.push_back(std::move(s)); }
  std::size_t count(std::string_view s) const {
    std::size_t n = 0;
    for (auto& c : calls) n += (c == s);
    return n;
  }
};

/// Logs "<name> enter" on construction and "<name> exit" on destruction.
class [[nodiscard]] RecordingGuard {
 public:
  RecordingGuard(CallLog* log, std::string name) : log_(log), name_(std::move(name)) {
    log_->add(name_ + " enter");
  }
  RecordingGuard(const RecordingGuard&) = delete;
  RecordingGuard& operator=(const RecordingGuard&) = delete;
  ~RecordingGuard() { log_->add(name_ + " exit"); }

 private:
  CallLog* log_;
  std::string name_;
};

/// A precision policy that overrides every member and records each call.
struct RecordingPrecision : precision::Defaults<RecordingPrecision> {
  CallLog* log;
  explicit RecordingPrecision(CallLog* l) : log(l) {}

  static constexpr std::string_view precision() { return "recording"; }
  RecordingGuard forward_context(c10::DeviceType dt) const {
    return {log, "forward_context(" + c10::DeviceTypeName(dt, true) + ")"};
  }
  RecordingGuard tensor_init_context() const { return {log, "tensor_init_context"}; }
  RecordingGuard module_init_context() const { return {log, "module_init_context"}; }
  void convert_module(torch::nn::Module&) const { log->add("convert_module"); }
  at::Tensor convert_input(const at::Tensor& t) const {
    log->add("convert_input");
    return t;
  }
  at::Tensor convert_output(const at::Tensor& t) const {
    log->add("convert_output");
    return t;
  }
  at::Tensor pre_backward(const at::Tensor& loss, torch::nn::Module&) {
    log->add("pre_backward");
    return loss * 2;  // backward must use this result
  }
  void backward(const at::Tensor& loss, torch::nn::Module&) {
    log->add("backward");
    loss.backward();
  }
  at::Tensor post_backward(const at::Tensor& loss, torch::nn::Module&) {
    log->add("post_backward");
    return loss.detach();
  }
  bool optimizer_step(torch::optim::Optimizer& o) {
    log->add("optimizer_step");
    o.step();
    return true;
  }
  std::vector<at::Tensor> main_params(torch::optim::Optimizer& o) const {
    log->add("main_params");
    return Defaults::main_params(o);
  }
  StateDict state_dict() const {
    log->add("precision.state_dict");
    return {{"calls", static_cast<int64_t>(log->calls.size())}};
  }
  void load_state_dict(const StateDict& sd) {
    log->add("precision.load_state_dict(" + std::to_string(sd.size()) + ")");
  }
  void unscale_gradients(torch::optim::Optimizer&) { log->add("unscale_gradients"); }
  double loss_scale() const {
    log->add("loss_scale");
    return 1.0;
  }
  void teardown() { log->add("teardown"); }
};

/// A CPU device policy that overrides every member and records each call.
struct RecordingDevice : device::Defaults<RecordingDevice> {
  CallLog* log;
  explicit RecordingDevice(CallLog* l) : log(l) {}

  static constexpr c10::DeviceType device_type() { return c10::kCPU; }
  static constexpr std::string_view name() { return "recording"; }
  static constexpr std::string_view ddp_backend() { return "gloo"; }
  void prepare() { log->add("prepare"); }
  void module_to_device(torch::nn::Module& m) {
    log->add("module_to_device");
    Defaults::module_to_device(m);
  }
  at::Tensor tensor_to_device(const at::Tensor& t) const {
    log->add("tensor_to_device");
    return t;
  }
  torch::optim::Optimizer& optimizer_to_device(torch::optim::Optimizer& o) {
    log->add("optimizer_to_device");
    return o;
  }
  template <class Precision>
  auto precision_context(Precision& p) const {
    log->add("precision_context");
    return p.forward_context(device_type());
  }
  StateDict state_dict() const {
    log->add("device.state_dict");
    return {{"seen", std::string("yes")}};
  }
  void load_state_dict(const StateDict& sd) {
    log->add("device.load_state_dict(" + std::to_string(sd.size()) + ")");
  }
  void teardown() { log->add("device.teardown"); }
};

}  // namespace loom::testing
