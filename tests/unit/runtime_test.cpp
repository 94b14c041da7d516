// loom::Runtime: the order of the hooks (Lightning Fabric's), state, and use from templates.
#include <string>
#include <vector>

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include "support/catch.hpp"

#include <loom/loom.hpp>

#include "support/recording.hpp"

using loom::testing::CallLog;
using loom::testing::RecordingDevice;
using loom::testing::RecordingPrecision;
using Recorded = loom::Runtime<RecordingDevice, RecordingPrecision>;
using Strings = std::vector<std::string>;

namespace {

/// A module whose forward writes into the log, so the call shows up between the hooks.
struct LoggingLinearImpl : torch::nn::Module {
  CallLog* log;
  torch::nn::Linear inner{nullptr};
  explicit LoggingLinearImpl(CallLog* l) : log(l) {
    inner = register_module("inner", torch::nn::Linear(2, 1));
  }
  at::Tensor forward(const at::Tensor& x) {
    log->add("module.forward");
    return inner->forward(x);
  }
};
TORCH_MODULE(LoggingLinear);

/// A user's generic training function: takes any runtime.
template <class RT>
float train(RT& rt, torch::nn::Sequential& model, torch::optim::Optimizer& opt, int steps) {
  auto x = rt.to_device(at::randn({64, 4}));
  auto y = rt.to_device(x.sum(1, true));
  float last = 0;
  for (int i = 0; i < steps; ++i) {
    at::Tensor out = rt.forward(model, x);
    auto loss = torch::nn::functional::mse_loss(out, y);
    last = rt.backward(loss, model).template item<float>();
    rt.optimizer_step(opt);
    opt.zero_grad();
  }
  return last;
}

}  // namespace

TEST_CASE("setup converts the module, then moves it, then the optimizer", "[runtime][order]") {
  CallLog log;
  Recorded rt{RecordingDevice(&log), RecordingPrecision(&log)};
  torch::nn::Linear model(2, 1);
  torch::optim::SGD opt(model->parameters(), 0.1);
  rt.setup(model, opt);
  CHECK((log.calls ==
         Strings{"prepare", "convert_module", "module_to_device", "optimizer_to_device"}));
}

TEST_CASE("forward converts inputs, calls inside the scope, converts outputs after it",
          "[runtime][order]") {
  CallLog log;
  Recorded rt{RecordingDevice(&log), RecordingPrecision(&log)};
  LoggingLinear model(&log);
  rt.setup(model);
  log.calls.clear();
  auto out = rt.forward(model, at::ones({3, 2}));
  CHECK((out.sizes() == at::IntArrayRef{3, 1}));
  CHECK((log.calls == Strings{"convert_input", "precision_context", "forward_context(cpu) enter",
                              "module.forward", "forward_context(cpu) exit", "convert_output"}));
}

TEST_CASE("forward converts every tensor of nested arguments", "[runtime][order]") {
  CallLog log;
  Recorded rt{RecordingDevice(&log), RecordingPrecision(&log)};
  auto fn = [](const std::tuple<at::Tensor, at::Tensor>& xy, int k) {
    return std::make_pair(std::get<0>(xy) * k, std::get<1>(xy));
  };
  torch::nn::Linear model(2, 1);
  rt.setup(model);  // a callable runs after the runtime's setup, as a module does
  log.calls.clear();
  auto out = rt.forward(fn, std::make_tuple(at::ones({1}), at::ones({1})), 3);
  CHECK(out.first.item<float>() == 3.f);
  CHECK(log.count("convert_input") == 2);
  CHECK(log.count("convert_output") == 2);
}

TEST_CASE("forward before setup is an error in one process too", "[runtime][order]") {
  loom::Runtime<loom::Cpu, loom::Fp32> rt;
  torch::nn::Linear model(2, 1);
  CHECK_THROWS_WITH(rt.forward(model, at::ones({3, 2})),
                    Catch::Equals("loom::Runtime::forward: forward before setup; call "
                                  "rt.setup(model) or rt.setup(model, optimizer) first (it "
                                  "converts the module, moves it to the device and hands it to "
                                  "the strategy)"));
  rt.setup(model);
  CHECK(rt.forward(model, at::ones({3, 2})).sizes() == at::IntArrayRef{3, 1});
}

