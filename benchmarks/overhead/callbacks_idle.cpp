// What loom::WithCallbacks costs a training step: a tiny MLP step (Linear(32, 64), ReLU,
// Linear(64, 10), batch 16, fused AdamW, one thread) timed on a plain Runtime, on a
// WithCallbacks whose callbacks take no event (every event compiles away: the same step), with
// NaNMonitor (a flag vector per backward: three operators; one read every 100 backwards) and
// with LRMonitor (a log_dict per step, no logger added). Rounds alternate the ways; each
// round's figure is the median step of its block.
//
//   loom_bench_callbacks_idle [--rounds R] [--steps N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <loom/callbacks.hpp>
#include <loom/loom.hpp>

namespace {

using Clock = std::chrono::steady_clock;
using Plain = loom::Runtime<loom::Cpu, loom::Fp32>;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Quiet {};  // a callback that takes no event

/// A model, an optimizer and a runtime `rt`; step() is one training step.
template <class R>
struct Setup {
  R rt;
  torch::nn::Sequential model{torch::nn::Linear(32, 64), torch::nn::ReLU(),
                              torch::nn::Linear(64, 10)};
  loom::optim::AdamW opt{model->parameters(), loom::optim::AdamWOptions(1e-3)};
  torch::Tensor x = torch::randn({16, 32});
  torch::Tensor y = torch::randint(0, 10, {16});

  explicit Setup(R runtime) : rt(std::move(runtime)) { rt.setup(model, opt); }

  double block(int steps) {
    std::vector<double> us;
    us.reserve(static_cast<std::size_t>(steps));
    for (int s = 0; s < steps; ++s) {
      const auto t0 = Clock::now();
      opt.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(rt.forward(model, x), y);
      rt.backward(loss, model);
      rt.optimizer_step(opt);
      us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    return median(us);
  }
};

}  // namespace

int main(int argc, char** argv) {
  int rounds = 7, steps = 2000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--rounds") == 0) rounds = std::stoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--steps") == 0) steps = std::stoi(argv[i + 1]);
  }
  at::set_num_threads(1);
  torch::manual_seed(0);
  using Idle = loom::WithCallbacks<Plain, Quiet>;
  using NaN = loom::WithCallbacks<Plain, loom::NaNMonitor>;
  using LR = loom::WithCallbacks<Plain, loom::LRMonitor>;
  static_assert(!Idle::handles<"on_after_backward"> && !Idle::handles<"on_before_optimizer_step">);
  Setup<Plain> plain_setup(Plain{});
  Setup<Idle> idle_setup(Idle(Plain{}, Quiet{}));
  Setup<NaN> nan_setup(NaN(Plain{}, loom::NaNMonitor({.interval = 100})));
  Setup<LR> lr_setup(LR(Plain{}, loom::LRMonitor({.interval = 1})));
  std::printf("sizeof: Runtime %zu, WithCallbacks<Runtime, Quiet> %zu\n", sizeof(Plain),
              sizeof(Idle));
  plain_setup.block(steps);  // warm-up
  std::vector<double> plain, idle, nan, lr;
  for (int r = 0; r < rounds; ++r) {
    plain.push_back(plain_setup.block(steps));
    idle.push_back(idle_setup.block(steps));
    nan.push_back(nan_setup.block(steps));
    lr.push_back(lr_setup.block(steps));
  }
  auto ratio = [&](const std::vector<double>& v) {
    std::vector<double> r;
    for (std::size_t i = 0; i < plain.size(); ++i) r.push_back(v[i] / plain[i]);
    return median(r);
  };
  auto row = [&](const char* name, const std::vector<double>& v) {
    std::printf("%-24s %8.2f us (rounds %.2f-%.2f), / plain %.4f\n", name, median(v),
                *std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end()),
                ratio(v));
  };
  std::printf(
      "tiny MLP step, %d rounds of %d steps (median step of each round; / plain: the "
      "median of the rounds' ratios)\n",
      rounds, steps);
  row("plain Runtime:", plain);
  row("callbacks, no events:", idle);
  row("NaNMonitor (100):", nan);
  row("LRMonitor (1):", lr);
  return 0;
}
