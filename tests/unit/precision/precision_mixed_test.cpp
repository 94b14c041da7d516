// Mixed precision: the autocast guard (device binding, nesting, the cast cache, no-grad
// forwards), 16-mixed's loss scaling through the runtime (scale once, skip on inf/nan, clipping,
// accumulation, state), and choosing policies by Lightning's names.
#include <memory>
#include <string>
#include <vector>

#include <ATen/autocast_mode.h>
#include <c10/util/Exception.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/sgd.h>
#include "support/catch.hpp"
#include "support/warnings.hpp"

#include <loom/loom.hpp>

using namespace loom;
using at::autocast::get_autocast_dtype;
using at::autocast::is_autocast_cache_enabled;
using at::autocast::is_autocast_enabled;

namespace {

using loom::testing::WarningCatcher;

/// Sets a Linear's weights to `w` and its bias to 0, so expected gradients are round numbers.
void fill(torch::nn::Linear& model, double w) {
  torch::NoGradGuard ng;
  model->weight.fill_(w);
  model->bias.fill_(0.0);
}

template <class P>
std::string name_of(const P&) {
  return std::string(P::precision());
}

/// An optimizer that says it unscales its gradients itself.
struct SelfUnscalingSGD : torch::optim::SGD, amp::SelfUnscalingOptimizer {
  using torch::optim::SGD::SGD;
};

}  // namespace

TEST_CASE("Bf16Mixed's forward context is CPU autocast in bf16, restored after",
          "[precision][autocast]") {
  Runtime<Cpu, Bf16Mixed> rt;
  CHECK_FALSE(is_autocast_enabled(c10::kCPU));
  {
    [[maybe_unused]] auto g = rt.forward_context();
    CHECK(is_autocast_enabled(c10::kCPU));
    CHECK(get_autocast_dtype(c10::kCPU) == at::kBFloat16);
    CHECK_FALSE(is_autocast_enabled(c10::kCUDA));  // bound to the runtime's device only
    auto y = at::matmul(at::ones({2, 2}), at::ones({2, 2}));
    CHECK(y.scalar_type() == at::kBFloat16);
  }
  CHECK_FALSE(is_autocast_enabled(c10::kCPU));
  Runtime<Cpu, Fp32> fp32;
  {
    [[maybe_unused]] auto g = fp32.forward_context();
    CHECK_FALSE(is_autocast_enabled(c10::kCPU));
  }
}

TEST_CASE("Fp16Mixed on the CPU is fp16 autocast, no bf16 fall-back", "[precision][autocast]") {
  Runtime<Cpu, Fp16Mixed> rt;
  [[maybe_unused]] auto g = rt.forward_context();
  CHECK(is_autocast_enabled(c10::kCPU));
  CHECK(get_autocast_dtype(c10::kCPU) == at::kHalf);
  CHECK(at::matmul(at::ones({2, 2}), at::ones({2, 2})).scalar_type() == at::kHalf);
}

TEST_CASE("nested guards: an fp32 island, the cache flag, clearing only at depth 0",
          "[precision][autocast]") {
  const auto saved_dtype = get_autocast_dtype(c10::kCPU);
  at::autocast::set_autocast_cache_enabled(false);  // the guard must restore even this
  {
    amp::AutocastGuard outer(c10::kCPU, at::kBFloat16);
    CHECK(is_autocast_cache_enabled());          // the forward guard keeps the cache on
    auto w = at::ones({2, 2}).requires_grad_();  // a leaf weight: cached when cast
    auto a = at::matmul(at::ones({2, 2}), w);
    CHECK(a.scalar_type() == at::kBFloat16);
    {
      amp::AutocastGuard island(c10::kCPU, at::kHalf, /*enabled=*/false);
      CHECK_FALSE(is_autocast_enabled(c10::kCPU));
      CHECK(at::matmul(at::ones({2, 2}), at::ones({2, 2})).scalar_type() == at::kFloat);
    }
    CHECK(is_autocast_enabled(c10::kCPU));
    CHECK(get_autocast_dtype(c10::kCPU) == at::kBFloat16);
    CHECK(is_autocast_cache_enabled());
  }
  CHECK_FALSE(is_autocast_enabled(c10::kCPU));
  CHECK(get_autocast_dtype(c10::kCPU) == saved_dtype);
  CHECK_FALSE(is_autocast_cache_enabled());
  at::autocast::set_autocast_cache_enabled(true);
  // Depth is back to 0: a fresh outermost guard increments to 1.
  {
    amp::AutocastGuard g(c10::kCPU, at::kBFloat16);
    CHECK(at::autocast::decrement_nesting() == 0);
    at::autocast::increment_nesting();
  }
}

