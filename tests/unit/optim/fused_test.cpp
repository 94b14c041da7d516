// loom::optim::SGD, Adam, AdamW: options, state, skipped steps, the _fused_sgd_ first-step
// overflow bug, device moves. Bitwise parity with Python is optim_parity_test.cpp.
#include "support/catch.hpp"

#include <sstream>
#include <vector>

#include <ATen/ATen.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>

#include <loom/device/optimizer_state.hpp>
#include <loom/error.hpp>
#include <loom/optim/adam.hpp>
#include <loom/optim/sgd.hpp>
#include <loom/optim/warmup_cosine_lr.hpp>

namespace {

at::Tensor param(std::vector<float> values) {
  return at::tensor(values, at::kFloat).requires_grad_();
}
at::Tensor one() { return at::ones({}, at::kFloat); }
at::Tensor zero() { return at::zeros({}, at::kFloat); }

}  // namespace

TEST_CASE("loom::optim options have Python's defaults and names", "[optim]") {
  loom::optim::SGDOptions sgd;
  CHECK(sgd.lr() == 1e-3);
  CHECK(sgd.momentum() == 0);
  CHECK(sgd.dampening() == 0);
  CHECK(sgd.weight_decay() == 0);
  CHECK_FALSE(sgd.nesterov());
  CHECK_FALSE(sgd.maximize());
  loom::optim::AdamOptions adam;
  CHECK(adam.lr() == 1e-3);
  CHECK(std::get<0>(adam.betas()) == 0.9);
  CHECK(std::get<1>(adam.betas()) == 0.999);
  CHECK(adam.eps() == 1e-8);
  CHECK(adam.weight_decay() == 0);
  CHECK_FALSE(adam.amsgrad());
  CHECK(loom::optim::AdamWOptions().weight_decay() == 1e-2);
  loom::optim::SGDOptions lr(0.5);
  lr.set_lr(0.25);  // what LibTorch's schedulers call
  CHECK(lr.get_lr() == 0.25);
}

TEST_CASE("loom::optim rejects Python's invalid options with Python's words", "[optim]") {
  auto p = param({1.f});
  using loom::optim::SGDOptions;
  CHECK_THROWS_WITH(loom::optim::SGD({p}, SGDOptions(-1)),
                    Catch::Contains("Invalid learning rate"));
  CHECK_THROWS_WITH(loom::optim::SGD({p}, SGDOptions(0.1).momentum(-0.5)),
                    Catch::Contains("Invalid momentum value"));
  CHECK_THROWS_WITH(loom::optim::SGD({p}, SGDOptions(0.1).nesterov(true)),
                    Catch::Contains("Nesterov momentum requires a momentum and zero dampening"));
  CHECK_THROWS_WITH(loom::optim::Adam({p}, loom::optim::AdamOptions(0.1).betas({1.0, 0.9})),
                    Catch::Contains("Invalid beta parameter at index 0"));
  CHECK_THROWS_WITH(loom::optim::AdamW({p}, loom::optim::AdamWOptions(0.1).eps(-1)),
                    Catch::Contains("loom::optim::AdamW: Invalid epsilon value"));
}

TEST_CASE("SGD steps in place, and zero_grad sets gradients to none", "[optim]") {
  auto p = param({1.f, 2.f});
  loom::optim::SGD opt({p}, loom::optim::SGDOptions(0.5).momentum(0.9));
  p.mutable_grad() = at::tensor({2.f, 4.f});
  opt.step();
  CHECK(at::equal(p.detach(), at::tensor({0.f, 0.f})));  // buf = grad on the first step
  auto& s = static_cast<loom::optim::SGDParamState&>(*opt.state().at(p.unsafeGetTensorImpl()));
  CHECK(at::equal(s.momentum_buffer(), at::tensor({2.f, 4.f})));
  opt.zero_grad();
  CHECK_FALSE(p.grad().defined());
  p.mutable_grad() = at::tensor({1.f, 1.f});
  opt.step();  // buf = 0.9 * buf + grad = (2.8, 4.6); p -= 0.5 * buf
  CHECK(at::allclose(p.detach(), at::tensor({-1.4f, -2.3f})));
}

