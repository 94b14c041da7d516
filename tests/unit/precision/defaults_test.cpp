// precision::Defaults<Self>: what a policy inherits calls the policy's own members (CRTP), and
// loom::is_default tells an override from an inherited default.
#include <string>
#include <vector>

#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include "support/catch.hpp"

#include <loom/loom.hpp>

#include "support/recording.hpp"
#include "support/warnings.hpp"

using loom::testing::CallLog;
using loom::testing::RecordingDevice;
using loom::testing::RecordingPrecision;
using Strings = std::vector<std::string>;

namespace {

/// Master weights in a policy of its own: only the first parameter is "main", so clipping
/// must touch that one alone.
struct FirstParamOnly : loom::precision::Defaults<FirstParamOnly> {
  static constexpr std::string_view precision() { return "first-param-only"; }
  std::vector<at::Tensor> main_params(torch::optim::Optimizer& o) const {
    return {o.param_groups().at(0).params().at(0)};
  }
};

/// Means to override convert_input, but misspells it: the default stays.
struct Misspelt : loom::precision::Defaults<Misspelt> {
  static constexpr std::string_view precision() { return "misspelt"; }
  at::Tensor convert_inputs(const at::Tensor& t) const { return t.to(c10::kBFloat16); }
};

void fill_grads(torch::nn::Linear& model, float value) {
  for (auto& p : model->parameters()) p.mutable_grad() = torch::full_like(p, value);
}

}  // namespace

TEST_CASE("the inherited clip_gradients unscales and clips the policy's own main_params",
          "[precision][defaults]") {
  CallLog log;
  loom::Runtime<RecordingDevice, RecordingPrecision> rt{RecordingDevice(&log),
                                                        RecordingPrecision(&log)};
  torch::nn::Linear model(3, 2);
  torch::optim::SGD opt(model->parameters(), 0.1);
  fill_grads(model, 1.0f);
  log.calls.clear();
  rt.clip_gradients(opt, 1.0);
  CHECK((log.calls == Strings{"unscale_gradients", "main_params"}));
  log.calls.clear();
  rt.clip_gradients_by_value(opt, 0.5);
  CHECK((log.calls == Strings{"unscale_gradients", "main_params"}));
  log.calls.clear();
  rt.clip_gradients(opt, 0.0);  // clips nothing, asks nothing
  CHECK(log.calls.empty());
}

TEST_CASE("an overridden main_params decides which gradients are clipped",
          "[precision][defaults]") {
  loom::Runtime<loom::Cpu, FirstParamOnly> rt;
  torch::nn::Linear model(3, 2);  // weight (2, 3), bias (2)
  torch::optim::SGD opt(model->parameters(), 0.1);
  fill_grads(model, 4.0f);
  rt.clip_gradients_by_value(opt, 0.5);
  CHECK(model->weight.grad().max().item<float>() == 0.5f);  // main: clipped
  CHECK(model->bias.grad().min().item<float>() == 4.0f);    // not main: untouched
  fill_grads(model, 4.0f);
  double norm = rt.clip_gradients(opt, 1.0).value();
  CHECK(norm == Approx(4.0 * std::sqrt(6.0)));  // the weight's 6 elements only
  CHECK(model->bias.grad().min().item<float>() == 4.0f);
}

TEST_CASE("is_default tells an inherited member from an override", "[precision][defaults]") {
  STATIC_REQUIRE(loom::is_default(&Misspelt::convert_input));  // the misspelling is caught
  STATIC_REQUIRE(loom::is_default(&FirstParamOnly::clip_gradients));
  STATIC_REQUIRE_FALSE(loom::is_default(&FirstParamOnly::main_params));
  STATIC_REQUIRE_FALSE(loom::is_default(&RecordingPrecision::convert_input));
  STATIC_REQUIRE(loom::is_default(&loom::Fp32::optimizer_step));
  // A member of an intermediate base (Uniform, Mixed) is the shipped policy's own.
  STATIC_REQUIRE_FALSE(loom::is_default(&loom::Bf16True::convert_input));
  STATIC_REQUIRE(loom::is_default(&loom::Bf16True::optimizer_step));
  STATIC_REQUIRE_FALSE(loom::is_default(&loom::Fp16Mixed::backward));
  // Devices too.
  STATIC_REQUIRE(loom::is_default(&loom::Cpu::tensor_to_device));
  STATIC_REQUIRE_FALSE(loom::is_default(&loom::Cuda::tensor_to_device));
  STATIC_REQUIRE_FALSE(loom::is_default(&RecordingDevice::prepare));
}

TEST_CASE("loss_scale is 1 without a scaler and the scaler's scale under 16-mixed",
          "[precision][defaults]") {
  CHECK(loom::Runtime<loom::Cpu, loom::Fp32>().loss_scale() == 1.0);
  CHECK(loom::Runtime<loom::Cpu, loom::Bf16Mixed>().loss_scale() == 1.0);
  CHECK(loom::Runtime<loom::Cpu, loom::Fp16True>().loss_scale() == 1.0);
  loom::Runtime<loom::Cpu, loom::Fp16Mixed> rt(loom::Cpu(),
                                               loom::Fp16Mixed({.init_scale = 1024.0}));
  CHECK(rt.loss_scale() == 1024.0);
}

TEST_CASE("with_runtime and with_precision pass the policies' options on", "[precision][select]") {
  loom::RuntimeOptions options;
  options.precision.grad_scaler.init_scale = 8.0;
  auto scale = [](auto& rt) { return rt.loss_scale(); };
  CHECK(loom::with_runtime("cpu", "16-mixed", scale, options) == 8.0);
  CHECK(loom::with_runtime("cpu", "bf16-mixed", scale, options) == 1.0);
  CHECK(loom::with_runtime("cpu", "16-mixed", scale) == 65536.0);
  auto scaler_scale = [](auto policy) { return policy.loss_scale(); };
  CHECK(loom::with_precision("16-mixed", scaler_scale, {.grad_scaler = {.init_scale = 4.0}}) ==
        4.0);
  CHECK(loom::with_precision(16, scaler_scale, {.grad_scaler = {.init_scale = 2.0}}) == 2.0);
}

TEST_CASE("fp16 precisions warn once on the CPU, naming bf16-mixed", "[precision][defaults]") {
  loom::testing::WarningCatcher w;
  loom::Runtime<loom::Cpu, loom::Fp16Mixed> rt;
  torch::nn::Linear model(3, 2);
  rt.setup(model);
  for (int i = 0; i < 3; ++i) (void)rt.forward(model, at::randn({4, 3}));
  loom::Runtime<loom::Cpu, loom::Fp16True> rt16;
  { [[maybe_unused]] auto g = rt16.forward_context(); }
  int fp16 = 0;
  for (auto& m : w.messages) fp16 += m.find("bf16-mixed") != std::string::npos;
  CHECK(fp16 == 1);
  REQUIRE(!w.messages.empty());
  CHECK_THAT(w.messages.front(), Catch::Matchers::Contains("\"16-mixed\" on the CPU") &&
                                     Catch::Matchers::Contains("docs/precision.md"));
  // bf16-mixed says nothing.
  loom::testing::WarningCatcher quiet;
  loom::Runtime<loom::Cpu, loom::Bf16Mixed> bf;
  { [[maybe_unused]] auto g = bf.forward_context(); }
  CHECK(quiet.messages.empty());
}
