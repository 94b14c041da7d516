// Activation checkpointing on a GPU: a 4-block MLP with dropout on CUDA, checkpointed in
// segments, gives the plain model's gradients bit for bit, and the CUDA generator's stream is
// left as the plain run leaves it. Registered with label gpu only under LOOM_BUILD_GPU_TESTS;
// compiled everywhere.
#include "support/catch.hpp"

#include <ATen/ATen.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>

#include <loom/loom.hpp>
#include <loom/nn/activation_checkpoint.hpp>

namespace {

torch::nn::Sequential make_mlp() {
  torch::nn::Sequential s;
  for (int i = 0; i < 4; ++i) {
    s->push_back(torch::nn::Linear(64, 64));
    s->push_back(torch::nn::GELU());
    s->push_back(torch::nn::Dropout(0.25));
  }
  s->push_back(torch::nn::Linear(64, 8));
  return s;
}

template <class Precision>
void check_on_cuda() {
  torch::manual_seed(5);
  auto plain = make_mlp();
  auto ckpt = make_mlp();
  {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < plain->parameters().size(); ++i) {
      ckpt->parameters()[i].copy_(plain->parameters()[i]);
    }
  }
  loom::Runtime<loom::Cuda, Precision> a, b;
  a.setup(plain);
  b.setup(ckpt);
  const at::Tensor x = a.to_device(at::randn({32, 64}));
  const c10::Device gpu = x.device();
  auto step = [&](auto& rt, torch::nn::Sequential& model, int64_t segments) {
    torch::manual_seed(99);  // the CPU and every CUDA generator
    at::Tensor out = rt.forward(
        [&](const at::Tensor& in) {
          return segments == 0 ? model->forward(in)
                               : loom::checkpoint_sequential(model, segments, in);
        },
        x);
    at::Tensor loss = out.square().mean();
    rt.backward(loss, model);
    return loss;
  };
  const at::Tensor la = step(a, plain, 0);
  const at::Tensor rng_plain = loom::device::get_rng_state(gpu);
  const at::Tensor lb = step(b, ckpt, 4);
  CHECK(at::equal(la, lb));
  CHECK(at::equal(loom::device::get_rng_state(gpu), rng_plain));
  const auto pa = plain->named_parameters(), pb = ckpt->named_parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) {
    INFO(pa[i].key());
    REQUIRE(pb[i].value().grad().defined());
    CHECK(pb[i].value().grad().is_cuda());
    CHECK(at::equal(pa[i].value().grad(), pb[i].value().grad()));
  }
}

}  // namespace

TEST_CASE("Activation checkpointing on CUDA gives the plain model's gradients bit for bit",
          "[gpu]") {
  SECTION("32-true") { check_on_cuda<loom::Fp32>(); }
  SECTION("bf16-mixed") { check_on_cuda<loom::Bf16Mixed>(); }
  SECTION("16-mixed") { check_on_cuda<loom::Fp16Mixed>(); }
}
