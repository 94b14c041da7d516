// Data parallelism: the quick start's MLP learns Fashion-MNIST on several processes through
// loom::Runtime<Device, Precision, loom::Ddp>, each rank on its share of the data.
//
//   torchrun --nproc-per-node=2 --no-python ddp --data build/data/fashion-mnist
//            [--device cpu] [--precision 32-true] [--epochs 1] [--max-steps N]
//            [--batch-size 64] [--lr 1e-3] [--accumulate 1] [--comm-hook none]
//            [--checkpoint-dir DIR [--checkpoint-every 100] [--keep 3] [--async-save]]
//
// Also runs started by hand (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set on every rank),
// and as one process with none of them set. loom::Ddp reads torchrun's environment, connects
// gloo (CPU) or NCCL (CUDA), broadcasts rank 0's weights and averages the gradients in
// backward; a loom::DistributedSampler gives each rank Python's share of the data. The loss
// on the progress bar (rank 0's) and the test accuracy are averaged over the ranks. Exits 1 if
// the model did not learn (accuracy below 70%), 2 on an error such as a rank that died.
//
// --checkpoint-dir DIR: every --checkpoint-every steps the ranks save the whole state (model,
// optimizer, every rank's RNG, the sampler's epoch and position, the step) to DIR/step-N.pt
// (loom::Checkpoints, rank 0 writes, the newest --keep kept), and the final state to
// DIR/final.pt; --async-save writes the periodic ones in a background thread. Started on a
// DIR that holds a checkpoint, the run resumes from it: after a
// torchrun restart (--max-restarts) too, so a killed worker costs the steps since the last
// save and the run ends with the bits of one that never stopped. SIGTERM, SIGINT or SIGUSR1
// on any rank (a preemption) makes every rank save the same step and exit with 128 + the
// signal (143 for SIGTERM). Under torchrun a worker dies with its agent (loom::Ddp).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <tuple>

#include <torch/data/dataloader.h>
#include <torch/data/datasets/map.h>
#include <torch/data/datasets/mnist.h>
#include <torch/data/transforms/stack.h>
#include <torch/data/transforms/tensor.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <CLI/CLI.hpp>

#include <loom/dist/ddp.hpp>
#include <loom/dist/rank_zero.hpp>
#include <loom/dist/stop_signal.hpp>
#include <loom/loom.hpp>
#include <loom/state/checkpoints.hpp>

#include <loom/loggers/progress_bar.hpp>
#include "common/checkpoint_flags.hpp"