TEST_CASE("the autocast guard checks its arguments before changing anything",
          "[precision][autocast]") {
  CHECK_THROWS_WITH(amp::AutocastGuard(c10::kCPU, at::kFloat),
                    Catch::Contains("kHalf or kBFloat16"));
  if (!loom::detail::cuda_usable()) {
    CHECK_THROWS_WITH(amp::AutocastGuard(c10::kCUDA, at::kHalf),
                      Catch::Contains("needs a usable CUDA device"));
  }
  CHECK_FALSE(is_autocast_enabled(c10::kCPU));
  CHECK_FALSE(is_autocast_enabled(c10::kCUDA));
}

TEST_CASE("inside bf16 autocast: no-grad forwards do not break the graph",
          "[precision][autocast]") {
  torch::nn::Linear model(4, 4);
  Runtime<Cpu, Bf16Mixed> rt;
  at::Tensor loss;
  {
    [[maybe_unused]] auto g = rt.forward_context();
    {
      torch::NoGradGuard ng;
      model->forward(at::ones({2, 4}));
    }
    {
      c10::InferenceMode im;
      model->forward(at::ones({2, 4}));
    }
    loss = model->forward(at::ones({2, 4})).float_power(2).sum();
  }
  REQUIRE(loss.grad_fn() != nullptr);
  loss.backward();
  CHECK(model->weight.grad().defined());
}

TEST_CASE("Bf16Mixed integration: fp32 weights and grads, bf16 inside, fp32 out",
          "[precision][bf16-mixed]") {
  Runtime<Cpu, Bf16Mixed> rt;
  torch::manual_seed(0);
  torch::nn::Linear model(4, 2);
  torch::optim::SGD opt(model->parameters(), 0.1);
  rt.setup(model, opt);
  CHECK(model->weight.scalar_type() == at::kFloat);
  c10::ScalarType input = at::kFloat, output = at::kFloat;
  bool autocast_on = false;
  auto out = rt.forward(
      [&](const at::Tensor& x) {
        input = x.scalar_type();
        autocast_on = is_autocast_enabled(c10::kCPU);
        auto y = model->forward(x);
        output = y.scalar_type();
        return y;
      },
      at::randn({8, 4}));
  CHECK(input == at::kBFloat16);
  CHECK(autocast_on);
  CHECK(output == at::kBFloat16);
  CHECK(out.scalar_type() == at::kFloat);
  rt.backward(out.pow(2).mean(), model);
  CHECK(model->weight.grad().scalar_type() == at::kFloat);
  auto before = model->weight.clone();
  CHECK(rt.optimizer_step(opt));
  CHECK_FALSE(model->weight.equal(before));
  opt.zero_grad();
  CHECK(rt.state_dict().size() == 2);  // precision, device.torch: no scaler state
}

