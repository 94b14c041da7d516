// The "fp8-mixed" precision on a CUDA device: a training step on compute capability 8.9 and
// newer, the refusal at construction below it.
#include "support/catch.hpp"

#include <ATen/ATen.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <loom/loom.hpp>

using Catch::Matchers::Contains;

TEST_CASE("fp8-mixed on a CUDA device", "[fp8][cuda][gpu]") {
  REQUIRE(loom::Cuda::is_available());
  auto model = torch::nn::Sequential(torch::nn::Linear(64, 128), torch::nn::GELU(),
                                     torch::nn::Linear(128, 16));
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01));
  try {
    loom::Runtime<loom::Cuda, loom::Fp8Mixed> rt;
    rt.setup(model, opt);
    auto out = rt.forward(model, rt.to_device(at::randn({32, 64})));
    CHECK(out.is_cuda());
    rt.backward(out.square().mean(), model);
    CHECK(rt.optimizer_step(opt));
  } catch (const loom::Error& e) {
    // Below compute capability 8.9 the runtime refuses the policy when it is built.
    CHECK_THAT(e.what(), Contains("compute capability 8.9 or newer"));
  }
}
