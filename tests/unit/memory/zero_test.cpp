// loom::Zero on one process: Python's partition, the strategy's optimizer_step and clip hooks,
// errors, and the strategy state that Ddp and Zero checkpoint. Two and four ranks, and parity
// with Python's ZeroRedundancyOptimizer: dist.zero.
#include "support/catch.hpp"

#ifdef LOOM_TEST_DIST

#include <cstdint>
#include <string>
#include <vector>

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <loom/loom.hpp>

using Catch::Matchers::Contains;

namespace {

torch::nn::Sequential small_mlp() {
  torch::manual_seed(7);
  return torch::nn::Sequential(torch::nn::Linear(8, 32), torch::nn::Tanh(),
                               torch::nn::Linear(32, 32), torch::nn::Tanh(),
                               torch::nn::Linear(32, 4));
}

/// Trains `model` 6 steps with fused AdamW under runtime R (clipping at 0.5) and returns the
/// final parameters, flat.
template <class R>
torch::Tensor train(R& rt, torch::nn::Sequential& model, bool clip) {
  loom::optim::AdamW opt(model->parameters(), loom::optim::AdamWOptions(1e-2));
  rt.setup(model, opt);
  torch::manual_seed(3);
  for (int step = 0; step < 6; ++step) {
    opt.zero_grad();
    auto x = torch::randn({16, 8}) * 3;
    auto y = torch::randint(0, 4, {16}, torch::kLong);
    rt.backward(torch::nn::functional::cross_entropy(rt.forward(model, x), y), model);
    if (clip) rt.clip_gradients(opt, 0.5);
    rt.optimizer_step(opt);
    // The groups are whole again after the sharded step.
    REQUIRE(opt.param_groups()[0].params().size() == 6);
  }
  std::vector<torch::Tensor> parts;
  for (auto& p : model->parameters()) parts.push_back(p.detach().reshape(-1));
  return torch::cat(parts);
}

}  // namespace

TEST_CASE("Zero partitions as Python's ZeroRedundancyOptimizer", "[zero]") {
  // Largest first; each to the rank with the fewest elements so far (the lowest on a tie).
  const std::vector<std::int64_t> mlp{256, 32, 1024, 32, 128, 4};
  CHECK(loom::Zero::partition(mlp, 1) == std::vector<int>{0, 0, 0, 0, 0, 0});
  CHECK(loom::Zero::partition(mlp, 2) == std::vector<int>{1, 1, 0, 1, 1, 1});
  CHECK(loom::Zero::partition(mlp, 3) == std::vector<int>{1, 2, 0, 2, 2, 2});
  CHECK(loom::Zero::partition({5, 5, 5, 5}, 2) == std::vector<int>{0, 1, 0, 1});
  CHECK(loom::Zero::partition({1, 2, 3}, 4) == std::vector<int>{2, 1, 0});
  CHECK_THROWS_WITH(loom::Zero::partition({1}, 0), Contains("world size must be positive"));
}

TEST_CASE("Zero on one process trains as one process does, at either stage", "[zero]") {
  for (bool clip : {false, true}) {
    auto plain_model = small_mlp();
    loom::Runtime<loom::Cpu, loom::Fp32> plain;
    const auto expected = train(plain, plain_model, clip);
    for (int stage : {1, 2}) {
      auto model = small_mlp();
      loom::ZeroOptions o;
      o.stage = stage;
      loom::Runtime<loom::Cpu, loom::Fp32, loom::Zero> rt(loom::Cpu{}, loom::Fp32{}, loom::Zero(o));
      const auto got = train(rt, model, clip);
      INFO("stage " << stage << (clip ? ", clipped" : ""));
      CHECK(torch::equal(got, expected));
      CHECK(rt.strategy().owners() == std::vector<int>(6, 0));
      CHECK(rt.strategy().stage() == stage);
      CHECK(loom::Runtime<loom::Cpu, loom::Fp32, loom::Zero>::strategy_policy::strategy() ==
            "zero");
    }
  }
}

TEMPLATE_TEST_CASE("Zero on one process steps as one process does under each precision", "[zero]",
                   loom::Fp64, loom::Fp16True, loom::Bf16True, loom::Bf16Mixed, loom::Fp16Mixed) {
  auto run = [](auto& rt) {
    auto model = small_mlp();
    return train(rt, model, /*clip=*/true);
  };
  loom::Runtime<loom::Cpu, TestType> plain;
  loom::Runtime<loom::Cpu, TestType, loom::Zero> sharded;
  const auto expected = run(plain);
  const auto got = run(sharded);
  CHECK(got.scalar_type() == expected.scalar_type());
  CHECK(torch::equal(got, expected));
}