TEST_CASE("backward runs pre_backward, backward, post_backward on pre_backward's result",
          "[runtime][order]") {
  CallLog log;
  Recorded rt{RecordingDevice(&log), RecordingPrecision(&log)};
  torch::nn::Linear model(2, 1);
  torch::optim::SGD opt(model->parameters(), 0.1);
  auto x = at::ones({1, 2});
  auto loss = model->forward(x).sum();
  auto returned = rt.backward(loss, model);
  CHECK((log.calls == Strings{"pre_backward", "backward", "post_backward"}));
  // RecordingPrecision doubles the loss in pre_backward: the gradient shows it was used.
  CHECK(model->weight.grad().equal(at::full({1, 2}, 2.0)));
  CHECK(returned.item<float>() == Approx(2 * loss.item<float>()));
  CHECK_FALSE(returned.requires_grad());
  CHECK(rt.optimizer_step(opt));
  CHECK(log.calls.back() == "optimizer_step");
}

TEST_CASE("the runtime's contexts come from the precision policy", "[runtime][order]") {
  CallLog log;
  Recorded rt{RecordingDevice(&log), RecordingPrecision(&log)};
  { [[maybe_unused]] auto g = rt.module_init_context(); }
  { [[maybe_unused]] auto g = rt.tensor_init_context(); }
  { [[maybe_unused]] auto g = rt.forward_context(); }
  CHECK((log.calls == Strings{"module_init_context enter", "module_init_context exit",
                              "tensor_init_context enter", "tensor_init_context exit",
                              "precision_context", "forward_context(cpu) enter",
                              "forward_context(cpu) exit"}));
}

TEST_CASE("state_dict holds both policies' state and the precision's name", "[runtime][state]") {
  CallLog log;
  Recorded rt{RecordingDevice(&log), RecordingPrecision(&log)};
  auto sd = rt.state_dict();
  REQUIRE(sd.size() == 3);
  CHECK(sd.at("precision").toStringRef() == "recording");
  CHECK(sd.at("device.seen").toStringRef() == "yes");
  CHECK(sd.at("precision.calls").toInt() == 2);  // device.state_dict ran first
  rt.load_state_dict(sd);
  CHECK((log.calls == Strings{"device.state_dict", "precision.state_dict",
                              "device.load_state_dict(1)", "precision.load_state_dict(1)"}));
  log.calls.clear();
  rt.teardown();
  CHECK((log.calls == Strings{"teardown", "device.teardown"}));  // every policy's, device's too
}

namespace {
/// A one-process strategy whose no_sync() guard and backward are logged.
struct SyncLoggingStrategy : loom::dist::Defaults<SyncLoggingStrategy> {
  loom::testing::CallLog* log;
  explicit SyncLoggingStrategy(loom::testing::CallLog* l) : log(l) {}
  static constexpr std::string_view strategy() { return "sync-logging"; }
  loom::testing::RecordingGuard no_sync() { return {log, "no_sync"}; }
  template <class Step>
  void backward(const at::Tensor&, Step&& step) {
    log->add("backward");
    step();
  }
};
}  // namespace

