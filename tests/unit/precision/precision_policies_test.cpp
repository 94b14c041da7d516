// The shipped precision policies' hooks (default dtype inside the contexts, in-place casts of
// floating parameters and buffers, literals, outputs back in fp32, nested batches) and the
// laws every policy keeps, checked over all of them.
#include <complex>
#include <stdexcept>
#include <tuple>

#include <ATen/autocast_mode.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include "support/catch.hpp"

#include <loom/loom.hpp>

using namespace loom;

namespace {

using AllPolicies = std::tuple<Fp32, Fp64, Fp16True, Bf16True, Fp16Mixed, Bf16Mixed, Fp8Mixed>;
using UniformPolicies = std::tuple<Fp64, Fp16True, Bf16True>;

c10::ScalarType default_dtype() { return c10::get_default_dtype_as_scalartype(); }

struct WithComplexBuffer : torch::nn::Module {
  at::Tensor c;
  WithComplexBuffer() { c = register_buffer("c", at::zeros({2}, at::kComplexFloat)); }
};

}  // namespace

TEMPLATE_LIST_TEST_CASE("every shipped policy models PrecisionPolicy and names itself",
                        "[precision][laws]", AllPolicies) {
  STATIC_REQUIRE(PrecisionPolicy<TestType>);
  STATIC_REQUIRE(!TestType::precision().empty());
  // Empty policies cost nothing: the runtime is its list of loggers and its setup flag.
  STATIC_REQUIRE((sizeof(Runtime<Cpu, TestType>) == sizeof(Runtime<Cpu, loom::Fp32>)) ==
                 std::is_empty_v<TestType>);
}

TEMPLATE_LIST_TEST_CASE("conversions keep shape and device, and never cast non-floating tensors",
                        "[precision][laws]", AllPolicies) {
  TestType p;
  for (auto dt : {at::kFloat, at::kDouble, at::kHalf, at::kLong, at::kBool, at::kComplexFloat}) {
    auto t = at::ones({2, 3}, dt);
    for (const auto& out : {p.convert_input(t), p.convert_output(t)}) {
      CHECK(out.sizes() == t.sizes());
      CHECK(out.device() == t.device());
      if (!t.is_floating_point()) CHECK(out.unsafeGetTensorImpl() == t.unsafeGetTensorImpl());
    }
  }
}

TEMPLATE_LIST_TEST_CASE("contexts restore the default dtype and autocast state, also on a throw",
                        "[precision][laws]", AllPolicies) {
  TestType p;
  auto check_restored = [] {
    CHECK(default_dtype() == at::kFloat);
    CHECK_FALSE(at::autocast::is_autocast_enabled(c10::kCPU));
    CHECK_FALSE(loom::fp8::in_scope());
  };
  auto throw_inside = [](auto make) {
    try {
      [[maybe_unused]] auto g = make();
      throw std::runtime_error("inside");
    } catch (const std::runtime_error& e) {
      CHECK(std::string(e.what()) == "inside");  // propagates unchanged
    }
  };
  throw_inside([&] { return p.forward_context(c10::kCPU); });
  check_restored();
  throw_inside([&] { return p.module_init_context(); });
  check_restored();
  throw_inside([&] { return p.tensor_init_context(); });
  check_restored();
}

TEMPLATE_LIST_TEST_CASE("true-dtype policies set the default dtype inside every context ",
                        "[precision][uniform]", UniformPolicies) {
  TestType p;
  constexpr auto dt = TestType::dtype();
  CHECK(default_dtype() == at::kFloat);
  {
    [[maybe_unused]] auto g = p.module_init_context();
    CHECK(default_dtype() == dt);
    torch::nn::Linear l(2, 2);  // built under the context: already in the policy's dtype
    CHECK(l->weight.scalar_type() == dt);
  }
  {
    [[maybe_unused]] auto g = p.forward_context(c10::kCPU);
    CHECK(default_dtype() == dt);
    CHECK_FALSE(at::autocast::is_autocast_enabled(c10::kCPU));
  }
  {
    // Float literals take the policy dtype, int literals stay int64, explicit dtypes kept.
    [[maybe_unused]] auto g = p.tensor_init_context();
    CHECK(at::ones({1}).scalar_type() == dt);
    CHECK(at::arange(3).scalar_type() == at::kLong);
    CHECK(at::ones({1}, at::kHalf).scalar_type() == at::kHalf);
  }
  CHECK(default_dtype() == at::kFloat);
}

TEMPLATE_LIST_TEST_CASE("true-dtype policies cast floating params and buffers only, in place",
                        "[precision][uniform]", UniformPolicies) {
  torch::nn::Sequential net(torch::nn::Linear(3, 4), torch::nn::BatchNorm1d(4));
  auto complex = std::make_shared<WithComplexBuffer>();
  auto w = net[0]->as<torch::nn::Linear>()->weight;
  auto impl = w.unsafeGetTensorImpl();
  torch::optim::SGD opt(net->parameters(), 0.1);  // built before the conversion
  TestType().convert_module(*net);
  TestType().convert_module(*complex);
  constexpr auto dt = TestType::dtype();
  for (auto& p : net->parameters()) CHECK(p.scalar_type() == dt);
  auto buffers = net->named_buffers();
  CHECK(buffers["1.running_mean"].scalar_type() == dt);
  CHECK(buffers["1.num_batches_tracked"].scalar_type() == at::kLong);
  CHECK(complex->c.scalar_type() == at::kComplexFloat);
  CHECK(net[0]->as<torch::nn::Linear>()->weight.unsafeGetTensorImpl() == impl);
  // The optimizer built before still updates the converted parameters.
  auto before = w.clone();
  w.mutable_grad() = at::ones_like(w);
  opt.step();
  CHECK_FALSE(w.equal(before));
}