TEST_CASE("a backward after a direct model call under a mixed precision is warned about, once",
          "[precision][bf16-mixed]") {
  torch::manual_seed(0);
  torch::nn::Linear model(4, 2);
  torch::optim::SGD opt(model->parameters(), 0.1);
  const auto x = at::randn({8, 4});
  auto step = [&](auto& rt, bool through_rt) {
    auto out = through_rt ? rt.forward(model, x) : model->forward(x);  // direct: no autocast
    rt.backward(out.pow(2).mean(), model);
    rt.optimizer_step(opt);
    opt.zero_grad();
  };
  {
    Runtime<Cpu, Bf16Mixed> rt;
    rt.setup(model, opt);
    WarningCatcher w;
    step(rt, true);
    CHECK(w.messages.empty());  // through rt.forward: silent
    step(rt, false);
    REQUIRE(w.messages.size() == 1);
    CHECK(w.messages[0].find("loom::Runtime::backward: no rt.forward ran since the last "
                             "optimizer step") != std::string::npos);
    CHECK(w.messages[0].find("bf16-mixed's autocast was off") != std::string::npos);
    step(rt, false);
    CHECK(w.messages.size() == 1);  // once
  }
  {
    Runtime<Cpu, Bf16Mixed> rt;
    rt.setup(model, opt);
    WarningCatcher w;
    {
      auto scope = rt.forward_context();  // autocast on: a forward inside it counts
      auto out = model->forward(x);
      rt.backward(out.to(at::kFloat).pow(2).mean(), model);
    }
    CHECK(w.messages.empty());
  }
  {
    Runtime<Cpu, Fp32> rt;  // no autocast to miss: silent
    rt.setup(model, opt);
    WarningCatcher w;
    step(rt, false);
    CHECK(w.messages.empty());
  }
}

TEST_CASE("Fp16Mixed scales the loss once, steps and updates once", "[precision][fp16-mixed]") {
  Runtime<Cpu, Fp16Mixed> rt;
  torch::manual_seed(0);
  torch::nn::Linear model(3, 1), twin(3, 1);
  {
    torch::NoGradGuard ng;
    twin->weight.copy_(model->weight);
    twin->bias.copy_(model->bias);
  }
  torch::optim::SGD opt(model->parameters(), 0.1);
  rt.setup(model, opt);
  auto x = at::randn({4, 3});
  auto loss = model->forward(x).sum();
  rt.backward(loss, model);
  twin->forward(x).sum().backward();
  const double scale = rt.precision().scaler().get_scale();
  CHECK(scale == 65536.0);
  CHECK(model->weight.grad().allclose(twin->weight.grad() * scale));  // grads = scale x true
  CHECK(rt.optimizer_step(opt));
  CHECK(rt.precision().scaler().stage(opt) == amp::GradScaler::Stage::Ready);  // updated once
  CHECK(rt.precision().scaler().get_growth_tracker() == 1);
  // The step used the unscaled gradients.
  auto expected = twin->weight.detach() - 0.1 * twin->weight.grad();
  CHECK(model->weight.allclose(expected));
}

TEST_CASE("Fp16Mixed skips a step with inf gradients and backs the scale off",
          "[precision][fp16-mixed]") {
  Runtime<Cpu, Fp16Mixed> rt;
  torch::nn::Linear model(3, 1);
  torch::optim::SGD opt(model->parameters(), 0.1);
  rt.setup(model, opt);
  auto loss = model->forward(at::ones({1, 3})).sum() * std::numeric_limits<float>::infinity();
  rt.backward(loss, model);
  auto before = model->weight.clone();
  CHECK_FALSE(rt.optimizer_step(opt));
  CHECK(model->weight.equal(before));
  CHECK(rt.precision().scaler().get_scale() == 32768.0);
}

TEST_CASE("Fp16Mixed refuses a step after a direct loss.backward()", "[precision][fp16-mixed]") {
  Runtime<Cpu, Fp16Mixed> rt;
  torch::nn::Linear model(2, 1);
  torch::optim::SGD opt(model->parameters(), 0.1);
  model->forward(at::ones({1, 2})).sum().backward();  // not through the runtime: unscaled
  auto before = model->weight.clone();
  CHECK_THROWS_WITH(rt.optimizer_step(opt), Catch::Contains("a direct loss.backward() skips"));
  CHECK(model->weight.equal(before));
}

TEST_CASE("Fp16Mixed refuses LBFGS", "[precision][fp16-mixed]") {
  Runtime<Cpu, Fp16Mixed> rt;
  torch::nn::Linear model(2, 1);
  torch::optim::LBFGS lbfgs(model->parameters());
  rt.backward(model->forward(at::ones({1, 2})).sum(), model);
  CHECK_THROWS_WITH(rt.optimizer_step(lbfgs),
                    "loom: AMP and the LBFGS optimizer are not compatible.");
}

