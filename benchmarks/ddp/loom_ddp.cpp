// loom's side of the DDP benchmark (ddp_vs_python.py, docs/benchmarks.md): one rank of an MLP
// trained by loom::Runtime<Cpu, P, loom::Ddp>, started by torchrun, one thread per rank.
//
//   loom_bench_ddp --sizes 32,64,64,10 --batch 32 --steps 600 --warmup 30
//                  --precision 32-true --mode ddp|compute|comm
//
// ddp: the whole DDP step (forward, backward with the bucketed all-reduce, SGD step).
// compute: the same steps under no_sync() (no gradient all-reduce), every rank at once.
// comm: one all-reduce of a tensor as large as all gradients (fp32), per step.
// Rank 0 prints one JSON object: {"mode", "steps_per_s", "ms_per_step"}.
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>
#include <CLI/CLI.hpp>

#include <loom/dist/ddp.hpp>
#include <loom/loom.hpp>

namespace {

struct Options {
  std::string sizes = "32,64,64,10";
  int64_t batch = 32;
  int steps = 600, warmup = 30;
  std::string precision = "32-true";
  std::string mode = "ddp";
};

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
  loom::Runtime<loom::Cpu, P, loom::Ddp> rt;
  auto& s = rt.strategy();
  auto model = make_model(sizes);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  rt.setup(model, opt);
  auto sync = [&] { s.barrier(); };
  if (o.mode == "comm") {  // an all-reduce as large as every gradient, on the same group
    int64_t numel = 0;
    for (auto& p : model->parameters()) numel += p.numel();
    auto flat = torch::randn({numel});
    return seconds_for(
        o.warmup, o.steps, [&](int) { s.all_reduce(flat, loom::dist::ReduceOp::Sum); }, sync);
  }
  std::vector<torch::Tensor> xs, ys;
  for (int i = 0; i < 8; ++i) {
    xs.push_back(torch::randn({o.batch, sizes.front()}));
    ys.push_back(torch::randint(0, sizes.back(), {o.batch}, torch::kLong));
  }
  auto step = [&](int i) {
    auto loss = torch::nn::functional::cross_entropy(rt.forward(model, xs[i % 8]), ys[i % 8]);
    opt.zero_grad();
    rt.backward(loss, model);
    rt.optimizer_step(opt);
  };
  if (o.mode == "compute") {  // the same steps with the gradient all-reduce switched off
    auto guard = s.no_sync();
    return seconds_for(o.warmup, o.steps, step, sync);
  }
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
  app.add_option("--mode", o.mode)->check(CLI::IsMember({"ddp", "compute", "comm"}));
  CLI11_PARSE(app, argc, argv);
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
