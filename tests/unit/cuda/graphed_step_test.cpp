// loom::cuda::GraphedStep on the CPU: the same step run eagerly over static buffers, equal to
// plain steps bit for bit in 32-true, bf16-mixed and 16-mixed with skipped steps; its errors.
// The capture and replays on a GPU: tests/gpu/graph_cuda_test.cpp.
#include "support/catch.hpp"
#include "support/graphed_step_case.hpp"
#include "support/warnings.hpp"

#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <loom/cuda/graphed_step.hpp>
#include <loom/loom.hpp>

using Catch::Matchers::Contains;

namespace {

template <class Precision>
void check_cpu(Precision precision = Precision(), bool overflow = false) {
  loom::Runtime<loom::Cpu, Precision> a{loom::Cpu{}, precision}, b{loom::Cpu{}, precision};
  const auto graphed = loom::testing::graphed_run(a, true, 30, overflow);
  const auto plain = loom::testing::graphed_run(b, false, 30, overflow);
  CHECK(graphed.captured_at == -1);  // no graph on the CPU
  loom::testing::check_same_run(graphed, plain);
}

}  // namespace

TEST_CASE("GraphedStep on the CPU equals plain steps bit for bit", "[graphed_step]") {
  SECTION("32-true") { check_cpu<loom::Fp32>(); }
  SECTION("bf16-mixed") { check_cpu<loom::Bf16Mixed>(); }
  SECTION("16-mixed, with skipped steps") {
    loom::testing::WarningCatcher quiet;  // fp16 on the CPU warns once
    loom::amp::GradScalerOptions o;
    o.init_scale = 65536.0;
    o.growth_interval = 1000;  // no growth in 30 steps: a lower scale means skipped steps
    loom::Runtime<loom::Cpu, loom::Fp16Mixed> a{loom::Cpu{}, loom::Fp16Mixed(o)},
        b{loom::Cpu{}, loom::Fp16Mixed(o)};
    const auto graphed = loom::testing::graphed_run(a, true, 30, /*overflow=*/true);
    const auto plain = loom::testing::graphed_run(b, false, 30, /*overflow=*/true);
    loom::testing::check_same_run(graphed, plain);
    CHECK(a.precision().scaler().get_scale() == b.precision().scaler().get_scale());
    CHECK(a.precision().scaler().get_scale() < 65536.0);  // steps were skipped
  }
}

TEST_CASE("GraphedStep copies each batch into its static inputs", "[graphed_step]") {
  torch::manual_seed(1);
  torch::nn::Linear m(3, 1);
  loom::optim::SGD opt(m->parameters(), loom::optim::SGDOptions(0.1));
  loom::Runtime<loom::Cpu, loom::Fp32> rt;
  rt.setup(m, opt);
  const at::Tensor x = at::zeros({2, 3});
  std::vector<at::Tensor> seen;
  loom::cuda::GraphedStep step(rt, {x}, {opt}, [&](const std::vector<at::Tensor>& in) {
    CHECK(in[0].is_same(x));                  // the step always sees the static buffer
    CHECK_FALSE(m->weight.grad().defined());  // gradients set to none before each step
    at::Tensor loss = rt.forward(m, in[0]).sum();
    rt.backward(loss, m);
    rt.optimizer_step(opt);
    seen.push_back(in[0].clone());
    return loss.detach();
  });
  step({at::ones({2, 3})});
  step({at::full({2, 3}, 2.0)});
  CHECK(at::equal(seen[0], at::ones({2, 3})));
  CHECK(at::equal(seen[1], at::full({2, 3}, 2.0)));
  CHECK(at::equal(x, at::full({2, 3}, 2.0)));
  CHECK(step.steps() == 2);
  CHECK_FALSE(step.captured());
  CHECK(opt.tensor_lr());  // switched to the lr on the device
  CHECK_THROWS_WITH(step({at::ones({3, 3})}),
                    Contains("batch tensor 0 is [3, 3] Float, its static input [2, 3] Float"));
  CHECK_THROWS_WITH(step({x, x}), Contains("the batch has 2 tensors, the static inputs 1"));
}

TEST_CASE("GraphedStep refuses what a graph cannot replay", "[graphed_step]") {
  torch::nn::Linear m(3, 1);
  loom::optim::SGD fused(m->parameters(), loom::optim::SGDOptions(0.1));
  torch::optim::SGD libtorch(m->parameters(), torch::optim::SGDOptions(0.1));
  auto step = [](const std::vector<at::Tensor>& in) { return in[0]; };
  const std::vector<at::Tensor> x{at::zeros({2, 3})};
  using loom::cuda::GraphedStep;
  CHECK_THROWS_WITH(GraphedStep(1, x, {libtorch}, step),
                    Contains("optimizer 0 is not one of loom::optim's fused optimizers"));
  CHECK_THROWS_WITH(GraphedStep(2, x, {fused}, step),
                    Contains("one process only") && Contains("this runtime has 2 ranks"));
  CHECK_THROWS_WITH(GraphedStep(1, x, {fused}, step, {.warmup_steps = 0}),
                    Contains("warmup_steps must be at least 1"));
  CHECK_THROWS_WITH(GraphedStep(1, {}, {fused}, step), Contains("no static inputs given"));
  CHECK_THROWS_WITH(GraphedStep(1, x, {}, step), Contains("no optimizers given"));
}