TEST_CASE("clipping: 0 clips nothing, by value or by norm only", "[precision][clip]") {
  Runtime<Cpu, Fp32> rt;
  torch::nn::Linear model(2, 1);
  fill(model, 1.0);
  torch::optim::SGD opt(model->parameters(), 0.1);
  auto grads = [&] {
    opt.zero_grad();
    rt.backward((model->forward(at::full({1, 2}, 3.0)) * 4).sum(), model);  // dw = 12, db = 4
  };
  grads();
  CHECK(rt.clip_gradients(opt, 0.0).value() == 0.0);
  CHECK(model->weight.grad().equal(at::full({1, 2}, 12.0)));
  rt.clip_gradients_by_value(opt, 5.0);
  CHECK(model->weight.grad().equal(at::full({1, 2}, 5.0)));
  CHECK(model->bias.grad().equal(at::full({1}, 4.0)));
  grads();
  double norm = rt.clip_gradients(opt, 1.0).value();
  CHECK(norm == Approx(std::sqrt(12.0 * 12 * 2 + 16)));
  double after = std::sqrt(model->weight.grad().pow(2).sum().item<double>() +
                           model->bias.grad().pow(2).sum().item<double>());
  CHECK(after == Approx(1.0).epsilon(1e-4));
}

TEST_CASE("16-mixed clipping unscales first, once, and refuses self-unscaling optimizers",
          "[precision][clip][fp16-mixed]") {
  Runtime<Cpu, Fp16Mixed> rt(Cpu{}, Fp16Mixed(amp::GradScalerOptions{.init_scale = 1024.0}));
  torch::nn::Linear model(2, 1);
  fill(model, 1.0);
  torch::optim::SGD opt(model->parameters(), 0.1);
  rt.backward((model->forward(at::full({1, 2}, 3.0)) * 4).sum(), model);
  CHECK(model->weight.grad().equal(at::full({1, 2}, 12.0 * 1024)));  // scaled after backward
  rt.unscale_gradients(opt);
  CHECK(rt.precision().scaler().stage(opt) == amp::GradScaler::Stage::Unscaled);
  CHECK(model->weight.grad().equal(at::full({1, 2}, 12.0)));  // true grads
  rt.clip_gradients_by_value(opt, 5.0);                       // no second unscale
  CHECK(model->weight.grad().equal(at::full({1, 2}, 5.0)));
  rt.clip_gradients_by_value(opt, 5.0);  // clipping twice is safe
  CHECK(rt.optimizer_step(opt));
  CHECK(model->weight.equal(at::full({1, 2}, 1.0 - 0.1 * 5.0)));
  CHECK_THROWS_WITH(rt.precision().clip_gradients(opt, 1.0, precision::ClipAlgorithm::Norm),
                    Catch::Contains("needs a backward() through the runtime"));
  CHECK_THROWS_WITH(rt.optimizer_step(opt),
                    Catch::Contains("needs a backward() through the runtime"));

  SelfUnscalingSGD fused(model->parameters(), 0.1);
  rt.backward(model->forward(at::ones({1, 2})).sum(), model);
  CHECK_THROWS_WITH(rt.clip_gradients(fused, 1.0), Catch::Contains("unscales them itself"));
  Runtime<Cpu, Bf16Mixed> bf16;  // no scaler: fine
  CHECK_NOTHROW(bf16.clip_gradients(fused, 1.0));
}

TEST_CASE("16-mixed state round-trips through the runtime and refuses another precision",
          "[precision][fp16-mixed][state]") {
  Runtime<Cpu, Fp16Mixed> rt;
  torch::nn::Linear model(2, 1);
  torch::optim::SGD opt(model->parameters(), 0.1);
  rt.backward(model->forward(at::ones({1, 2})).sum() * std::numeric_limits<float>::infinity(),
              model);
  rt.optimizer_step(opt);
  auto sd = rt.state_dict();
  CHECK(sd.at("precision").toStringRef() == "16-mixed");
  CHECK(sd.at("precision.scale").toDouble() == 32768.0);
  Runtime<Cpu, Fp16Mixed> resumed;
  resumed.load_state_dict(sd);
  CHECK(resumed.precision().scaler().get_scale() == 32768.0);
  Runtime<Cpu, Bf16Mixed> other;
  CHECK_THROWS_WITH(other.load_state_dict(sd),
                    Catch::Contains("saved with precision \"16-mixed\""));
}

