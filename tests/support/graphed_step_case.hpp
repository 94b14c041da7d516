#pragma once
// The GraphedStep tests' training run (CPU and CUDA): a dropout MLP trained with fused AdamW, a
// warm-up + cosine schedule and clipping, either through loom::cuda::GraphedStep or as plain
// eager steps, from the same weights, batches and generator state.
#include <cstdint>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/functional/loss.h>
#include "support/dropout_mlp.hpp"
#include "support/same_value.hpp"

#include <loom/cuda/graphed_step.hpp>
#include <loom/loom.hpp>

namespace loom::testing {

/// What one run leaves: every step's loss, every parameter, the AdamW state and the lr.
struct GraphedRun {
  std::vector<at::Tensor> losses, params, state;
  double lr = 0;
  int64_t captured_at = -1;  // the step at which GraphedStep had captured (-1: never)
};

/// Trains dropout_mlp(2, 32, 4) `steps` steps on `device` under runtime `rt` (fresh), graphed
/// or plain; batch i is drawn from a CPU generator seeded i, so both runs see the same data.
/// `overflow`: the first batches are scaled up so that 16-mixed's first steps overflow.
template <class R>
GraphedRun graphed_run(R& rt, bool graphed, int64_t steps, bool overflow = false) {
  auto model = dropout_mlp(2, 32, 4);
  {
    torch::manual_seed(5);  // the same weights for every run
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.copy_(at::randn(p.sizes()) * 0.3);
  }
  loom::optim::AdamW opt(model->parameters(), loom::optim::AdamWOptions(1e-2).weight_decay(0.01));
  rt.setup(model, opt);
  loom::optim::WarmupCosineLR schedule(
      opt, {.warmup_steps = 5, .total_steps = steps, .warmup_start_factor = 0.2, .eta_min = 1e-4});
  const auto device = rt.device().device();
  auto batch = [&](int64_t i) {
    auto g = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(i));
    at::Tensor x = at::randn({16, 32}, g);
    if (overflow && i < 3) x = x * 3e4;
    at::Tensor y = at::randint(0, 4, {16}, g, at::kLong);
    return std::vector<at::Tensor>{x.to(device), y.to(device)};
  };
  auto one_step = [&](const std::vector<at::Tensor>& in) {
    at::Tensor loss = torch::nn::functional::cross_entropy(rt.forward(model, in[0]), in[1]);
    rt.backward(loss, model);
    rt.clip_gradients(opt, 1.0);
    rt.optimizer_step(opt);
    return loss.detach();
  };
  GraphedRun run;
  at::manual_seed(11);  // dropout's draws, CPU and CUDA
  if (graphed) {
    loom::cuda::GraphedStep step(rt, batch(0), {opt}, one_step);
    for (int64_t i = 0; i < steps; ++i) {
      run.losses.push_back(step(batch(i)).clone());
      if (step.captured() && run.captured_at < 0) run.captured_at = i;
      schedule.step();
    }
  } else {
    opt.set_tensor_lr(true);  // the same kernels; the lr written by step()
    for (int64_t i = 0; i < steps; ++i) {
      opt.zero_grad();
      run.losses.push_back(one_step(batch(i)).clone());
      schedule.step();
    }
  }
  for (const auto& p : model->parameters()) run.params.push_back(p.detach().cpu());
  for (const auto& p : model->parameters()) {
    auto& s = static_cast<loom::optim::AdamParamState&>(*opt.state().at(p.unsafeGetTensorImpl()));
    run.state.push_back(s.exp_avg().cpu());
    run.state.push_back(s.exp_avg_sq().cpu());
    run.state.push_back(s.step().cpu());
  }
  run.lr = opt.param_groups()[0].options().get_lr();
  return run;
}

/// Every loss (nan included), parameter and state tensor of `a` and `b` bitwise equal.
inline void check_same_run(const GraphedRun& a, const GraphedRun& b) {
  REQUIRE(a.losses.size() == b.losses.size());
  for (std::size_t i = 0; i < a.losses.size(); ++i) {
    INFO("step " << i);
    CHECK(difference(a.losses[i], b.losses[i]).empty());
  }
  for (std::size_t i = 0; i < a.params.size(); ++i) CHECK(at::equal(a.params[i], b.params[i]));
  for (std::size_t i = 0; i < a.state.size(); ++i) CHECK(at::equal(a.state[i], b.state[i]));
  CHECK(a.lr == b.lr);
}

}  // namespace loom::testing
