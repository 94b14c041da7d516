// Activation checkpointing on a GPU: a 4-block MLP with dropout on CUDA, checkpointed in
// segments, gives the plain model's gradients bit for bit, and the CUDA generator's stream is
// left as the plain run leaves it. Registered with label gpu only under LOOM_BUILD_GPU_TESTS;
// compiled everywhere.
#include "support/catch.hpp"
#include "support/dropout_mlp.hpp"

#include <ATen/ATen.h>

#include <loom/loom.hpp>
#include <loom/nn/activation_checkpoint.hpp>

namespace {

template <class Precision>
void check_on_cuda() {
  auto [plain, ckpt] = loom::testing::dropout_mlp_twins(4, 64, 8);
  loom::Runtime<loom::Cuda, Precision> a, b;
  a.setup(plain);
  b.setup(ckpt);
  const at::Tensor x = a.to_device(at::randn({32, 64}));
  const at::Tensor la = loom::testing::dropout_mlp_step(a, plain, 0, x);
  const at::Tensor rng_plain = loom::device::get_rng_state(x.device());
  const at::Tensor lb = loom::testing::dropout_mlp_step(b, ckpt, 4, x);
  CHECK(at::equal(la, lb));
  CHECK(at::equal(loom::device::get_rng_state(x.device()), rng_plain));
  CHECK(ckpt->parameters()[0].grad().is_cuda());
  loom::testing::check_same_grads(plain, ckpt);
}

}  // namespace

TEST_CASE("Activation checkpointing on CUDA gives the plain model's gradients bit for bit",
          "[gpu]") {
  SECTION("32-true") { check_on_cuda<loom::Fp32>(); }
  SECTION("bf16-mixed") { check_on_cuda<loom::Bf16Mixed>(); }
  SECTION("16-mixed") { check_on_cuda<loom::Fp16Mixed>(); }
}