TEST_CASE("precision_t maps Lightning's names to policies at compile time", "[precision][select]") {
  STATIC_REQUIRE(std::is_same_v<precision_t<"32-true">, Fp32>);
  STATIC_REQUIRE(std::is_same_v<precision_t<"32">, Fp32>);
  STATIC_REQUIRE(std::is_same_v<precision_t<32>, Fp32>);
  STATIC_REQUIRE(std::is_same_v<precision_t<"64-true">, Fp64>);
  STATIC_REQUIRE(std::is_same_v<precision_t<64>, Fp64>);
  STATIC_REQUIRE(std::is_same_v<precision_t<"16-true">, Fp16True>);
  STATIC_REQUIRE(std::is_same_v<precision_t<"bf16-true">, Bf16True>);
  STATIC_REQUIRE(std::is_same_v<precision_t<"16-mixed">, Fp16Mixed>);
  STATIC_REQUIRE(std::is_same_v<precision_t<"bf16-mixed">, Bf16Mixed>);
  STATIC_REQUIRE(std::is_same_v<precision_t<16>, Fp16Mixed>);
  STATIC_REQUIRE(std::is_same_v<precision_t<"16">, Fp16Mixed>);
  STATIC_REQUIRE(std::is_same_v<precision_t<"bf16">, Bf16Mixed>);
  STATIC_REQUIRE(precision_t<"bf16-mixed">::precision() == "bf16-mixed");
}

TEST_CASE("with_precision dispatches run-time names, aliases warn, unknown names throw",
          "[precision][select]") {
  auto name = [](auto policy) { return name_of(policy); };
  {
    WarningCatcher w;
    CHECK(with_precision("32-true", name) == "32-true");
    CHECK(with_precision("32", name) == "32-true");
    CHECK(with_precision(32, name) == "32-true");
    CHECK(with_precision("64", name) == "64-true");
    CHECK(with_precision(64, name) == "64-true");
    CHECK(with_precision("16-true", name) == "16-true");
    CHECK(with_precision("bf16-true", name) == "bf16-true");
    CHECK(with_precision("16-mixed", name) == "16-mixed");
    CHECK(with_precision("bf16-mixed", name) == "bf16-mixed");
    CHECK(w.messages.empty());  // canonical names are silent
  }
  {
    WarningCatcher w;
    CHECK(with_precision("16", name) == "16-mixed");
    CHECK(with_precision(16, name) == "16-mixed");
    CHECK(with_precision("bf16", name) == "bf16-mixed");
    REQUIRE(w.messages.size() == 3);
    CHECK(w.messages[0].find("use \"16-mixed\"") != std::string::npos);
    CHECK(w.messages[2].find("use \"bf16-mixed\"") != std::string::npos);
  }
  for (auto bad : {"invalid", "8-mixed", "fp16", "BF16-MIXED", ""}) {
    CHECK_THROWS_WITH(with_precision(bad, name),
                      Catch::Contains("unknown precision") && Catch::Contains("\"bf16-mixed\""));
  }
  CHECK_THROWS_WITH(with_precision(1, name), Catch::Contains("unknown precision 1"));
  CHECK_THROWS_WITH(with_precision(12, name), Catch::Contains("unknown precision 12"));
  CHECK_THROWS_WITH(with_precision("transformer-engine", name),
                    Catch::Contains("not supported by loom"));
}

