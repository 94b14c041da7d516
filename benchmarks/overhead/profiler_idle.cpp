// What loom::Profiler costs a training step while it does not record (docs/toolbox.md,
// "Profiler"): a tiny MLP step (Linear(32, 64), ReLU, Linear(64, 10), batch 16, fused AdamW,
// one thread) timed plain, and with a profiler whose schedule is waiting (prof.step() each
// step: the schedule, the ProfilerStep#N scope) and a loom::RecordFunction scope around the
// forward; then, for scale, recording every step. Rounds alternate the ways; each round's
// figure is the median step of its block of steps.
//
//   loom_bench_profiler_idle [--rounds R] [--steps N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <loom/loom.hpp>
#include <loom/profiler.hpp>

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 7, steps = 2000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--rounds") == 0) rounds = std::stoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--steps") == 0) steps = std::stoi(argv[i + 1]);
  }
  at::set_num_threads(1);
  torch::manual_seed(0);
  loom::Runtime<loom::Cpu, loom::Fp32> rt(loom::Cpu{}, loom::Fp32{});
  torch::nn::Sequential model(torch::nn::Linear(32, 64), torch::nn::ReLU(),
                              torch::nn::Linear(64, 10));
  loom::optim::AdamW opt(model->parameters(), loom::optim::AdamWOptions(1e-3));
  rt.setup(model, opt);
  const auto x = torch::randn({16, 32});
  const auto y = torch::randint(0, 10, {16});
  // 0: plain; 1: an idle profiler; 2: recording every step (one window, never written).
  auto block = [&](int way) {
    std::vector<double> us;
    us.reserve(static_cast<std::size_t>(steps));
    std::optional<loom::Profiler> prof;
    if (way == 1) {
      prof.emplace(loom::ProfilerOptions{
          .schedule = loom::ProfilerSchedule{.wait = 1 << 30, .warmup = 1, .active = 1}});
    }
    if (way == 2) prof.emplace(loom::ProfilerOptions{.cuda = false});
    if (prof) prof->start();
    for (int s = 0; s < steps; ++s) {
      const auto t0 = Clock::now();
      opt.zero_grad();
      torch::Tensor loss;
      if (prof) {
        loom::RecordFunction scope("forward");
        loss = torch::nn::functional::cross_entropy(rt.forward(model, x), y);
      } else {
        loss = torch::nn::functional::cross_entropy(rt.forward(model, x), y);
      }
      rt.backward(loss, model);
      rt.optimizer_step(opt);
      if (prof) prof->step();
      us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    if (prof) prof->stop();
    return median(us);
  };
  // The idle profiler's own cost, alone: a step() and a RecordFunction scope, a million times.
  {
    loom::Profiler idle_only(loom::ProfilerOptions{
        .schedule = loom::ProfilerSchedule{.wait = 1 << 30, .warmup = 1, .active = 1}});
    idle_only.start();
    const int n = 1000000;
    const auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) {
      loom::RecordFunction scope("forward");
      idle_only.step();
    }
    const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / n;
    idle_only.stop();
    std::printf("an idle step() and RecordFunction scope: %.1f ns\n", ns);
  }
  block(0);  // warm-up
  std::vector<double> plain, idle, active;
  for (int r = 0; r < rounds; ++r) {
    plain.push_back(block(0));
    idle.push_back(block(1));
    if (r < 2) active.push_back(block(2));
  }
  std::printf("tiny MLP step, %d rounds of %d steps (median step of each round)\n", rounds, steps);
  std::printf("plain:              %8.2f us (rounds %.2f-%.2f)\n", median(plain),
              *std::min_element(plain.begin(), plain.end()),
              *std::max_element(plain.begin(), plain.end()));
  std::printf("profiler idle:      %8.2f us (rounds %.2f-%.2f)\n", median(idle),
              *std::min_element(idle.begin(), idle.end()),
              *std::max_element(idle.begin(), idle.end()));
  std::printf("profiler recording: %8.2f us\n", median(active));
  std::printf("idle / plain: %.4f (median of the rounds' ratios %.4f)\n",
              median(idle) / median(plain), [&] {
                std::vector<double> r;
                for (std::size_t i = 0; i < plain.size(); ++i) r.push_back(idle[i] / plain[i]);
                return median(r);
              }());
  std::printf("recording / plain: %.2f\n", median(active) / median(plain));
  return 0;
}
