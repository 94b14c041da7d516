// Module hooks (loom/nn/hooks.hpp): forward pre-hooks and forward hooks with Python's
// semantics, bit for bit against Python's captures (hidden case [hooks][parity], ctest
// toolbox.hooks_parity); post-accumulate-grad hooks; and the optimizer step inside backward
// (loom/optim/in_backward.hpp) against the plain step.
#include "support/catch.hpp"

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <loom/checkpoint/io.hpp>
#include <loom/loom.hpp>
#include <loom/nn/fsdp_unit.hpp>
#include <loom/nn/hooks.hpp>
#include <loom/optim/in_backward.hpp>

namespace {

// The network of tests/parity/hooks_parity.py, each layer hookable.
struct NetImpl : torch::nn::Module {
  loom::Hooked<torch::nn::Linear> fc1{nullptr}, fc2{nullptr};
  loom::Hooked<torch::nn::LayerNorm> norm{nullptr};
  loom::Hooked<torch::nn::GELU> act{nullptr};
  NetImpl() {
    fc1 = register_module("fc1", loom::Hooked<torch::nn::Linear>(16, 32));
    norm = register_module("norm",
                           loom::Hooked<torch::nn::LayerNorm>(torch::nn::LayerNormOptions({32})));
    act = register_module("act", loom::Hooked<torch::nn::GELU>());
    fc2 = register_module("fc2", loom::Hooked<torch::nn::Linear>(32, 4));
  }
  at::Tensor forward(const at::Tensor& x) { return fc2(act(norm(fc1(x)))); }
};
TORCH_MODULE(Net);

// Wrapped members assigned from register_module, as models write them.
struct WrappedImpl : torch::nn::Module {
  loom::Hooked<torch::nn::Linear> hooked{nullptr};
  loom::FsdpUnit<torch::nn::Linear> unit{nullptr};
  WrappedImpl() {
    hooked = register_module("hooked", loom::Hooked<torch::nn::Linear>(2, 2));
    unit = register_module("unit", loom::FsdpUnit<torch::nn::Linear>(2, 2));
  }
};

// A plain model for the optimizer-in-backward cases: parameters of different sizes.
torch::nn::Sequential mlp() {
  torch::manual_seed(11);
  return torch::nn::Sequential(torch::nn::Linear(12, 48), torch::nn::GELU(),
                               torch::nn::Linear(48, 24), torch::nn::GELU(),
                               torch::nn::Linear(24, 3));
}

// A runtime of two processes, as far as OptimizerInBackward asks.
struct TwoProcesses {
  static constexpr std::string_view precision_name() { return "32-true"; }
  struct Strategy {
    int64_t world_size() const { return 2; }
  };
  Strategy strategy() const { return {}; }
};

int64_t live_grad_bytes(const std::vector<at::Tensor>& params) {
  int64_t bytes = 0;
  for (const auto& p : params) {
    if (p.grad().defined()) bytes += p.grad().numel() * p.grad().element_size();
  }
  return bytes;
}

}  // namespace

TEST_CASE("Hooked modules capture and replace what Python's hooks do, bit for bit",
          "[.][hooks][parity]") {
  const char* path = std::getenv("LOOM_HOOKS_PARITY_FILE");
  if (path == nullptr) FAIL("LOOM_HOOKS_PARITY_FILE is not set");
  const auto fixture = loom::checkpoint::load_value(path).toGenericDict();
  Net net;
  {
    const auto weights = fixture.at("model").toGenericDict();
    torch::NoGradGuard no_grad;
    for (auto& p : net->named_parameters()) p.value().copy_(weights.at(p.key()).toTensor());
  }
  const at::Tensor x = fixture.at("x").toTensor();
  std::map<std::string, at::Tensor> captures;
  std::vector<std::string> order;
  net->fc1->register_forward_hook(
      [&](auto&, const auto&, at::Tensor& out) { captures["fc1.out"] = out.detach().clone(); });
  net->norm->register_forward_pre_hook(
      [&](auto&, auto& args) { captures["norm.in"] = std::get<0>(args).detach().clone(); });
  net->norm->register_forward_hook(
      [&](auto&, const auto&, at::Tensor& out) { captures["norm.out"] = out.detach().clone(); });
  auto scale =
      net->act->register_forward_hook([](auto&, const auto&, at::Tensor& out) { out = out * 1.5; });
  auto shift = net->fc2->register_forward_pre_hook(
      [](auto&, auto& args) { std::get<0>(args) = std::get<0>(args) + 0.25; });
  net->fc2->register_forward_pre_hook(
      [&](auto&, auto& args) { captures["fc2.in"] = std::get<0>(args).detach().clone(); });
  net->fc2->register_forward_hook([&](auto&, const auto&, at::Tensor&) { order.push_back("b"); });
  net->fc2->register_forward_hook([&](auto&, const auto&, at::Tensor&) { order.push_back("a"); },
                                  /*prepend=*/true);
  net->fc2
      ->register_forward_hook([&](auto&, const auto&, at::Tensor&) { order.push_back("removed"); })
      .remove();

  const at::Tensor out = net->forward(x);
  out.square().mean().backward();
  scale.remove();
  shift.remove();
  CHECK_FALSE(scale.active());
  at::Tensor plain;
  {
    torch::NoGradGuard no_grad;
    plain = net->forward(x);
  }

  const auto want = fixture.at("captures").toGenericDict();
  REQUIRE(captures.size() == want.size());
  for (const auto& item : want) {
    const std::string name = item.key().toStringRef();
    INFO(name);
    REQUIRE(captures.count(name) == 1);
    CHECK(at::equal(captures[name], item.value().toTensor()));
  }
  CHECK(at::equal(out.detach(), fixture.at("out").toTensor()));
  CHECK(at::equal(plain, fixture.at("plain").toTensor()));
  const auto grads = fixture.at("grads").toGenericDict();
  for (const auto& p : net->named_parameters()) {
    INFO(p.key());
    CHECK(at::equal(p.value().grad(), grads.at(p.key()).toTensor()));
  }
  std::vector<std::string> want_order;
  for (const c10::IValue& s : fixture.at("order").toList().vec()) {
    want_order.push_back(s.toStringRef());
  }
  CHECK(order == want_order);
}

