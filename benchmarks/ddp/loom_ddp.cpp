// loom's side of the DDP benchmark (ddp_vs_python.py, docs/benchmarks.md): one rank of an MLP
// trained by loom::Runtime<Cpu, P, loom::Ddp>, started by torchrun, one thread per rank.
//
//   loom_bench_ddp --sizes 32,64,64,10 --batch 32 --steps 600 --warmup 30
//                  --precision 32-true --mode ddp|nosync|buckets|stop [--accumulate K]
//                  [--comm-hook none|fp16|bf16] [--pin]
//
// ddp: the whole DDP step (forward, backward with the bucketed all-reduce, SGD step); with
//   --accumulate K, K micro-batches of the batch, the first K - 1 under rt.no_backward_sync.
// nosync: the same steps, every backward under rt.no_backward_sync (no gradient all-reduce).
// buckets: the all-reduces alone: one fp32 tensor per bucket of the reducer's plan (c10d's
//   compute_bucket_assignment_by_size over the gradients in ready order, 1 MiB then 25 MiB
//   buckets), each all-reduced and waited for in turn, per step.
// stop: loom::StopSignal::should_stop(rt) alone, what a preemption check at every step costs
//   (one int all-reduced with Max and read back).
// --pin: this rank's threads on its half of the machine's cores (sched_setaffinity).
// Rank 0 prints one JSON object: {"mode", "steps_per_s", "ms_per_step"}.
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>
#include <CLI/CLI.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include <loom/dist/ddp.hpp>
#include <loom/dist/stop_signal.hpp>
#include <loom/loom.hpp>

namespace {

struct Options {
  std::string sizes = "32,64,64,10";
  int64_t batch = 32;
  int steps = 600, warmup = 30;
  std::string precision = "32-true";
  std::string mode = "ddp";
  int accumulate = 1;
  std::string comm_hook = "none";
  bool pin = false;
};

/// This rank's half (of world_size parts) of the cores, for its compute and gloo threads.
void pin_to_share(int local_rank, int local_world) {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  const int share = std::max(1, cores / std::max(1, local_world));
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c = local_rank * share; c < (local_rank + 1) * share && c < cores; ++c) CPU_SET(c, &set);
  sched_setaffinity(0, sizeof(set), &set);
}

torch::nn::Sequential make_model(const std::vector<int64_t>& sizes) {
  torch::nn::Sequential m;
  for (std::size_t i = 0; i + 1 < sizes.size(); ++i) {
    m->push_back(torch::nn::Linear(sizes[i], sizes[i + 1]));
    if (i + 2 < sizes.size()) m->push_back(torch::nn::ReLU());
  }
  return m;
}

using Clock = std::chrono::steady_clock;