TEST_CASE("16-mixed has the scaler defaults and bf16-mixed has none", "[precision][select]") {
  Fp16Mixed p;
  CHECK(p.scaler().options().init_scale == 65536.0);
  CHECK(p.scaler().options().growth_factor == 2.0);
  CHECK(p.scaler().options().backoff_factor == 0.5);
  CHECK(p.scaler().options().growth_interval == 2000);
  STATIC_REQUIRE_FALSE(std::is_constructible_v<Bf16Mixed, amp::GradScaler>);
}

TEST_CASE("with_runtime builds the Runtime a device and a precision name select",
          "[precision][select]") {
  auto describe = [](auto& rt) {
    return std::string(rt.device().name()) + "/" + std::string(rt.precision_name());
  };
  CHECK(with_runtime("cpu", "bf16-mixed", describe) == "cpu/bf16-mixed");
  CHECK(with_runtime("CPU", "64-true", describe) == "cpu/64-true");
  bool typed = with_runtime("cpu", "16-mixed", [](auto& rt) {
    return std::is_same_v<std::remove_cvref_t<decltype(rt)>, Runtime<Cpu, Fp16Mixed>>;
  });
  CHECK(typed);
  CHECK_THROWS_WITH(with_runtime("magic_device", "32-true", describe),
                    Catch::Contains("magic_device"));
  CHECK_THROWS_WITH(with_runtime("cpu", "fp8", describe),
                    Catch::Contains("unknown precision \"fp8\""));
  if (!Cuda::is_available()) {
    CHECK_THROWS_AS(with_runtime("cuda", "bf16-mixed", describe), loom::Error);
    CHECK(with_runtime("auto", "32-true", describe) == "cpu/32-true");
  }
}

/// A one-process strategy built with an option, move-only as loom::Ddp: what with_runtime's
/// strategy argument moves into the runtime.
struct OptionedStrategy : dist::Defaults<OptionedStrategy> {
  static constexpr std::string_view strategy() { return "optioned"; }
  explicit OptionedStrategy(int option) : option_(std::make_unique<int>(option)) {}
  int option() const { return *option_; }
  std::unique_ptr<int> option_;
};

TEST_CASE("with_runtime compiles only the devices and precisions it is given",
          "[precision][select]") {
  auto describe = [](auto& rt) {
    return std::string(rt.device().name()) + "/" + std::string(rt.precision_name());
  };
  using Cpus = loom::devices<Cpu>;
  using Two = loom::precisions<Fp32, Bf16Mixed>;
  CHECK(with_runtime<Cpus, Two>("cpu", "bf16-mixed", describe) == "cpu/bf16-mixed");
  CHECK(with_runtime<Two, Cpus>("CPU", "32", describe) == "cpu/32-true");
  CHECK(with_runtime<Cpus>("auto", "fp8-mixed", describe) == "cpu/fp8-mixed");  // no CUDA
  CHECK(with_runtime<Two>("cpu", "32-true", describe) == "cpu/32-true");
  {
    WarningCatcher w;  // an alias of an allowed policy still warns
    CHECK(with_runtime<Cpus, Two>("cpu", "bf16", describe) == "cpu/bf16-mixed");
    CHECK(w.messages.size() == 1);
  }
  bool typed = with_runtime<Cpus, Two, SingleProcess>("cpu", "32-true", [](auto& rt) {
    return std::is_same_v<std::remove_cvref_t<decltype(rt)>, Runtime<Cpu, Fp32>>;
  });
  CHECK(typed);
  // A name outside the lists throws, naming those allowed; an unknown name lists them too.
  CHECK_THROWS_WITH((with_runtime<Cpus, Two>("cpu", "16-mixed", describe)),
                    Catch::Equals("loom: precision \"16-mixed\" is not among the precisions "
                                  "compiled in (loom::precisions<...>); allowed: \"32-true\", "
                                  "\"bf16-mixed\" (aliases: 32, \"32\", \"bf16\")"));
  CHECK_THROWS_WITH((with_runtime<Cpus, loom::precisions<Fp16True>>("cpu", "fp16", describe)),
                    Catch::Equals("loom: unknown precision \"fp16\"; allowed: \"16-true\""));
  CHECK_THROWS_WITH((with_runtime<Cpus, Two>("cuda", "32-true", describe)),
                    Catch::Equals("loom: device \"cuda\" is not among the devices compiled in "
                                  "(loom::devices<...>); allowed: \"cpu\" or \"auto\""));
  CHECK_THROWS_WITH(with_runtime<Cpus>("tpu", "32-true", describe),
                    Catch::Equals("loom::device::parse_device: unknown device \"tpu\"; "
                                  "expected \"cpu\" or \"auto\""));
  CHECK_THROWS_WITH((with_runtime<loom::devices<Cuda>, Two>("cpu", "32-true", describe)),
                    Catch::Contains("allowed: \"cuda\", \"gpu\" or \"auto\""));
  auto name = [](auto policy) { return name_of(policy); };
  CHECK_THROWS_WITH(with_precision<Two>(16, name),
                    Catch::Contains("precision \"16\" is not among") &&
                        Catch::Contains("allowed: \"32-true\", \"bf16-mixed\""));
  CHECK_THROWS_WITH(with_precision<Two>(8, name),
                    Catch::Equals("loom: unknown precision 8; allowed: \"32-true\", "
                                  "\"bf16-mixed\" (aliases: 32, \"32\", \"bf16\")"));
  // Without lists, the messages list every name, as before.
  CHECK_THROWS_WITH(with_runtime("cpu", "fp16", describe),
                    Catch::Equals("loom: unknown precision \"fp16\"; allowed: " +
                                  std::string(precision::allowed_names)));
  CHECK_THROWS_WITH(with_runtime("tpu", "32-true", describe),
                    Catch::Equals("loom::device::parse_device: unknown device \"tpu\"; "
                                  "expected \"cpu\", \"cuda\", \"gpu\" or \"auto\""));
  CHECK_THROWS_WITH((with_runtime<Cpus, Two>("cpu", "transformer-engine", describe)),
                    Catch::Contains("not supported by loom"));
}