namespace {

struct Options {
  std::string data = "data/fashion-mnist";
  std::string device = "cpu";
  std::string precision = "32-true";
  int epochs = 1;
  int64_t max_steps = -1;
  int64_t batch_size = 64;
  double lr = 1e-3;
  int64_t accumulate = 1;
  std::string comm_hook = "none";
  examples::CheckpointFlags checkpoints;
};

struct Outcome {
  double accuracy = 0;
  int stopped = 0;  // the exit code of a run a signal stopped (128 + the signal), else 0
};

auto dataset(const std::string& root, torch::data::datasets::MNIST::Mode mode) {
  return torch::data::datasets::MNIST(root, mode)
      .map(torch::data::transforms::Normalize<>(0.2860, 0.3530))
      .map(torch::data::transforms::Stack<>());
}

/// The mean over the ranks of a number each rank has.
template <class S>
double mean_over_ranks(S& strategy, double value) {
  auto t = torch::tensor({value}, torch::kDouble);
  strategy.all_reduce(t, loom::dist::ReduceOp::Mean);
  return t.item<double>();
}

template <class RT>
Outcome train_and_evaluate(RT& rt, const Options& o) {
  using Mode = torch::data::datasets::MNIST::Mode;
  auto& s = rt.strategy();
  torch::nn::Sequential model(torch::nn::Flatten(), torch::nn::Linear(28 * 28, 256),
                              torch::nn::ReLU(), torch::nn::Linear(256, 10));
  loom::optim::Adam opt(model->parameters(), loom::optim::AdamOptions(o.lr));  // fused
  rt.setup(model, opt);  // every rank now holds rank 0's weights

  auto train_set = dataset(o.data, Mode::kTrain);
  const auto n_train = *train_set.size();
  // Each rank's share, shuffled by epoch from a seed of its own; the loader draws from this
  // sampler itself (SamplerRef), so a checkpoint holds its epoch and position.
  loom::DistributedSampler sampler(n_train, s);
  auto loader = torch::data::make_data_loader(std::move(train_set), loom::SamplerRef(sampler),
                                              torch::data::DataLoaderOptions(o.batch_size));
  loom::dist::rank_zero_print(s, "training on " + std::to_string(s.world_size()) + " rank(s), " +
                                     std::to_string(sampler.num_samples()) + " of " +
                                     std::to_string(n_train) + " images each, " +
                                     std::string(RT::precision_name()) + " on " +
                                     std::string(rt.device().name()) + ", backend " +
                                     std::string(s.backend()) + ", comm hook " + o.comm_hook);
  const auto per_epoch =
      static_cast<int64_t>((sampler.num_samples() + o.batch_size - 1) / o.batch_size);
  int64_t total_steps = o.epochs * per_epoch;
  if (o.max_steps >= 0) total_steps = std::min(total_steps, o.max_steps);

  int64_t step = 0;
  loom::State state{
      {"model", model}, {"optimizer", opt}, {"runtime", rt}, {"sampler", sampler}, {"step", step}};
  std::optional<loom::Checkpoints> ckpt;
  if (!o.checkpoints.dir.empty()) {
    ckpt.emplace(o.checkpoints.dir, loom::CheckpointsOptions{.keep_last = o.checkpoints.keep});
    if (auto resumed = ckpt->resume(rt, state)) {  // every rank reads the newest checkpoint
      loom::dist::rank_zero_print(s, "resumed from " + ckpt->path(*resumed).string() + " at step " +
                                         std::to_string(step) + " (restart " +
                                         std::to_string(s.environment().restart_count) + ")");
    }
  }
  // --async-save: the periodic saves copy the state and write it in the background while
  // training goes on; the last save before leaving is synchronous (it waits for the one
  // before it, whose error, if any, every rank throws).
  auto save = [&](bool in_background = false) {
    if (ckpt) ckpt->save(rt, step, state, {.sync = true, .async = in_background});
  };
  // SIGTERM, SIGINT, SIGUSR1 on any rank: every rank saves the same step, then leaves.
  loom::StopSignal stop;
  // The bar on rank 0 only; every rank runs the same number of steps (the sampler pads).
  std::optional<loom::ProgressBar> progress;
  progress.emplace(rt, total_steps - step);  // prints on the strategy's rank 0 only
  for (auto epoch = static_cast<int>(sampler.epoch()); epoch < o.epochs && step < total_steps;
       ++epoch) {
    // Python's set_epoch before iterating; after a resume, the loaded epoch's first reset
    // keeps the sampler's loaded position.
    sampler.set_epoch(static_cast<uint64_t>(epoch));
    model->train();
    for (auto& batch : rt.dataloader(*loader)) {
      // --accumulate K: K micro-batches per step; the first K - 1 backwards stay local
      // (no_backward_sync), the last all-reduces their sum. The loss is the mean over them.
      const auto k = std::min<int64_t>(o.accumulate, batch.data.size(0));
      const auto micro = loom::split_microbatches(std::make_tuple(batch.data, batch.target), k);
      double l = 0;
      for (std::size_t j = 0; j < micro.size(); ++j) {
        auto scope = rt.no_backward_sync(model, j + 1 < micro.size());
        const auto& [x, y] = micro[j];
        auto loss = torch::nn::functional::cross_entropy(rt.forward(model, x), y);
        l += rt.backward(loss / static_cast<double>(k), model).template item<double>();
      }
      rt.optimizer_step(opt);  // the gradients were averaged over the ranks in backward
      opt.zero_grad();
      ++step;
      l = mean_over_ranks(s, l);
      if (progress) progress->step(batch.data.size(0) * s.world_size(), l);
      if (step % o.checkpoints.every == 0) save(o.checkpoints.async_save);
      if (stop.should_stop(rt)) {
        if (progress) progress->finish();
        if (step % o.checkpoints.every != 0) save();
        loom::dist::rank_zero_print(s, "stopped by signal " + std::to_string(stop.signal()) +
                                           " at step " + std::to_string(step) +
                                           (ckpt ? ", saved" : " (no --checkpoint-dir)"));
        rt.teardown();
        return {0, stop.exit_code()};
      }
      if (step == total_steps) break;  // before the loader fetches a batch it will not use
    }
  }
  if (progress) progress->finish();
  if (ckpt) {
    if (step % o.checkpoints.every != 0) save();
    ckpt->wait(rt);  // a background save still under way
    const auto final_path = ckpt->dir() / "final.pt";
    rt.save(final_path, state);
    loom::dist::rank_zero_print(s, "checkpoint: step " + std::to_string(step) +
                                       " saved, final state in " + final_path.string());
  }

  // Each rank scores its share of the test set; the counts are summed over the ranks.
  model->eval();
  torch::NoGradGuard no_grad;
  auto test_set = dataset(o.data, Mode::kTest);
  const auto n_test = *test_set.size();
  loom::DistributedSampler test_shard(n_test, s, /*shuffle=*/false, 0, /*drop_last=*/true);
  auto test_loader = torch::data::make_data_loader(std::move(test_set), std::move(test_shard),
                                                   torch::data::DataLoaderOptions(1000));
  auto counts = torch::zeros({2}, torch::kDouble);
  for (auto& batch : rt.dataloader(*test_loader)) {
    auto logits = rt.forward(model, batch.data);
    counts[0] += logits.argmax(1).eq(batch.target).sum().template item<int64_t>();
    counts[1] += batch.data.size(0);
  }
  s.all_reduce(counts, loom::dist::ReduceOp::Sum);
  rt.teardown();
  return {counts[0].item<double>() / counts[1].item<double>(), 0};
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Trains an MLP on Fashion-MNIST on every rank of a torchrun job (loom::Ddp).",
               "ddp"};
  app.option_defaults()->always_capture_default();
  app.add_option("--data", o.data, "directory with Fashion-MNIST's IDX files");
  app.add_option("--device", o.device, "cpu, cuda, gpu or auto");
  app.add_option("--precision", o.precision,
                 "one of " + std::string(loom::precision::allowed_names));
  app.add_option("--epochs", o.epochs, "passes over the training set")->check(CLI::PositiveNumber);
  app.add_option("--max-steps", o.max_steps, "stop after this many steps (-1: no limit)");
  app.add_option("--batch-size", o.batch_size, "per rank")->check(CLI::PositiveNumber);
  app.add_option("--lr", o.lr, "Adam's learning rate")->check(CLI::PositiveNumber);
  app.add_option("--comm-hook", o.comm_hook,
                 "how each gradient bucket is all-reduced: none (the reducer's fp32 average), "
                 "fp16 or bf16 (compressed to 16 bits on the wire, like Python DDP's hooks)")
      ->check(CLI::IsMember({"none", "fp16", "bf16"}));
  app.add_option("--accumulate", o.accumulate,
                 "micro-batches per step: each batch is cut into K, the first K - 1 backwards "
                 "skip the all-reduce (rt.no_backward_sync), the last reduces their sum")
      ->check(CLI::PositiveNumber);
  o.checkpoints.add_to(app, " (after a torchrun restart too)");
  CLI11_PARSE(app, argc, argv);

  try {
    torch::manual_seed(0);
    int rank = 0;
    loom::DdpOptions ddp;
    ddp.comm_hook = loom::CommHook::parse(o.comm_hook);
    Outcome outcome = loom::with_runtime(
        o.device, o.precision,
        [&](auto& rt) {
          rank = rt.strategy().rank();
          return train_and_evaluate(rt, o);
        },
        loom::RuntimeOptions{}, loom::Ddp(ddp));
    if (outcome.stopped != 0) return outcome.stopped;
    const double accuracy = outcome.accuracy;
    bool learned = accuracy >= 0.70;
    if (rank == 0) {
      std::printf("test accuracy %.2f%% over all ranks: %s\n", 100 * accuracy,
                  learned ? "learned" : "did NOT learn");
    }
    return learned ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp: %s\n", e.what());
    return 2;
  }
}
