// What sharding saves, per rank: parameters, gradients and optimizer state held by each rank,
// and the step time, for loom::Ddp, loom::Zero stage 1 and stage 2 and loom::Fsdp. One strategy
// per launch (fsdp_keep: Fsdp with reshard_after_forward off); zero_memory.py runs them side
// by side at 2 and 4 ranks (docs/memory.md).
//
//   torchrun --standalone --nproc-per-node=2 --no-python loom_bench_zero --strategy fsdp
//            [--layers 8] [--width 1600] [--batch 32] [--steps 12] [--bucket-mib 4]
//            [--limit-mib N]
//
// The model: Linear(width, width) x layers, Tanh between them (8 x 1600: 20.5 M parameters;
// 20 x 1600: 51.2 M), each Linear a loom::FsdpUnit (Fsdp's units; a plain Linear under the
// other strategies), fused AdamW. --limit-mib: the counting allocator refuses to hold more
// (a rank's memory limit); a run that hits it prints {"strategy": ..., "out_of_memory": ...}. After
// each step (gradients still held, before zero_grad) every rank counts the bytes of the module's
// parameters, of the gradients it holds and of its optimizer state (loom's optimizer table names
// the state tensors); the peak is the counting CPU allocator's highest total during the step
// (forward, backward, reduction, step). Rank 0 prints one JSON line: the largest figure of any
// rank, the step time (the median of --steps after 2 warm-ups).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <loom/loom.hpp>

#include "../common/counting_allocator.hpp"

namespace {

using loom::bench::CountingAllocator;

std::string flag(int argc, char** argv, const std::string& name, const std::string& fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (name == argv[i]) return argv[i + 1];
  }
  return fallback;
}

/// Bytes of parameters, held gradients and optimizer state on this rank.
std::vector<std::int64_t> held(torch::nn::Module& model, const torch::optim::Optimizer& opt) {
  std::int64_t params = 0, grads = 0, state = 0;
  for (const auto& p : model.parameters()) {
    params += p.nbytes();
    if (p.grad().defined()) grads += p.grad().nbytes();
  }
  const auto* info = loom::optim::find_optimizer(opt);
  for (const auto& entry : opt.state()) {
    c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
    info->save_state(*entry.second, d);
    for (const auto& item : d) {
      if (item.value().isTensor()) state += item.value().toTensor().nbytes();
    }
  }
  return {params, grads, state};
}

template <class R, class M>
int train(R& rt, M& model, loom::optim::AdamW& opt, const std::string& name, int argc, char** argv);

template <class S>
int run(S strategy, const std::string& name, int argc, char** argv) {
  const int layers = std::stoi(flag(argc, argv, "--layers", "8"));
  const int width = std::stoi(flag(argc, argv, "--width", "1600"));
  CountingAllocator& counter = CountingAllocator::instance();
  c10::SetCPUAllocator(&counter, /*priority=*/1);
  loom::Runtime<loom::Cpu, loom::Fp32, S> rt(loom::Cpu{}, loom::Fp32{}, std::move(strategy));
  torch::manual_seed(0);
  torch::nn::Sequential model;
  for (int i = 0; i < layers; ++i) {
    if (i > 0) model->push_back(torch::nn::Tanh());
    model->push_back(loom::FsdpUnit<torch::nn::Linear>(width, width));
  }
  loom::optim::AdamW opt(model->parameters(), loom::optim::AdamWOptions(1e-4));
  counter.set_limit(std::stoll(flag(argc, argv, "--limit-mib", "0")) << 20);
  auto& s = rt.strategy();
  try {
    rt.setup(model, opt);
    return train(rt, model, opt, name, argc, argv);
  } catch (const std::exception& e) {
    // The limit (through the autograd engine or a collective, perhaps rewrapped): this rank
    // reports, the others may wait for it in a collective (torchrun's agent ends them when
    // this one exits).
    const std::string what = e.what();
    if (what.find("exceed the limit") == std::string::npos) throw;
    std::printf(
        "{\"strategy\": \"%s\", \"world\": %d, \"rank\": %d, \"out_of_memory\": "
        "\"the counting allocator's limit\"}\n",
        name.c_str(), s.world_size(), s.rank());
    std::fflush(stdout);
    std::_Exit(3);
  }
}