TEST_CASE("A Hooked module keeps its parameter names and is the plain module without hooks",
          "[hooks]") {
  torch::manual_seed(1);
  torch::nn::Linear plain(6, 3);
  torch::manual_seed(1);
  loom::Hooked<torch::nn::Linear> hooked(6, 3);
  const auto a = plain->named_parameters(), b = hooked->named_parameters();
  REQUIRE(a.keys() == b.keys());
  const at::Tensor x = torch::randn({2, 6});
  CHECK(at::equal(plain(x), hooked(x)));
  CHECK(hooked->forward_hooks() == 0);

  // Nested in an Fsdp unit (and the reverse): still one forward, hooks around Block's.
  loom::FsdpUnit<loom::Hooked<torch::nn::Linear>> unit(6, 3);
  int calls = 0;
  unit->register_forward_hook([&](auto&, const auto&, at::Tensor&) { ++calls; });
  unit(x);
  loom::Hooked<loom::FsdpUnit<torch::nn::Linear>> outer(6, 3);
  outer->register_forward_pre_hook([&](auto&, auto&) { ++calls; });
  outer(x);
  CHECK(calls == 2);

  WrappedImpl wrapped;
  CHECK(wrapped.named_parameters().keys() ==
        std::vector<std::string>{"hooked.weight", "hooked.bias", "unit.weight", "unit.bias"});
}

TEST_CASE("Hooks added or removed during a forward take effect at the next one", "[hooks]") {
  loom::Hooked<torch::nn::Linear> fc(4, 4);
  std::vector<int> ran;
  loom::HookHandle first, late;
  first = fc->register_forward_hook([&](auto&, const auto&, at::Tensor&) {
    ran.push_back(1);
    first.remove();  // removes itself: this call still ends
    late = fc->register_forward_hook([&](auto&, const auto&, at::Tensor&) { ran.push_back(2); });
  });
  fc->register_forward_hook([&](auto&, const auto&, at::Tensor&) { ran.push_back(3); });
  const at::Tensor x = torch::ones({1, 4});
  fc(x);
  CHECK(ran == std::vector<int>{1, 3});
  fc(x);
  CHECK(ran == std::vector<int>{1, 3, 3, 2});
  CHECK(fc->forward_hooks() == 2);
  late.remove();
  late.remove();  // again: nothing
  CHECK(fc->forward_hooks() == 1);
}