TEST_CASE("A parameter without a gradient keeps its state and step count", "[optim]") {
  auto a = param({1.f});
  auto b = param({1.f});
  loom::optim::Adam opt({a, b}, loom::optim::AdamOptions(0.1));
  a.mutable_grad() = at::tensor({1.f});
  b.mutable_grad() = at::tensor({1.f});
  opt.step();
  opt.zero_grad();
  a.mutable_grad() = at::tensor({1.f});
  opt.step();
  auto step_of = [&](const at::Tensor& p) {
    auto& s = static_cast<loom::optim::AdamParamState&>(*opt.state().at(p.unsafeGetTensorImpl()));
    CHECK(s.step().scalar_type() == at::kFloat);
    CHECK(s.step().dim() == 0);
    return s.step().item<float>();
  };
  CHECK(step_of(a) == 2.f);
  CHECK(step_of(b) == 1.f);
}

TEST_CASE("A step flagged by found_inf changes nothing and does not count", "[optim]") {
  auto p = param({1.f, -1.f});
  loom::optim::AdamW opt({p}, loom::optim::AdamWOptions(0.1));
  p.mutable_grad() = at::tensor({0.5f, 0.5f});
  opt.step();
  const auto before = p.detach().clone();
  auto& s = static_cast<loom::optim::AdamParamState&>(*opt.state().at(p.unsafeGetTensorImpl()));
  const auto avg = s.exp_avg().clone();
  p.mutable_grad() = at::tensor({7.f, 7.f});
  opt.set_amp(std::nullopt, one());
  opt.step();
  CHECK(at::equal(p.detach(), before));
  CHECK(at::equal(s.exp_avg(), avg));
  CHECK(s.step().item<float>() == 1.f);
  CHECK_FALSE(opt.has_found_inf());  // step() consumed it
  opt.step();                        // the next step is a normal one again
  CHECK(s.step().item<float>() == 2.f);
  CHECK_FALSE(at::equal(p.detach(), before));
}

TEST_CASE("grad_scale unscales inside the kernel, as Python's fused step does", "[optim]") {
  auto p = param({1.f, 2.f});
  auto q = param({1.f, 2.f});
  loom::optim::SGD scaled({p}, loom::optim::SGDOptions(0.25));
  loom::optim::SGD plain({q}, loom::optim::SGDOptions(0.25));
  p.mutable_grad() = at::tensor({8.f, 16.f});  // 4x the true gradient
  q.mutable_grad() = at::tensor({2.f, 4.f});
  scaled.set_amp(at::full({}, 4.f), zero());
  scaled.step();
  plain.step();
  CHECK(at::equal(p.detach(), q.detach()));
  CHECK(at::equal(p.grad(), at::tensor({2.f, 4.f})));  // the kernel writes the unscaled grad back
  CHECK_THROWS_WITH(scaled.set_amp(at::full({}, 4.0, at::kDouble), std::nullopt),
                    Catch::Contains("f32 one-element tensors"));
}

// Python's _fused_sgd_ leaves momentum buffers uninitialised when its first step is skipped
// and uses them on the next step; loom's result equals the unfused optimizer's.
TEST_CASE("SGD with its first step skipped equals the unfused result", "[optim]") {
  for (double dampening : {0.0, 0.25}) {
    INFO("dampening " << dampening);
    auto p = param({1.f, -2.f, 3.f});
    auto ref = param({1.f, -2.f, 3.f});
    const auto options = loom::optim::SGDOptions(0.1).momentum(0.9).dampening(dampening);
    loom::optim::SGD fused({p}, options);
    torch::optim::SGD unfused({ref},
                              torch::optim::SGDOptions(0.1).momentum(0.9).dampening(dampening));
    p.mutable_grad() = at::tensor({1e30f, 1.f, 1.f});  // "overflowed": skipped
    fused.set_amp(std::nullopt, one());
    fused.step();  // the unfused side skips by not stepping at all
    CHECK(at::equal(p.detach(), ref.detach()));
    for (int i = 0; i < 3; ++i) {
      auto g = at::tensor({0.5f, -1.f, 2.f}) * (i + 1);
      p.mutable_grad() = g.clone();
      ref.mutable_grad() = g.clone();
      fused.set_amp(std::nullopt, zero());
      fused.step();
      unfused.step();
      CHECK(at::allclose(p.detach(), ref.detach(), /*rtol=*/0, /*atol=*/1e-6));
    }
  }
}