TEST_CASE("with_runtime moves a strategy instance, built with its options, into the runtime",
          "[precision][select]") {
  auto option = [](auto& rt) { return rt.strategy().option(); };
  CHECK(with_runtime("cpu", "bf16-mixed", option, {}, OptionedStrategy(7)) == 7);
  CHECK(with_runtime<loom::devices<Cpu>, loom::precisions<Fp16Mixed>>(
            "cpu", "16-mixed",
            [](auto& rt) { return rt.strategy().option() * 1000 + int(rt.loss_scale()); },
            {.precision = {.grad_scaler = {.init_scale = 8.0}}}, OptionedStrategy(3)) == 3008);
  OptionedStrategy named(5);
  CHECK(with_runtime<OptionedStrategy>("cpu", "32-true", option, {}, std::move(named)) == 5);
  CHECK(with_runtime<loom::devices<Cpu>, loom::precisions<Fp32>>("cpu", "32-true", [](auto& rt) {
          return std::string(rt.strategy().strategy());
        }) == "single_device");
  // loom::Ddp the same way, its options reaching the runtime's strategy; a type-level check:
  // constructing a Ddp needs the loom::dist library, which these tests do not link.
  using DdpRuntime = Runtime<Cpu, Fp32, loom::Ddp>;
  auto ddp_options = [](DdpRuntime& rt) { return rt.strategy().options().find_unused_parameters; };
  STATIC_REQUIRE(std::is_same_v<decltype(with_runtime<loom::devices<Cpu>, loom::precisions<Fp32>>(
                                    "cpu", "32-true", ddp_options, {}, std::declval<loom::Ddp>())),
                                bool>);
}

