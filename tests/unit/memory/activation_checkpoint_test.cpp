// Activation checkpointing: gradients bit for bit those of the plain model (dropout, autocast,
// several inputs), the training's random stream untouched by the rerun, fewer saved
// activations, and the errors.
#include "support/catch.hpp"
#include "support/dropout_mlp.hpp"
#include "support/warnings.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>

#include <loom/loom.hpp>
#include <loom/nn/activation_checkpoint.hpp>

namespace {

using loom::testing::check_same_grads;
using loom::testing::dropout_mlp_step;

// 4 blocks of Linear-GELU-Dropout, then a head: 13 modules.
torch::nn::Sequential make_mlp() { return loom::testing::dropout_mlp(4, 16, 3); }
std::pair<torch::nn::Sequential, torch::nn::Sequential> twins() {
  return loom::testing::dropout_mlp_twins(4, 16, 3);
}

template <class Precision>
void check_precision() {
  loom::testing::WarningCatcher quiet;  // fp16 on the CPU warns once
  auto [plain, ckpt] = twins();
  loom::Runtime<loom::Cpu, Precision> a, b;
  a.setup(plain);
  b.setup(ckpt);
  const at::Tensor x = at::randn({8, 16});
  const at::Tensor la = dropout_mlp_step(a, plain, 0, x);
  const at::Tensor after_plain = loom::device::get_rng_state();
  const at::Tensor lb = dropout_mlp_step(b, ckpt, 4, x);
  CHECK(at::equal(la, lb));
  CHECK(at::equal(loom::device::get_rng_state(), after_plain));  // the rerun's draws are undone
  check_same_grads(plain, ckpt);
}

}  // namespace

TEST_CASE("checkpoint_sequential gives the plain model's gradients bit for bit",
          "[activation_checkpoint]") {
  SECTION("32-true") { check_precision<loom::Fp32>(); }
  SECTION("bf16-mixed") { check_precision<loom::Bf16Mixed>(); }
  SECTION("16-mixed") { check_precision<loom::Fp16Mixed>(); }
}

TEST_CASE("activation_checkpoint of a callable: several inputs, their gradients too",
          "[activation_checkpoint]") {
  torch::manual_seed(3);
  torch::nn::Linear lin(6, 6);
  const at::Tensor x0 = at::randn({5, 6}), m0 = at::rand({5, 6});
  auto fn = [&](const at::Tensor& x, const at::Tensor& m) {
    return at::dropout(lin->forward(x).tanh() * m, 0.5, /*train=*/true);
  };
  at::Tensor x1 = x0.clone().requires_grad_(), x2 = x0.clone().requires_grad_();
  torch::manual_seed(8);
  fn(x1, m0).sum().backward();
  const at::Tensor w_plain = lin->weight.grad().clone(), b_plain = lin->bias.grad().clone();
  lin->zero_grad();
  torch::manual_seed(8);
  const at::Tensor out = loom::activation_checkpoint(lin->parameters(), fn, x2, m0);
  CHECK(out.requires_grad());
  out.sum().backward();
  CHECK(at::equal(x1.grad(), x2.grad()));
  CHECK(at::equal(lin->weight.grad(), w_plain));
  CHECK(at::equal(lin->bias.grad(), b_plain));
}

TEST_CASE("activation_checkpoint of a module, and without inputs that need grad",
          "[activation_checkpoint]") {
  torch::manual_seed(4);
  torch::nn::Linear lin(4, 2);
  const at::Tensor x = at::randn({3, 4});  // no grad: the parameters still get theirs
  loom::activation_checkpoint(lin, x).sum().backward();
  const at::Tensor g = lin->weight.grad().clone();
  lin->zero_grad();
  lin->forward(x).sum().backward();
  CHECK(at::equal(g, lin->weight.grad()));
}

TEST_CASE("checkpointed segments keep fewer activations for backward", "[activation_checkpoint]") {
  auto [plain, ckpt] = twins();
  const at::Tensor x = at::randn({8, 16});
  // The operations whose inputs the graph keeps for backward: the autograd nodes reachable
  // from the loss, the parameters' AccumulateGrad leaves aside.
  auto nodes = [](const at::Tensor& loss) {
    std::vector<torch::autograd::Node*> stack{loss.grad_fn().get()};
    std::vector<torch::autograd::Node*> seen;
    std::size_t leaves = 0;
    while (!stack.empty()) {
      auto* n = stack.back();
      stack.pop_back();
      if (n == nullptr || std::find(seen.begin(), seen.end(), n) != seen.end()) continue;
      seen.push_back(n);
      if (n->name().find("AccumulateGrad") != std::string::npos) ++leaves;
      for (const auto& e : n->next_edges()) stack.push_back(e.function.get());
    }
    return seen.size() - leaves;
  };
  const auto n_plain = nodes(plain->forward(x).sum());
  const auto n_ckpt = nodes(loom::checkpoint_sequential(ckpt, 4, x).sum());
  INFO("plain " << n_plain << " nodes, checkpointed " << n_ckpt);
  // Three of the four blocks (Linear: t + addmm, GELU, Dropout: 4 nodes each) become one
  // checkpointed node each.
  CHECK(n_plain - n_ckpt == 3 * (4 - 1));
}

TEST_CASE("checkpoint_sequential refuses a segment count out of range", "[activation_checkpoint]") {
  auto model = make_mlp();
  const at::Tensor x = at::randn({2, 16});
  CHECK_THROWS_WITH(loom::checkpoint_sequential(model, 0, x),
                    Catch::Matchers::Contains("segments must be from 1 to the 13 modules"));
  CHECK_THROWS_WITH(loom::checkpoint_sequential(model, 14, x), Catch::Matchers::Contains("got 14"));
  model->eval();  // one segment: nothing checkpointed, the plain forward
  CHECK(at::equal(loom::checkpoint_sequential(model, 1, x), model->forward(x)));
}

TEST_CASE("activation_checkpoint holds its own handle: a loop's local one may go",
          "[activation_checkpoint]") {
  torch::manual_seed(6);
  torch::nn::Linear lin(4, 2);
  const at::Tensor x = at::randn({3, 4});
  at::Tensor out;
  {
    torch::nn::LinearImpl* local = lin.get();  // gone before backward reruns the forward
    out = loom::activation_checkpoint(local, x);
  }
  out.sum().backward();
  const at::Tensor g = lin->weight.grad().clone();
  lin->zero_grad();
  lin->forward(x).sum().backward();
  CHECK(at::equal(g, lin->weight.grad()));
}