TEST_CASE("Post-accumulate-grad hooks run once the gradient is accumulated, in order", "[hooks]") {
  torch::nn::Linear fc(3, 2);
  const at::Tensor w = fc->weight;
  std::vector<std::string> calls;
  std::vector<at::Tensor> seen;
  auto h1 = loom::register_post_accumulate_grad_hook(w, [&](const at::Tensor& p) {
    calls.push_back("first");
    seen.push_back(p.grad().clone());
  });
  auto h2 = loom::register_post_accumulate_grad_hook(
      w, [&](const at::Tensor&) { calls.push_back("second"); });
  const at::Tensor x = torch::randn({5, 3});
  fc(x).sum().backward();
  REQUIRE(seen.size() == 1);
  const at::Tensor g1 = w.grad().clone();
  CHECK(at::equal(seen[0], g1));
  fc(x).sum().backward();  // accumulation: the hook sees the sum
  CHECK(at::equal(seen[1], g1 * 2));
  h1.remove();
  fc(x).sum().backward();
  CHECK(calls == std::vector<std::string>{"first", "second", "first", "second", "second"});
  h2.remove();

  CHECK_THROWS_WITH(loom::register_post_accumulate_grad_hook(w * 2, [](const at::Tensor&) {}),
                    Catch::Matchers::Contains("must be a leaf that requires grad"));
  CHECK_THROWS_WITH(
      loom::register_post_accumulate_grad_hook(torch::ones({2}), [](const at::Tensor&) {}),
      Catch::Matchers::Contains("must be a leaf that requires grad"));
}

TEST_CASE(
    "The optimizer step inside backward trains as the plain step does, bit for bit, "
    "holding one parameter's gradient at a time",
    "[hooks][optim]") {
  const auto options = loom::optim::AdamWOptions(1e-2).weight_decay(0.05);
  torch::manual_seed(5);
  std::vector<at::Tensor> xs, ys;
  for (int i = 0; i < 10; ++i) {
    xs.push_back(torch::randn({16, 12}));
    ys.push_back(torch::randn({16, 3}));
  }
  auto loss_of = [&](torch::nn::Sequential& m, int i) {
    return torch::mse_loss(m->forward(xs[static_cast<std::size_t>(i)]),
                           ys[static_cast<std::size_t>(i)]);
  };

  // The plain loop: backward, then one fused AdamW over every parameter.
  auto plain = mlp();
  loom::optim::AdamW opt(plain->parameters(), options);
  for (int i = 0; i < 10; ++i) {
    opt.zero_grad();
    loss_of(plain, i).backward();
    opt.step();
  }

  // In backward, driven by the runtime: no optimizer_step, no zero_grad.
  loom::Runtime<loom::Cpu, loom::Fp32> rt(loom::Cpu{});
  auto model = mlp();
  rt.setup(model);
  const std::vector<at::Tensor> params = model->parameters();
  int64_t largest = 0, peak = 0;
  for (const auto& p : params) largest = std::max(largest, p.numel() * p.element_size());
  // Measures the gradients alive each time a parameter's gradient is in (before its step:
  // registered first, this hook runs first).
  std::vector<loom::HookHandle> probes;
  for (const auto& p : params) {
    probes.push_back(loom::register_post_accumulate_grad_hook(
        p, [&](const at::Tensor&) { peak = std::max(peak, live_grad_bytes(params)); }));
  }
  loom::optim::OptimizerInBackward<loom::optim::AdamW> in_bwd(rt, model->named_parameters(),
                                                              options);
  CHECK(in_bwd.size() == params.size());
  for (int i = 0; i < 5; ++i) rt.backward(loss_of(model, i), model);
  for (const auto& p : params) CHECK_FALSE(p.grad().defined());  // each freed after its step
  CHECK(peak > 0);
  CHECK(peak <= largest);
  INFO("peak live gradient bytes " << peak << ", largest parameter " << largest);

  // Checkpointed halfway, resumed into a fresh model and optimizers.
  const auto dir = std::filesystem::temp_directory_path() / "loom_in_backward_test";
  std::filesystem::create_directories(dir);
  rt.save(dir / "half.pt", {{"model", model}, {"optimizer", in_bwd}});
  for (auto& h : probes) h.remove();
  in_bwd.remove();
  auto resumed = mlp();
  loom::optim::OptimizerInBackward<loom::optim::AdamW> resumed_opt(resumed->named_parameters(),
                                                                   loom::optim::AdamWOptions(1));
  rt.load(dir / "half.pt", {{"model", resumed}, {"optimizer", resumed_opt}});
  for (int i = 5; i < 10; ++i) rt.backward(loss_of(resumed, i), resumed);
  const auto a = plain->parameters(), b = resumed->parameters();
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("parameter " << i);
    CHECK(at::equal(a[i], b[i]));
  }
  CHECK(resumed_opt.optimizer("0.weight").param_groups()[0].options().get_lr() == 1e-2);
  CHECK_THROWS_WITH(resumed_opt.optimizer("nope"), Catch::Matchers::Contains("'nope'"));
  CHECK_THROWS_WITH(loom::optim::OptimizerInBackward<loom::optim::AdamW>(
                        TwoProcesses{}, resumed->named_parameters(), options),
                    Catch::Matchers::Contains("the runtime runs 2 processes"));
  std::filesystem::remove_all(dir);
}