/// Times `steps` calls of `step` after `warmup`, between two barriers of `sync`.
template <class Step, class Sync>
double seconds_for(int warmup, int steps, Step&& step, Sync&& sync) {
  for (int i = 0; i < warmup; ++i) step(i);
  sync();
  auto t0 = Clock::now();
  for (int i = 0; i < steps; ++i) step(i);
  sync();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

template <class P>
double run(const Options& o, const std::vector<int64_t>& sizes) {
  loom::DdpOptions ddp_options;
  ddp_options.comm_hook = loom::CommHook::parse(o.comm_hook);
  loom::Runtime<loom::Cpu, P, loom::Ddp> rt(loom::Cpu{}, P{}, loom::Ddp(ddp_options));
  auto& s = rt.strategy();
  auto model = make_model(sizes);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  rt.setup(model, opt);
  auto sync = [&] { s.barrier(); };
  if (o.mode == "buckets") {        // the reducer's buckets, all-reduced alone
    std::vector<at::Tensor> ready;  // gradients become ready from the last layer back
    for (auto& p : model->parameters()) ready.insert(ready.begin(), p);
    std::vector<bool> sparse(ready.size(), false);
    auto plan = std::get<0>(c10d::compute_bucket_assignment_by_size(
        ready,
        {static_cast<std::size_t>(c10d::kDefaultFirstBucketBytes),
         static_cast<std::size_t>(c10d::kDefaultBucketBytesCap)},
        sparse));
    std::vector<torch::Tensor> buckets;
    for (const auto& bucket : plan) {
      int64_t numel = 0;
      for (auto i : bucket) numel += ready[i].numel();
      buckets.push_back(torch::randn({numel}));
    }
    return seconds_for(
        o.warmup, o.steps,
        [&](int) {
          for (auto& b : buckets) s.all_reduce(b, loom::dist::ReduceOp::Sum);
        },
        sync);
  }
  if (o.mode == "stop") {
    loom::StopSignal stop;
    int stops = 0;
    const double secs = seconds_for(
        o.warmup, o.steps, [&](int) { stops += stop.should_stop(rt) ? 1 : 0; }, sync);
    if (stops != 0) throw loom::Error("a stop signal arrived during the benchmark");
    return secs;
  }
  std::vector<torch::Tensor> xs, ys;
  for (int i = 0; i < 8; ++i) {
    xs.push_back(torch::randn({o.batch, sizes.front()}));
    ys.push_back(torch::randint(0, sizes.back(), {o.batch}, torch::kLong));
  }
  const bool nosync = o.mode == "nosync";
  const int k = o.accumulate;
  auto step = [&](int i) {
    opt.zero_grad();
    if (k == 1) {
      auto scope = rt.no_backward_sync(model, nosync);
      rt.backward(torch::nn::functional::cross_entropy(rt.forward(model, xs[i % 8]), ys[i % 8]),
                  model);
    } else {
      auto micro = loom::split_microbatches(std::make_tuple(xs[i % 8], ys[i % 8]), k);
      for (int j = 0; j < k; ++j) {
        auto scope = rt.no_backward_sync(model, nosync || j + 1 < k);
        const auto& [x, y] = micro[static_cast<std::size_t>(j)];
        rt.backward(torch::nn::functional::cross_entropy(rt.forward(model, x), y) / k, model);
      }
    }
    rt.optimizer_step(opt);
  };
  return seconds_for(o.warmup, o.steps, step, sync);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"One rank of loom's DDP benchmark.", "loom_bench_ddp"};
  app.add_option("--sizes", o.sizes);
  app.add_option("--batch", o.batch);
  app.add_option("--steps", o.steps);
  app.add_option("--warmup", o.warmup);
  app.add_option("--precision", o.precision)->check(CLI::IsMember({"32-true", "bf16-mixed"}));
  app.add_option("--mode", o.mode)->check(CLI::IsMember({"ddp", "nosync", "buckets", "stop"}));
  app.add_option("--accumulate", o.accumulate)->check(CLI::PositiveNumber);
  app.add_option("--comm-hook", o.comm_hook)->check(CLI::IsMember({"none", "fp16", "bf16"}));
  app.add_flag("--pin", o.pin);
  CLI11_PARSE(app, argc, argv);
  if (o.pin) {
    const auto env = loom::dist::read_environment();
    const char* local_world = std::getenv("LOCAL_WORLD_SIZE");
    pin_to_share(env.local_rank, local_world ? std::atoi(local_world) : env.world_size);
  }
  std::vector<int64_t> sizes;
  std::stringstream ss(o.sizes);
  for (std::string part; std::getline(ss, part, ',');) sizes.push_back(std::stoll(part));
  at::set_num_threads(1);
  torch::manual_seed(0);
  try {
    double secs =
        o.precision == "32-true" ? run<loom::Fp32>(o, sizes) : run<loom::Bf16Mixed>(o, sizes);
    if (loom::dist::read_environment().rank == 0) {
      std::printf("{\"mode\": \"%s\", \"steps_per_s\": %.3f, \"ms_per_step\": %.4f}\n",
                  o.mode.c_str(), o.steps / secs, 1000.0 * secs / o.steps);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom_bench_ddp: %s\n", e.what());
    return 1;
  }
  return 0;
}