TEST_CASE("Fp64 end to end: params, buffers, inputs, literals, outputs, grads",
          "[precision][fp64]") {
  Runtime<Cpu, Fp64> rt;
  torch::nn::Linear model{nullptr};
  std::shared_ptr<WithComplexBuffer> complex;
  {
    [[maybe_unused]] auto g = rt.module_init_context();
    model = torch::nn::Linear(3, 2);
    complex = std::make_shared<WithComplexBuffer>();
    complex->c = complex->register_buffer("d", at::zeros({2}, c10::get_default_complex_dtype()));
  }
  CHECK(complex->c.scalar_type() == at::kComplexDouble);
  torch::optim::SGD opt(model->parameters(), 0.1);
  rt.setup(model, opt);
  CHECK(model->weight.scalar_type() == at::kDouble);
  c10::ScalarType seen_input = at::kFloat, seen_literal = at::kFloat, seen_int = at::kFloat,
                  seen_half = at::kFloat;
  auto step = [&](const at::Tensor& x, const at::Tensor& ids) {
    seen_input = x.scalar_type();
    seen_int = ids.scalar_type();
    seen_literal = at::tensor({0.0}).scalar_type();
    seen_half = at::zeros({1}, at::kHalf).scalar_type();
    return model->forward(x);
  };
  auto out = rt.forward(step, at::ones({4, 3}), at::arange(4));
  CHECK(seen_input == at::kDouble);
  CHECK(seen_int == at::kLong);
  CHECK(seen_literal == at::kDouble);
  CHECK(seen_half == at::kHalf);
  CHECK(out.scalar_type() == at::kFloat);  // converted back outside the context
  rt.backward(out.sum(), model);
  CHECK(model->weight.grad().scalar_type() == at::kDouble);
  CHECK(rt.optimizer_step(opt));
}

TEST_CASE("true half policies train a step in their dtype", "[precision][half]") {
  Runtime<Cpu, Bf16True> rt;
  torch::manual_seed(0);
  torch::nn::Linear model(4, 1);
  rt.setup(model);
  torch::optim::SGD opt(model->parameters(), 0.1);  // state in bf16: built after conversion
  at::Tensor inside;
  auto out = rt.forward(
      [&](const at::Tensor& x) {
        inside = model->forward(x);
        return inside;
      },
      at::randn({8, 4}));
  CHECK(inside.scalar_type() == at::kBFloat16);
  CHECK(out.scalar_type() == at::kFloat);
  rt.backward(out.pow(2).mean(), model);
  CHECK(model->weight.grad().scalar_type() == at::kBFloat16);
  auto before = model->weight.clone();
  CHECK(rt.optimizer_step(opt));
  CHECK_FALSE(model->weight.equal(before));
  STATIC_REQUIRE(Fp16True::precision() == "16-true");
  STATIC_REQUIRE(Bf16True::precision() == "bf16-true");
}

TEST_CASE("casting nested batches per policy", "[precision][cast]") {
  auto batch = std::make_tuple(at::ones({2}, at::kHalf), at::ones({2}), at::ones({2}, at::kDouble),
                               at::arange(2), at::ones({2}, at::kBool),
                               std::map<std::string, at::Tensor>{{"x", at::ones({1})}});
  auto types = [](const auto& b) {
    return std::vector<c10::ScalarType>{
        std::get<0>(b).scalar_type(), std::get<1>(b).scalar_type(),
        std::get<2>(b).scalar_type(), std::get<3>(b).scalar_type(),
        std::get<4>(b).scalar_type(), std::get<5>(b).at("x").scalar_type()};
  };
  using V = std::vector<c10::ScalarType>;
  Runtime<Cpu, Fp32> fp32;
  CHECK((types(fp32.convert_input(batch)) ==
         V{at::kHalf, at::kFloat, at::kDouble, at::kLong, at::kBool, at::kFloat}));
  Runtime<Cpu, Fp16Mixed> fp16;
  CHECK((types(fp16.convert_input(batch)) ==
         V{at::kHalf, at::kHalf, at::kHalf, at::kLong, at::kBool, at::kHalf}));
  Runtime<Cpu, Bf16Mixed> bf16;
  auto in = bf16.convert_input(batch);
  CHECK((types(in) ==
         V{at::kBFloat16, at::kBFloat16, at::kBFloat16, at::kLong, at::kBool, at::kBFloat16}));
  CHECK((types(bf16.convert_output(in)) ==
         V{at::kFloat, at::kFloat, at::kFloat, at::kLong, at::kBool, at::kFloat}));
  CHECK(std::get<3>(in).unsafeGetTensorImpl() == std::get<3>(batch).unsafeGetTensorImpl());
}
