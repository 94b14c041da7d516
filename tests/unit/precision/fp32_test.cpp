// loom::Fp32 ("32-true") and the precision defaults: its name, identity conversions, contexts
// that change nothing, plain backward and step, no state; DefaultDtypeGuard.
#include <ATen/autocast_mode.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include "support/catch.hpp"

#include <loom/loom.hpp>

using loom::Fp32;

TEST_CASE("Fp32 is named 32-true at compile time", "[precision][fp32]") {
  STATIC_REQUIRE(Fp32::precision() == "32-true");
  constexpr auto name = Fp32::precision();
  STATIC_REQUIRE(name.size() == 7);
}

TEST_CASE("Fp32 conversions are identities for every dtype", "[precision][fp32]") {
  Fp32 p;
  for (auto dt : {at::kHalf, at::kFloat, at::kDouble, at::kLong, at::kBool}) {
    auto t = at::ones({2, 2}, dt);
    auto in = p.convert_input(t);
    auto out = p.convert_output(t);
    CHECK(in.unsafeGetTensorImpl() == t.unsafeGetTensorImpl());
    CHECK(out.unsafeGetTensorImpl() == t.unsafeGetTensorImpl());
  }
}

TEST_CASE("Fp32 contexts change nothing", "[precision][fp32]") {
  Fp32 p;
  {
    [[maybe_unused]] auto g = p.forward_context(c10::kCPU);
    CHECK(c10::get_default_dtype() == caffe2::TypeMeta::Make<float>());
    CHECK_FALSE(at::autocast::is_autocast_enabled(c10::kCPU));
  }
  {
    [[maybe_unused]] auto g = p.module_init_context();
    torch::nn::Linear l(2, 2);
    CHECK(l->weight.scalar_type() == at::kFloat);
  }
  {
    [[maybe_unused]] auto g = p.tensor_init_context();
    CHECK(at::ones({1}).scalar_type() == at::kFloat);
  }
}

TEST_CASE("Fp32 convert_module leaves weights and buffers alone", "[precision][fp32]") {
  torch::nn::Sequential net(torch::nn::Linear(3, 4), torch::nn::BatchNorm1d(4));
  Fp32().convert_module(*net);
  for (auto& p : net->parameters()) CHECK(p.scalar_type() == at::kFloat);
  CHECK(net->named_buffers()["1.num_batches_tracked"].scalar_type() == at::kLong);
}

TEST_CASE("Fp32 backward, step and main_params are plain LibTorch", "[precision][fp32]") {
  torch::manual_seed(1);
  torch::nn::Linear model(3, 1);
  torch::nn::Linear twin(3, 1);
  {
    torch::NoGradGuard ng;
    twin->weight.copy_(model->weight);
    twin->bias.copy_(model->bias);
  }
  torch::optim::SGD opt(model->parameters(), 0.1), twin_opt(twin->parameters(), 0.1);
  Fp32 p;
  auto x = at::randn({8, 3});
  auto loss = model->forward(x).pow(2).mean();
  auto l = p.pre_backward(loss, *model);
  CHECK(l.unsafeGetTensorImpl() == loss.unsafeGetTensorImpl());
  p.backward(l, *model);
  auto detached = p.post_backward(l, *model);
  CHECK_FALSE(detached.requires_grad());
  CHECK(detached.item<float>() == loss.item<float>());
  CHECK(p.optimizer_step(opt));

  twin->forward(x).pow(2).mean().backward();
  twin_opt.step();
  CHECK(model->weight.equal(twin->weight));  // bitwise the same as the hand-written step
  CHECK(model->bias.equal(twin->bias));

  auto params = p.main_params(opt);
  REQUIRE(params.size() == 2);
  CHECK(params[0].unsafeGetTensorImpl() == model->weight.unsafeGetTensorImpl());
  CHECK(params[1].unsafeGetTensorImpl() == model->bias.unsafeGetTensorImpl());
}

TEST_CASE("Fp32 has no state and refuses a non-empty one", "[precision][fp32][state]") {
  Fp32 p;
  CHECK(p.state_dict().empty());
  CHECK_NOTHROW(p.load_state_dict({}));
  CHECK_THROWS_AS(p.load_state_dict({{"scale", 65536.0}}), loom::Error);
  CHECK_NOTHROW(p.teardown());
}

TEST_CASE("DefaultDtypeGuard restores the default dtype, also on a throw", "[guards]") {
  CHECK(c10::get_default_dtype() == caffe2::TypeMeta::Make<float>());
  {
    loom::DefaultDtypeGuard<c10::kHalf> g;
    CHECK(at::ones({1}).scalar_type() == at::kHalf);
    {
      loom::DefaultDtypeGuard<c10::kDouble> inner;
      CHECK(at::ones({1}).scalar_type() == at::kDouble);
    }
    CHECK(at::ones({1}).scalar_type() == at::kHalf);
  }
  CHECK(at::ones({1}).scalar_type() == at::kFloat);
  CHECK_THROWS_AS(([] {
                    loom::DefaultDtypeGuard<c10::kHalf> g;
                    throw std::runtime_error("inside");
                  }()),
                  std::runtime_error);
  CHECK(c10::get_default_dtype() == caffe2::TypeMeta::Make<float>());
}