TEST_CASE("Param groups keep their own options", "[optim]") {
  auto a = param({1.f});
  auto b = param({1.f});
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{a},
                      std::make_unique<loom::optim::SGDOptions>(loom::optim::SGDOptions(0.5)));
  groups.emplace_back(std::vector<at::Tensor>{b},
                      std::make_unique<loom::optim::SGDOptions>(loom::optim::SGDOptions(0.25)));
  loom::optim::SGD opt(groups, loom::optim::SGDOptions(1.0));
  a.mutable_grad() = at::tensor({1.f});
  b.mutable_grad() = at::tensor({1.f});
  opt.step();
  CHECK(a.item<float>() == 0.5f);
  CHECK(b.item<float>() == 0.75f);
  CHECK(opt.param_groups()[1].options().get_lr() == 0.25);
}

TEST_CASE("loom's optimizer states move to a device without registration", "[optim]") {
  auto p = param({1.f, 2.f});
  loom::optim::Adam opt({p}, loom::optim::AdamOptions(0.1).amsgrad(true));
  p.mutable_grad() = at::tensor({1.f, 1.f});
  opt.step();
  loom::device::move_optimizer_state(opt, c10::Device(c10::kCPU));
  auto& s = static_cast<loom::optim::AdamParamState&>(*opt.state().at(p.unsafeGetTensorImpl()));
  CHECK(s.max_exp_avg_sq().defined());
  CHECK(s.step().device().is_cpu());
}

TEST_CASE("Sparse or mismatched gradients are refused with the reason", "[optim]") {
  auto p = param({1.f, 2.f});
  loom::optim::SGD opt({p}, loom::optim::SGDOptions(0.1));
  p.mutable_grad() = at::tensor({1.0, 1.0}, at::kDouble);
  CHECK_THROWS_WITH(opt.step(), Catch::Contains("dtype or device differs from its parameter's"));
}

TEST_CASE("torch::save and torch::load resume loom's optimizers exactly", "[optim]") {
  auto run = [](bool resume) {
    torch::manual_seed(5);
    auto p = at::randn({3}).requires_grad_();
    auto q = p.detach().clone().requires_grad_();
    loom::optim::Adam first({p}, loom::optim::AdamOptions(0.1).amsgrad(true));
    for (int i = 0; i < 3; ++i) {
      p.mutable_grad() = at::full({3}, 0.5f * (i + 1));
      first.step();
    }
    if (!resume) {
      for (int i = 3; i < 6; ++i) {
        p.mutable_grad() = at::full({3}, 0.5f * (i + 1));
        first.step();
      }
      return p.detach().clone();
    }
    std::stringstream archive;
    torch::save(first, archive);
    {
      torch::NoGradGuard no_grad;
      q.copy_(p);
    }
    loom::optim::Adam second({q}, loom::optim::AdamOptions(0.5));  // options come from the file
    torch::load(second, archive);
    CHECK(second.param_groups()[0].options().get_lr() == 0.1);
    for (int i = 3; i < 6; ++i) {
      q.mutable_grad() = at::full({3}, 0.5f * (i + 1));
      second.step();
    }
    return q.detach().clone();
  };
  CHECK(at::equal(run(false), run(true)));

  auto s = param({1.f, 2.f});
  loom::optim::SGD sgd({s}, loom::optim::SGDOptions(0.1).momentum(0.9));
  s.mutable_grad() = at::tensor({1.f, 1.f});
  sgd.step();
  std::stringstream archive;
  torch::save(sgd, archive);
  auto t = param({1.f, 2.f});
  loom::optim::SGD restored({t}, loom::optim::SGDOptions(0.2));
  torch::load(restored, archive);
  auto& buf =
      static_cast<loom::optim::SGDParamState&>(*restored.state().at(t.unsafeGetTensorImpl()));
  CHECK(at::equal(buf.momentum_buffer(), at::tensor({1.f, 1.f})));
  CHECK(restored.param_groups()[0].options().get_lr() == 0.1);
}

