// loom::Published's costs (docs/embedding.md): a learner thread training a medium MLP with
// fused AdamW and an actor thread running it on one observation at a time, one intra-op thread
// each (two cores, two threads).
//
//   publish      one publish() against a plain copy_ of every parameter into tensors of its own
//                (the learner alone, no actor): the cost of the atomics and the slot search
//   off / on     the actor's latency (latest() + forward, p50 and p99) and the learner's steps
//                per second, without publishing (the actor runs version 0) and with a publish
//                after every step; and on: the time from a publish() returning to the actor's
//                first forward of that version (weights visible), p50 and p99
//
//   loom_bench_published [--seconds S] [--rounds R] [--width W]
//
// Rounds alternate off and on; each figure is the median over rounds. Prints one line a figure
// ("name value"), read by benchmarks/published/compare.py.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <torch/torch.h>

#include <loom/optim/adam.hpp>
#include <loom/published.hpp>

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1))];
}

double median(std::vector<double> v) { return quantile(std::move(v), 0.5); }

torch::nn::Sequential mlp(int64_t width) {
  return torch::nn::Sequential(torch::nn::Linear(256, width), torch::nn::ReLU(),
                               torch::nn::Linear(width, width), torch::nn::ReLU(),
                               torch::nn::Linear(width, 256));
}

struct Round {
  double p50_us = 0, p99_us = 0, steps_per_s = 0, visible_p50_us = 0, visible_p99_us = 0;
};

Round run(int64_t width, double seconds, bool publishing, bool with_actor = true) {
  torch::manual_seed(0);
  auto model = mlp(width);
  loom::optim::AdamW opt(model->parameters(), loom::optim::AdamWOptions(1e-4));
  loom::Published<torch::nn::Sequential> published(model);
  const at::Tensor x = torch::randn({64, 256}), y = torch::randn({64, 256});

  // Each version's publish time (the learner's clock at publish() return).
  std::vector<Clock::time_point> published_at(1 << 20);
  published_at[0] = Clock::now();
  std::atomic<bool> done{false};
  std::vector<double> latencies, visible;
  std::thread actor([&] {
    if (!with_actor) return;
    at::set_num_threads(1);
    c10::InferenceMode guard;
    const at::Tensor obs = torch::randn({1, 256});
    int64_t last = 0;
    latencies.reserve(1 << 20);
    visible.reserve(1 << 16);
    while (!done.load(std::memory_order_acquire)) {
      const auto t0 = Clock::now();
      auto snap = published.latest();
      at::Tensor out = snap->forward(obs);
      const auto t1 = Clock::now();
      latencies.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      if (snap.version() != last) {
        last = snap.version();
        // The version was published before latest() returned it: its time is set.
        visible.push_back(std::chrono::duration<double, std::micro>(
                              t0 - published_at[static_cast<std::size_t>(last)])
                              .count());
      }
    }
  });
  at::set_num_threads(1);
  const auto start = Clock::now();
  int64_t steps = 0;
  while (seconds_since(start) < seconds) {
    opt.zero_grad();
    torch::mse_loss(model->forward(x), y).backward();
    opt.step();
    ++steps;
    if (publishing && steps < static_cast<int64_t>(published_at.size())) {
      // The time is written before the version is: the actor reads it after latest().
      published_at[static_cast<std::size_t>(steps)] = Clock::now();
      published.publish(model);
    }
  }
  const double elapsed = seconds_since(start);
  done.store(true, std::memory_order_release);
  actor.join();
  Round r;
  r.p50_us = quantile(latencies, 0.5);
  r.p99_us = quantile(latencies, 0.99);
  r.steps_per_s = static_cast<double>(steps) / elapsed;
  r.visible_p50_us = quantile(visible, 0.5);
  r.visible_p99_us = quantile(visible, 0.99);
  return r;
}

// One publish() against the same copies by hand, the learner alone.
std::pair<double, double> publish_cost(int64_t width, int reps) {
  auto model = mlp(width);
  loom::Published<torch::nn::Sequential> published(model);
  std::vector<at::Tensor> src, dst, dst2;
  for (const auto& p : model->parameters()) {
    src.push_back(p.detach());
    dst.push_back(torch::empty_like(p));
    dst2.push_back(torch::empty_like(p));
  }
  at::set_num_threads(1);
  std::vector<double> plain, plain2, pub;
  for (int round = 0; round < 9; ++round) {
    auto t = Clock::now();
    for (int i = 0; i < reps; ++i) {
      for (std::size_t k = 0; k < src.size(); ++k) dst[k].copy_(src[k]);
    }
    plain.push_back(seconds_since(t) / reps * 1e6);
    t = Clock::now();
    for (int i = 0; i < reps; ++i) {
      auto& d = i % 2 == 0 ? dst : dst2;
      for (std::size_t k = 0; k < src.size(); ++k) d[k].copy_(src[k]);
    }
    plain2.push_back(seconds_since(t) / reps * 1e6);
    t = Clock::now();
    for (int i = 0; i < reps; ++i) published.publish(model);
    pub.push_back(seconds_since(t) / reps * 1e6);
  }
  std::printf("copy_two_us %.1f\n", median(plain2));
  return {median(plain), median(pub)};
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 3.0;
  int rounds = 3;
  int64_t width = 1024;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--seconds") == 0) seconds = std::stod(argv[i + 1]);
    if (std::strcmp(argv[i], "--rounds") == 0) rounds = std::stoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--width") == 0) width = std::stoll(argv[i + 1]);
  }
  const auto [plain_us, publish_us] = publish_cost(width, 200);
  std::printf("copy_us %.1f\npublish_us %.1f\npublish_over_copy %.3f\n", plain_us, publish_us,
              publish_us / plain_us);
  std::vector<double> off_p50, off_p99, off_sps, on_p50, on_p99, on_sps, vis50, vis99, alone_off,
      alone_on;
  for (int r = 0; r < rounds; ++r) {
    alone_off.push_back(run(width, seconds, false, false).steps_per_s);
    alone_on.push_back(run(width, seconds, true, false).steps_per_s);
    const Round off = run(width, seconds, false);
    const Round on = run(width, seconds, true);
    off_p50.push_back(off.p50_us);
    off_p99.push_back(off.p99_us);
    off_sps.push_back(off.steps_per_s);
    on_p50.push_back(on.p50_us);
    on_p99.push_back(on.p99_us);
    on_sps.push_back(on.steps_per_s);
    vis50.push_back(on.visible_p50_us);
    vis99.push_back(on.visible_p99_us);
  }
  std::printf("actor_p50_us_off %.1f\nactor_p99_us_off %.1f\n", median(off_p50), median(off_p99));
  std::printf("actor_p50_us_on %.1f\nactor_p99_us_on %.1f\n", median(on_p50), median(on_p99));
  std::printf("learner_steps_per_s_off %.2f\nlearner_steps_per_s_on %.2f\n", median(off_sps),
              median(on_sps));
  std::printf("learner_alone_steps_per_s_off %.2f\nlearner_alone_steps_per_s_on %.2f\n",
              median(alone_off), median(alone_on));
  std::printf("visible_p50_us %.1f\nvisible_p99_us %.1f\n", median(vis50), median(vis99));
  std::printf("p99_on_over_off %.3f\nsteps_on_over_off %.3f\nalone_steps_on_over_off %.3f\n",
              median(on_p99) / median(off_p99), median(on_sps) / median(off_sps),
              median(alone_on) / median(alone_off));
  return 0;
}