template <class R, class M>
int train(R& rt, M& model, loom::optim::AdamW& opt, const std::string& name, int argc,
          char** argv) {
  const int width = std::stoi(flag(argc, argv, "--width", "1600"));
  const int batch = std::stoi(flag(argc, argv, "--batch", "32"));
  const int steps = std::stoi(flag(argc, argv, "--steps", "12"));
  CountingAllocator& counter = CountingAllocator::instance();
  auto& s = rt.strategy();
  torch::manual_seed(1 + s.rank());
  const at::Tensor x = at::randn({batch, width});
  const at::Tensor y = at::randn({batch, width});
  std::vector<double> times;
  std::int64_t peak = 0;
  std::vector<std::int64_t> figures;
  for (int i = 0; i < steps + 2; ++i) {
    opt.zero_grad();
    s.barrier();
    counter.reset_peak();
    const auto t0 = std::chrono::steady_clock::now();
    auto loss = torch::nn::functional::mse_loss(rt.forward(model, x), y);
    rt.backward(loss, model);
    rt.optimizer_step(opt);
    const auto t1 = std::chrono::steady_clock::now();
    if (i < 2) continue;
    peak = std::max(peak, counter.peak());
    figures = held(*model, opt);
    times.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::sort(times.begin(), times.end());
  figures.push_back(peak);
  auto all = s.all_gather(at::tensor(figures, at::kLong));
  const auto most = at::stack(all).amax(0).contiguous();
  const std::int64_t* m = most.template data_ptr<std::int64_t>();
  const std::int64_t params = m[0];
  if (s.rank() == 0) {
    std::int64_t count = 0;
    for (const auto& p : model->parameters()) count += p.numel();
    std::printf(
        "{\"strategy\": \"%s\", \"world\": %d, \"parameters\": %lld, \"parameter_bytes\": %lld, "
        "\"gradient_bytes\": %lld, \"state_bytes\": %lld, \"peak_bytes\": %lld, "
        "\"step_ms\": %.2f}\n",
        name.c_str(), s.world_size(), static_cast<long long>(count), static_cast<long long>(params),
        static_cast<long long>(m[1]), static_cast<long long>(m[2]), static_cast<long long>(m[3]),
        times[times.size() / 2]);
  }
  rt.teardown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string strategy = flag(argc, argv, "--strategy", "ddp");
    if (strategy == "ddp") return run(loom::Ddp(), strategy, argc, argv);
    if (strategy == "fsdp") return run(loom::Fsdp(), strategy, argc, argv);
    if (strategy == "fsdp_keep") {  // reshard_after_forward off: one all-gather a unit a step
      loom::FsdpOptions keep;
      keep.reshard_after_forward = false;
      return run(loom::Fsdp(keep), strategy, argc, argv);
    }
    loom::ZeroOptions o;
    o.bucket_bytes = static_cast<std::size_t>(std::stoi(flag(argc, argv, "--bucket-mib", "4")))
                     << 20;
    const std::string collective = flag(argc, argv, "--collective", "automatic");
    if (collective == "reduce") o.gradient_collective = loom::ZeroCollective::Reduce;
    if (collective == "all_reduce") o.gradient_collective = loom::ZeroCollective::AllReduce;
    if (strategy == "zero1" || strategy == "zero2") {
      o.stage = strategy == "zero1" ? 1 : 2;
      return run(loom::Zero(o), strategy, argc, argv);
    }
    std::fprintf(stderr,
                 "loom_bench_zero: --strategy is ddp, zero1, zero2, fsdp or fsdp_keep, not %s\n",
                 strategy.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom_bench_zero: %s\n", e.what());
    return 1;
  }
}