TEST_CASE("no_backward_sync holds the strategy's no_sync guard only when enabled",
          "[runtime][order]") {
  loom::testing::CallLog log;
  loom::Runtime<loom::Cpu, loom::Fp32, SyncLoggingStrategy> rt{loom::Cpu{}, loom::Fp32{},
                                                               SyncLoggingStrategy(&log)};
  torch::nn::Linear model(2, 1);
  CHECK_THROWS_WITH(rt.no_backward_sync(model),
                    Catch::StartsWith("loom::Runtime::no_backward_sync: no_backward_sync before "
                                      "setup; call rt.setup(model)"));
  rt.setup(model);
  const auto x = at::ones({4, 2});
  // Four micro-batches: the first three inside the guard, the last one synchronizes.
  for (int i = 0; i < 4; ++i) {
    auto scope = rt.no_backward_sync(model, i < 3);
    CHECK(scope.engaged() == (i < 3));
    rt.backward(rt.forward(model, x).sum(), model);
  }
  const std::vector<std::string> expected{
      "no_sync enter", "backward",      "no_sync exit", "no_sync enter", "backward",
      "no_sync exit",  "no_sync enter", "backward",     "no_sync exit",  "backward"};
  CHECK(log.calls == expected);
  // The default (SingleProcess) guard is a NullGuard: accumulation is plain summation.
  loom::Runtime<loom::Cpu, loom::Fp32> one;
  torch::nn::Linear m(2, 1);
  one.setup(m);
  {
    auto scope = one.no_backward_sync(m);
    CHECK(scope.engaged());
    one.backward(one.forward(m, x).sum(), m);
  }
  one.backward(one.forward(m, x).sum(), m);
  CHECK(m->weight.grad().equal(at::full({1, 2}, 8.0)));
}

TEST_CASE("load_state_dict refuses another precision's checkpoint", "[runtime][state]") {
  loom::Runtime<loom::Cpu, loom::Fp32> rt;
  auto sd = rt.state_dict();
  CHECK(sd.size() == 2);  // "precision" and the CPU generator's "device.torch"
  CHECK(sd.count("device.torch") == 1);
  CHECK_NOTHROW(rt.load_state_dict(sd));
  sd["precision"] = std::string("16-mixed");
  CHECK_THROWS_WITH(rt.load_state_dict(sd),
                    Catch::Matchers::Contains("saved with precision \"16-mixed\"") &&
                        Catch::Matchers::Contains("uses \"32-true\""));
  CHECK_THROWS_WITH(
      rt.load_state_dict({}),
      Catch::Matchers::Equals("loom::Runtime::load_state_dict: missing key \"precision\""));
  CHECK_THROWS_WITH(
      rt.load_state_dict({{"precision", std::string("32-true")}, {"x", 1}}),
      Catch::Matchers::Equals("loom::Runtime::load_state_dict: unexpected key(s) \"x\""));
  CHECK_THROWS_WITH(
      rt.load_state_dict({{"precision", std::string("32-true")}, {"device.rng", 1}}),
      Catch::Matchers::Equals("loom::device::Cpu::load_state_dict: unexpected key(s) \"rng\""));
}

TEST_CASE("a generic training function takes the runtime as a template parameter", "[runtime]") {
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(4, 16), torch::nn::Tanh(),
                              torch::nn::Linear(16, 1));
  torch::optim::Adam opt(model->parameters(), 0.01);
  loom::Runtime<loom::Cpu, loom::Fp32> rt;
  rt.setup(model, opt);
  auto first = train(rt, model, opt, 1);
  auto last = train(rt, model, opt, 200);
  CHECK(last < first * 0.05f);
}

TEST_CASE("a loom step is bitwise equal to the hand-written LibTorch step", "[runtime][parity]") {
  auto make = [] {
    torch::manual_seed(7);
    return torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::ReLU(),
                                 torch::nn::Linear(8, 1));
  };
  auto a = make(), b = make();
  torch::optim::Adam oa(a->parameters(), 0.01), ob(b->parameters(), 0.01);
  loom::Runtime<loom::Cpu, loom::Fp32> rt;
  rt.setup(a, oa);
  torch::manual_seed(3);
  auto x = at::randn({16, 4}), y = at::randn({16, 1});
  for (int i = 0; i < 10; ++i) {
    auto la = torch::nn::functional::mse_loss(rt.forward(a, rt.to_device(x)), y);
    rt.backward(la, a);
    rt.optimizer_step(oa);
    oa.zero_grad();
    torch::nn::functional::mse_loss(b->forward(x), y).backward();
    ob.step();
    ob.zero_grad();
  }
  auto pa = a->parameters(), pb = b->parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) CHECK(pa[i].equal(pb[i]));
}
