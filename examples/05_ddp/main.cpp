// Data parallelism: the quick start's MLP learns Fashion-MNIST on several processes through
// loom::Runtime<Device, Precision, loom::Ddp>, each rank on its share of the data.
//
//   torchrun --nproc-per-node=2 --no-python ddp --data build/data/fashion-mnist
//            [--device cpu] [--precision 32-true] [--epochs 1] [--max-steps N]
//            [--batch-size 64] [--lr 1e-3] [--accumulate 1] [--comm-hook none]
//
// Also runs started by hand (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set on every rank),
// and as one process with none of them set. loom::Ddp reads torchrun's environment, connects
// gloo (CPU) or NCCL (CUDA), broadcasts rank 0's weights and averages the gradients in
// backward; a loom::DistributedSampler gives each rank Python's share of the data. The loss
// on the progress bar (rank 0's) and the test accuracy are averaged over the ranks. Exits 1 if
// the model did not learn (accuracy below 70%), 2 on an error such as a rank that died.
#include <algorithm>
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
#include <loom/loom.hpp>

#include "common/progress.hpp"

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
double train_and_evaluate(RT& rt, const Options& o) {
  using Mode = torch::data::datasets::MNIST::Mode;
  auto& s = rt.strategy();
  torch::nn::Sequential model(torch::nn::Flatten(), torch::nn::Linear(28 * 28, 256),
                              torch::nn::ReLU(), torch::nn::Linear(256, 10));
  loom::optim::Adam opt(model->parameters(), loom::optim::AdamOptions(o.lr));  // fused
  rt.setup(model, opt);  // every rank now holds rank 0's weights

  auto train_set = dataset(o.data, Mode::kTrain);
  const auto n_train = *train_set.size();
  const loom::DistributedSampler shard(n_train, s);
  loom::dist::rank_zero_print(s, "training on " + std::to_string(s.world_size()) + " rank(s), " +
                                     std::to_string(shard.num_samples()) + " of " +
                                     std::to_string(n_train) + " images each, " +
                                     std::string(RT::precision_name()) + " on " +
                                     std::string(rt.device().name()) + ", backend " +
                                     std::string(s.backend()) + ", comm hook " + o.comm_hook);
  const auto per_epoch =
      static_cast<int64_t>((shard.num_samples() + o.batch_size - 1) / o.batch_size);
  int64_t total_steps = o.epochs * per_epoch;
  if (o.max_steps >= 0) total_steps = std::min(total_steps, o.max_steps);
  // The bar on rank 0 only; every rank runs the same number of steps (the sampler pads).
  std::optional<examples::Progress> progress;
  if (s.is_global_zero()) progress.emplace(total_steps);
  int64_t step = 0;
  for (int epoch = 0; epoch < o.epochs && step != o.max_steps; ++epoch) {
    // The sampler lives in the loader, so each epoch gets a loader whose sampler has the
    // epoch set: Python's set_epoch before iterating.
    loom::DistributedSampler sampler(n_train, s);
    sampler.set_epoch(static_cast<uint64_t>(epoch));
    auto loader = torch::data::make_data_loader(train_set, std::move(sampler),
                                                torch::data::DataLoaderOptions(o.batch_size));
    model->train();
    for (auto& batch : rt.dataloader(*loader)) {
      if (step == o.max_steps) break;
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
    }
  }
  if (progress) progress->finish();

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
  return counts[0].item<double>() / counts[1].item<double>();
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
  CLI11_PARSE(app, argc, argv);

  try {
    torch::manual_seed(0);
    int rank = 0;
    loom::DdpOptions ddp;
    ddp.comm_hook = loom::CommHook::parse(o.comm_hook);
    double accuracy = loom::with_runtime(
        o.device, o.precision,
        [&](auto& rt) {
          rank = rt.strategy().rank();
          return train_and_evaluate(rt, o);
        },
        loom::RuntimeOptions{}, loom::Ddp(ddp));
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