TEST_CASE("Zero counts what a rank holds", "[zero]") {
  auto model = small_mlp();
  loom::Runtime<loom::Cpu, loom::Fp32, loom::Zero> rt;
  loom::optim::AdamW opt(model->parameters(), loom::optim::AdamWOptions(1e-2));
  rt.setup(model, opt);
  const std::int64_t bytes = (256 + 32 + 1024 + 32 + 128 + 4) * 4;
  auto before = rt.strategy().memory(opt);
  CHECK(before.parameters == bytes);
  CHECK(before.gradients == 0);
  CHECK(before.optimizer_state == 0);
  rt.backward(rt.forward(model, torch::ones({2, 8})).sum(), model);
  rt.optimizer_step(opt);
  auto after = rt.strategy().memory(opt);
  CHECK(after.gradients == bytes);
  CHECK(after.optimizer_state == 2 * bytes + 6 * 4);  // exp_avg, exp_avg_sq, an f32 step each
}

TEST_CASE("Zero refuses what it cannot shard", "[zero]") {
  loom::ZeroOptions three;
  three.stage = 3;
  CHECK_THROWS_WITH(loom::Zero(three), Contains("ZeroOptions::stage is 1 (optimizer state) or 2 "
                                                "(and gradients), not 3"));
  loom::ZeroOptions empty;
  empty.bucket_bytes = 0;
  CHECK_THROWS_WITH(loom::Zero(empty), Contains("bucket_bytes must be > 0"));

  auto model = small_mlp();
  auto stranger = torch::zeros({3}, torch::requires_grad());
  std::vector<torch::Tensor> params = model->parameters();
  params.push_back(stranger);
  torch::optim::SGD opt(params, torch::optim::SGDOptions(0.1));
  loom::Runtime<loom::Cpu, loom::Fp32, loom::Zero> rt;
  CHECK_THROWS_WITH(rt.optimizer_step(opt), Contains("optimizer_step before setup"));
  rt.setup(model, opt);
  rt.backward(rt.forward(model, torch::ones({2, 8})).sum(), model);
  CHECK_THROWS_WITH(rt.optimizer_step(opt),
                    Contains("has a parameter that is not one of the module's trainable "
                             "parameters (shape [3])"));
  CHECK(opt.param_groups()[0].params().size() == 7);  // nothing narrowed
}

TEST_CASE("Ddp's and Zero's state is the reducer's bucket layout, restored by the same strategy",
          "[zero][ddp][checkpoint]") {
  c10::impl::GenericList order(c10::ListType::ofInts());
  order.push_back(c10::List<std::int64_t>({1, 0}));
  loom::Ddp ddp;
  CHECK(ddp.state_dict().empty());  // one process: no reducer, no layout
  CHECK_NOTHROW(ddp.load_state_dict({{"bucket_order", order}}));  // kept for a reducer
  CHECK_NOTHROW(ddp.load_state_dict({}));                         // an older file
  CHECK_THROWS_WITH(ddp.load_state_dict({{"bucket_order", c10::IValue("0 1")}}),
                    Contains("loom::Ddp::load_state_dict: bucket_order is not a list of lists "
                             "of parameter indices"));
  c10::impl::GenericList negative(c10::ListType::ofInts());
  negative.push_back(c10::List<std::int64_t>({-1}));
  CHECK_THROWS_WITH(ddp.load_state_dict({{"bucket_order", negative}}),
                    Contains("bucket_order is not a list of lists"));
  CHECK_THROWS_WITH(ddp.load_state_dict({{"bucket_order", order}, {"extra", 1}}),
                    Contains("unexpected key(s) \"extra\""));
  loom::Zero zero;
  CHECK(zero.state_dict().empty());
  CHECK_THROWS_WITH(zero.load_state_dict({{"bucket_order", c10::IValue(3)}}),
                    Contains("loom::Zero::load_state_dict: bucket_order is not a list"));

  // The runtime's entry restores a strategy's state under the strategy that saved it only.
  loom::Runtime<loom::Cpu, loom::Fp32> one;
  loom::state::Dict entry = loom::state::runtime_state(one);
  CHECK(entry.at("strategy_name").toStringRef() == "single_device");
  loom::state::Dict ddp_state = loom::state::new_dict();
  ddp_state.insert("bucket_order", order);
  entry.insert_or_assign("strategy", ddp_state);
  entry.insert_or_assign("strategy_name", std::string("ddp"));
  CHECK_NOTHROW(loom::state::load_runtime_state(one, entry, {}));  // Ddp's layout: not ours
  entry.insert_or_assign("strategy_name", std::string("single_device"));
  CHECK_THROWS_WITH(loom::state::load_runtime_state(one, entry, {}),
                    Contains("the single_device strategy has no state: unexpected key(s) "
                             "\"bucket_order\""));
  CHECK(entry.erase("strategy_name") == 1);  // a file from before the name: passed on
  CHECK_THROWS_WITH(loom::state::load_runtime_state(one, entry, {}), Contains("has no state"));
}

#endif  // LOOM_TEST_DIST