namespace {

/// Trains a small regression 100 steps with `Opt` under a warm-up + cosine schedule, the lr
/// passed as a tensor or as a double; returns the parameters.
template <class Opt, class Options>
std::vector<at::Tensor> train_schedule(Options options, bool tensor_lr) {
  torch::manual_seed(5);
  std::vector<at::Tensor> params{at::randn({6, 4}).requires_grad_(),
                                 at::randn({6}).requires_grad_()};
  Opt opt({torch::optim::OptimizerParamGroup({params[0]}),
           torch::optim::OptimizerParamGroup({params[1]},
                                             std::make_unique<Options>(Options(options).lr(0.3)))},
          options);
  opt.set_tensor_lr(tensor_lr);
  loom::optim::WarmupCosineLR schedule(
      opt, {.warmup_steps = 10, .total_steps = 100, .warmup_start_factor = 0.1, .eta_min = 1e-4});
  for (int step = 0; step < 100; ++step) {
    const auto x = at::randn({8, 4});
    const auto loss = (at::matmul(x, params[0].t()) + params[1]).pow(2).mean();
    opt.zero_grad();
    loss.backward();
    opt.step();
    schedule.step();
  }
  if (tensor_lr) {
    opt.update_lr_tensors();  // the schedule's last lr, written outside any step
    for (std::size_t g = 0; g < 2; ++g) {
      const at::Tensor& lr = opt.lr_tensor(g, c10::Device(c10::kCPU));
      CHECK(lr.scalar_type() == at::kDouble);
      CHECK(lr.template item<double>() == opt.param_groups()[g].options().get_lr());
    }
  }
  return {params[0].detach(), params[1].detach()};
}

}  // namespace

TEST_CASE("The lr as a tensor equals the double path bit for bit over a schedule",
          "[optim][tensor_lr]") {
  auto check = [](const auto& tensor, const auto& plain) {
    for (std::size_t i = 0; i < tensor.size(); ++i) CHECK(at::equal(tensor[i], plain[i]));
    CHECK_FALSE(at::equal(tensor[0], at::zeros_like(tensor[0])));
  };
  {
    loom::optim::AdamWOptions o(0.05);
    o.weight_decay(0.1);
    check(train_schedule<loom::optim::AdamW>(o, true),
          train_schedule<loom::optim::AdamW>(o, false));
  }
  {
    loom::optim::AdamOptions o(0.05);
    check(train_schedule<loom::optim::Adam>(o, true), train_schedule<loom::optim::Adam>(o, false));
  }
  {
    auto o = loom::optim::SGDOptions(0.05).momentum(0.9).dampening(0.1);
    check(train_schedule<loom::optim::SGD>(o, true), train_schedule<loom::optim::SGD>(o, false));
  }
}

TEST_CASE("The lr tensor follows set_lr and is written only when it changed",
          "[optim][tensor_lr]") {
  auto p = param({1.f, 2.f});
  loom::optim::SGD opt(std::vector<at::Tensor>{p}, loom::optim::SGDOptions(0.5));
  CHECK_FALSE(opt.tensor_lr());
  opt.set_tensor_lr(true);
  CHECK(opt.tensor_lr());
  const at::Tensor lr = opt.lr_tensor(0, c10::Device(c10::kCPU));
  CHECK(lr.item<double>() == 0.5);
  const auto version = lr._version();
  opt.update_lr_tensors();
  CHECK(lr._version() == version);  // unchanged: no write
  opt.param_groups()[0].options().set_lr(0.25);
  opt.update_lr_tensors();
  CHECK(lr._version() == version + 1);
  CHECK(lr.item<double>() == 0.25);
  p.mutable_grad() = at::ones({2});
  opt.step();  // the kernel reads the tensor: 1 - 0.25, 2 - 0.25
  CHECK(at::equal(p.detach(), at::tensor({0.75f, 1.75f})));
  opt.param_groups()[0].options().set_lr(1.0);
  opt.step();  // step() writes the changed lr first
  CHECK(at::equal(p.detach(), at::tensor({-0.25f, 0.75f})));
  CHECK(opt.lr_tensor(0, c10::Device(c10::kCPU)).item<double>() == 1.0);
}
