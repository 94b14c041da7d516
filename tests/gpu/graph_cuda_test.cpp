// loom::cuda::GraphedStep on a GPU: 100 replays of a captured step (dropout, clipping, fused
// AdamW, a warm-up + cosine schedule) equal 100 eager steps bit for bit in 32-true, bf16-mixed
// and 16-mixed with skipped steps; a step that reads the device fails the capture naming the op.
// Registered with label gpu only under LOOM_BUILD_GPU_TESTS; compiled everywhere.
#include "support/catch.hpp"
#include "support/graphed_step_case.hpp"

#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <loom/cuda/graphed_step.hpp>
#include <loom/loom.hpp>

using Catch::Matchers::Contains;

namespace {

template <class Precision>
void check_cuda(Precision precision = Precision(), bool overflow = false) {
  loom::Runtime<loom::Cuda, Precision> a{loom::Cuda{}, precision}, b{loom::Cuda{}, precision};
  const auto graphed = loom::testing::graphed_run(a, true, 100, overflow);
  const auto plain = loom::testing::graphed_run(b, false, 100, overflow);
  CHECK(graphed.captured_at == 3);  // 3 warm-up steps, then captured
  loom::testing::check_same_run(graphed, plain);
}

}  // namespace

TEST_CASE("100 replays of a captured step equal 100 eager steps bit for bit", "[gpu]") {
  SECTION("32-true") { check_cuda<loom::Fp32>(); }
  SECTION("bf16-mixed") { check_cuda<loom::Bf16Mixed>(); }
  SECTION("16-mixed, with skipped steps") {
    loom::amp::GradScalerOptions o;
    o.init_scale = 65536.0;
    o.growth_interval = 1000;
    check_cuda<loom::Fp16Mixed>(loom::Fp16Mixed(o), /*overflow=*/true);
  }
}

TEST_CASE("A step that reads the device fails the capture naming the op", "[gpu]") {
  torch::nn::Linear m(8, 1);
  loom::optim::AdamW opt(m->parameters(), loom::optim::AdamWOptions(1e-3));
  loom::Runtime<loom::Cuda, loom::Fp32> rt;
  rt.setup(m, opt);
  const at::Tensor x = rt.to_device(at::randn({4, 8}));
  loom::cuda::GraphedStep step(rt, {x}, {opt}, [&](const std::vector<at::Tensor>& in) {
    at::Tensor loss = rt.forward(m, in[0]).sum();
    rt.backward(loss, m);
    rt.clip_gradients(opt, 1.0, 2.0, /*error_if_nonfinite=*/true);  // reads the norm
    rt.optimizer_step(opt);
    return loss.detach();
  });
  for (int i = 0; i < 3; ++i) step({x});  // warm-up: eager, reading is allowed
  CHECK_THROWS_WITH(step({x}), Contains("could not be captured as a CUDA graph") &&
                                   Contains("_local_scalar_dense"));
}