TEST_CASE("a bf16-mixed loom loop is bitwise equal to the hand-written autocast loop",
          "[precision][bf16-mixed][parity]") {
  auto make = [] {
    torch::manual_seed(11);
    return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::ReLU(),
                                 torch::nn::Linear(16, 1));
  };
  auto a = make(), b = make();
  torch::optim::SGD oa(a->parameters(), 0.05), ob(b->parameters(), 0.05);
  Runtime<Cpu, Bf16Mixed> rt;
  rt.setup(a, oa);
  torch::manual_seed(5);
  auto x = at::randn({32, 8}), y = at::randn({32, 1});
  for (int i = 0; i < 20; ++i) {
    auto out = rt.forward(a, x);
    rt.backward(torch::nn::functional::mse_loss(out, y), a);
    rt.optimizer_step(oa);
    oa.zero_grad();

    // By hand: cast the input, autocast around the forward, fp32 output, plain backward.
    at::Tensor hand;
    {
      at::autocast::set_autocast_enabled(c10::kCPU, true);
      at::autocast::set_autocast_dtype(c10::kCPU, at::kBFloat16);
      at::autocast::increment_nesting();
      hand = b->forward(x.to(at::kBFloat16));
      if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
      at::autocast::set_autocast_enabled(c10::kCPU, false);
    }
    torch::nn::functional::mse_loss(hand.to(at::kFloat), y).backward();
    ob.step();
    ob.zero_grad();
  }
  auto pa = a->parameters(), pb = b->parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) CHECK(pa[i].equal(pb[i]));
}

TEST_CASE("16-mixed with two accumulated micro-batches unscales their sum once",
          "[precision][fp16-mixed]") {
  Runtime<Cpu, Fp16Mixed> rt(Cpu{}, Fp16Mixed(amp::GradScalerOptions{.init_scale = 256.0}));
  torch::nn::Linear model(2, 1);
  fill(model, 1.0);
  torch::optim::SGD opt(model->parameters(), 0.1);
  rt.backward(model->forward(at::full({1, 2}, 1.0)).sum(), model);  // dw = 1 per element
  rt.backward(model->forward(at::full({1, 2}, 2.0)).sum(), model);  // dw = 2 per element
  CHECK(model->weight.grad().equal(at::full({1, 2}, 3.0 * 256)));
  rt.unscale_gradients(opt);
  CHECK(model->weight.grad().equal(at::full({1, 2}, 3.0)));
  CHECK(rt.optimizer_step(opt));
  CHECK(model->weight.equal(at::full({1, 2}, 1.0 - 0.1 * 3.0)));
}

TEST_CASE("16-mixed steps with no loss skip unscale, step and update alike",
          "[precision][fp16-mixed]") {
  // growth_interval 1: every update after a clean step doubles the scale, so the final scale
  // counts the updates.
  Runtime<Cpu, Fp16Mixed> rt(
      Cpu{}, Fp16Mixed(amp::GradScalerOptions{.init_scale = 8.0, .growth_interval = 1}));
  torch::nn::Linear model(2, 1);
  torch::optim::SGD opt(model->parameters(), 0.01);
  int applied = 0;
  for (int step = 0; step < 5; ++step) {
    bool has_loss = step % 2 == 0;  // a training step that returns no loss on odd batches
    if (!has_loss) continue;
    rt.backward(model->forward(at::ones({1, 2})).sum(), model);
    rt.clip_gradients(opt, 0.5);
    applied += rt.optimizer_step(opt).applied();
    opt.zero_grad();
  }
  CHECK(applied == 3);
  CHECK(rt.precision().scaler().get_scale() == 8.0 * 2 * 2 * 2);  // exactly 3 updates
}

TEST_CASE("two fp32 and two 16-mixed CPU runs are bitwise equal", "[precision][parity]") {
  auto run = [](auto policy) {
    torch::manual_seed(3);
    torch::nn::Linear model(4, 2);
    torch::optim::SGD opt(model->parameters(), 0.1);
    Runtime<Cpu, decltype(policy)> rt(Cpu{}, std::move(policy));
    rt.setup(model, opt);
    for (int i = 0; i < 5; ++i) {
      auto out = rt.forward(model, at::randn({8, 4}));
      rt.backward(out.pow(2).mean(), model);
      rt.optimizer_step(opt);
      opt.zero_grad();
    }
    return at::cat({model->weight.flatten(), model->bias});
  };
  CHECK(run(Fp32{}).equal(run(Fp32{})));
  CHECK(run(Fp16Mixed{}).equal(run(Fp16Mixed{})));
}
