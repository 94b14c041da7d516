// expect-error: Precision does not model PrecisionPolicy: it lacks `loom::StateDict state_dict\(\) const`
#include <loom/device/cpu.hpp>
#include <loom/precision/defaults.hpp>
#include <loom/runtime.hpp>
// A custom policy written without the Defaults base forgets one member.
struct Custom {
  static constexpr std::string_view precision() { return "custom"; }
  loom::NullGuard forward_context(c10::DeviceType) { return {}; }
  loom::NullGuard tensor_init_context() { return {}; }
  loom::NullGuard module_init_context() { return {}; }
#if !defined(LOOM_FAIL) || 1
  void convert_module(torch::nn::Module&) {}
#endif
  at::Tensor convert_input(const at::Tensor& t) { return t; }
  at::Tensor convert_output(const at::Tensor& t) { return t; }
  at::Tensor pre_backward(const at::Tensor& t, torch::nn::Module&) { return t; }
  void backward(const at::Tensor& t, torch::nn::Module&) { t.backward(); }
  at::Tensor post_backward(const at::Tensor& t, torch::nn::Module&) { return t; }
#if !defined(LOOM_FAIL) || 1
  bool optimizer_step(torch::optim::Optimizer&) { return true; }
#endif
  std::vector<at::Tensor> main_params(torch::optim::Optimizer&) { return {}; }
  void unscale_gradients(torch::optim::Optimizer&) {}
  double clip_gradients(torch::optim::Optimizer&, double, loom::precision::ClipAlgorithm, double) {
    return 0.0;
  }
#if !defined(LOOM_FAIL) || 0
  loom::StateDict state_dict() const { return {}; }
#endif
  void load_state_dict(const loom::StateDict&) {}
  void teardown() {}
};
using R = loom::Runtime<loom::device::Cpu, Custom>;
static_assert(sizeof(R) > 0);
