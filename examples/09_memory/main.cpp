// Memory levers: a deep, wide MLP learns Fashion-MNIST on several processes with activation
// checkpointing (loom::checkpoint_sequential over its blocks) and ZeRO stage 2 (loom::Zero:
// each rank keeps its shard of the AdamW state and of the gradients), and prints what each
// rank holds.
//
//   torchrun --nproc-per-node=2 --no-python memory --data build/data/fashion-mnist
//            [--stage 2] [--segments 4] [--width 1024] [--depth 16] [--precision 32-true]
//            [--device cpu] [--batch-size 64] [--max-steps N] [--lr 1e-3]
//
// --stage 1 shards only the AdamW state; --segments 0 keeps every activation. One process (no
// torchrun) runs too. After the first step and at the end each rank counts the bytes of its
// parameters, of the gradients it holds and of its optimizer state, and its peak resident memory;
// rank 0 prints them beside what Ddp would hold. Exits 1 if the model did not learn (test accuracy
// below --min-accuracy), 2 on an error.
#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <torch/data/dataloader.h>
#include <torch/data/datasets/map.h>
#include <torch/data/datasets/mnist.h>
#include <torch/data/transforms/stack.h>
#include <torch/data/transforms/tensor.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <CLI/CLI.hpp>

#include <loom/dist/rank_zero.hpp>
#include <loom/loggers/progress_bar.hpp>
#include <loom/loom.hpp>

namespace {

struct Options {
  std::string data = "data/fashion-mnist";
  std::string device = "cpu";
  std::string precision = "32-true";
  int stage = 2;
  int64_t segments = 4;
  int64_t width = 1024;
  int64_t depth = 16;
  int64_t max_steps = -1;
  int64_t batch_size = 64;
  double lr = 1e-3;
  double min_accuracy = 0.70;
};

/// Flatten, Linear(784, width), then `depth` blocks of Linear(width, width) and GELU, then
/// Linear(width, 10); with segments > 0 the blocks run through checkpoint_sequential.
struct DeepMlpImpl : torch::nn::Module {
  DeepMlpImpl(int64_t width, int64_t depth, int64_t segments_) : segments(segments_) {
    head = register_module("head", torch::nn::Linear(28 * 28, width));
    for (int64_t i = 0; i < depth; ++i) {
      blocks->push_back(torch::nn::Linear(width, width));
      blocks->push_back(torch::nn::GELU());
    }
    register_module("blocks", blocks);
    tail = register_module("tail", torch::nn::Linear(width, 10));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = torch::gelu(head(x.flatten(1)));
    h = segments > 0 ? loom::checkpoint_sequential(blocks, segments, h) : blocks->forward(h);
    return tail(h);
  }
  int64_t segments;
  torch::nn::Linear head{nullptr}, tail{nullptr};
  torch::nn::Sequential blocks;
};
TORCH_MODULE(DeepMlp);

auto dataset(const std::string& root, torch::data::datasets::MNIST::Mode mode) {
  return torch::data::datasets::MNIST(root, mode)
      .map(torch::data::transforms::Normalize<>(0.2860, 0.3530))
      .map(torch::data::transforms::Stack<>());
}

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

/// Every rank's figures, printed by rank 0: what it holds, and what Ddp would.
template <class RT>
void print_memory(RT& rt, torch::nn::Module& model, const torch::optim::Optimizer& opt,
                  const std::string& when) {
  auto& s = rt.strategy();
  const loom::ShardMemory held = s.memory(opt);  // what this rank holds now
  const int64_t params = held.parameters, grads = held.gradients, state = held.optimizer_state;
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const int64_t rss = static_cast<int64_t>(usage.ru_maxrss) * 1024;
  auto all = s.all_gather(torch::tensor({params, grads, state, rss}, torch::kLong));
  if (!s.is_global_zero()) return;
  std::printf("memory %s:\n", when.c_str());
  for (std::size_t r = 0; r < all.size(); ++r) {
    const at::Tensor v = all[r];
    std::printf(
        "  rank %zu: parameters %.1f MiB, gradients %.1f MiB, AdamW state %.1f MiB, peak resident "
        "%.0f MiB\n",
        r, mib(v[0].item<int64_t>()), mib(v[1].item<int64_t>()), mib(v[2].item<int64_t>()),
        mib(v[3].item<int64_t>()));
  }
  std::printf("  (Ddp holds on every rank: gradients %.1f MiB, AdamW state %.1f MiB)\n",
              mib(params), mib(2 * params + static_cast<int64_t>(model.parameters().size()) * 4));
  std::fflush(stdout);
}

template <class RT>
double train_and_evaluate(RT& rt, const Options& o) {
  using Mode = torch::data::datasets::MNIST::Mode;
  auto& s = rt.strategy();
  DeepMlp model(o.width, o.depth, o.segments);
  loom::optim::AdamW opt(model->parameters(), loom::optim::AdamWOptions(o.lr));  // fused
  rt.setup(model, opt);
  int64_t count = 0;
  for (const auto& p : model->parameters()) count += p.numel();
  auto train_set = dataset(o.data, Mode::kTrain);
  loom::DistributedSampler sampler(*train_set.size(), s);
  auto loader = torch::data::make_data_loader(std::move(train_set), loom::SamplerRef(sampler),
                                              torch::data::DataLoaderOptions(o.batch_size));
  const std::string how = "loom::Zero stage " + std::to_string(o.stage);
  loom::dist::rank_zero_print(
      s, "training " + std::to_string(count) + " parameters (" + std::to_string(o.depth) +
             " blocks of width " + std::to_string(o.width) + ") on " +
             std::to_string(s.world_size()) + " rank(s) under " + how + ", " +
             (o.segments > 0
                  ? "activations checkpointed in " + std::to_string(o.segments) + " segments"
                  : "every activation kept") +
             ", " + std::string(RT::precision_name()));
  const auto per_epoch =
      static_cast<int64_t>((sampler.num_samples() + o.batch_size - 1) / o.batch_size);
  const int64_t total = o.max_steps >= 0 ? std::min(per_epoch, o.max_steps) : per_epoch;
  std::optional<loom::ProgressBar> progress;
  progress.emplace(rt, total);  // prints on the strategy's rank 0 only
  int64_t step = 0;
  sampler.set_epoch(0);
  model->train();
  for (auto& batch : rt.dataloader(*loader)) {
    opt.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(rt.forward(model, batch.data), batch.target);
    const double l = rt.backward(loss, model).template item<double>();
    rt.optimizer_step(opt);
    if (progress) progress->step(batch.data.size(0) * s.world_size(), l);
    if (++step == 1) {
      if (progress) progress->finish();
      print_memory(rt, *model, opt, "after the first step");
      progress.emplace(rt, total - 1);
    }
    if (step == total) break;
  }
  if (progress) progress->finish();
  print_memory(rt, *model, opt, "after the last step");

  model->eval();
  torch::NoGradGuard no_grad;
  auto test_set = dataset(o.data, Mode::kTest);
  loom::DistributedSampler shard(*test_set.size(), s, /*shuffle=*/false, 0, /*drop_last=*/true);
  auto test_loader = torch::data::make_data_loader(std::move(test_set), std::move(shard),
                                                   torch::data::DataLoaderOptions(1000));
  auto counts = torch::zeros({2}, torch::kDouble);
  for (auto& batch : rt.dataloader(*test_loader)) {
    counts[0] +=
        rt.forward(model, batch.data).argmax(1).eq(batch.target).sum().template item<int64_t>();
    counts[1] += batch.data.size(0);
  }
  s.all_reduce(counts, loom::dist::ReduceOp::Sum);
  rt.teardown();
  return counts[0].item<double>() / counts[1].item<double>();
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Trains a deep MLP on Fashion-MNIST with activation checkpointing and ZeRO.",
               "memory"};
  app.option_defaults()->always_capture_default();
  app.add_option("--data", o.data, "directory with Fashion-MNIST's IDX files");
  app.add_option("--device", o.device, "cpu, cuda, gpu or auto");
  app.add_option("--precision", o.precision,
                 "one of " + std::string(loom::precision::allowed_names));
  app.add_option("--stage", o.stage,
                 "loom::Zero's stage: 1 shards the AdamW state, 2 the gradients too")
      ->check(CLI::Range(1, 2));
  app.add_option("--segments", o.segments,
                 "checkpoint the blocks in this many segments (0: keep every activation)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--width", o.width, "the blocks' width")->check(CLI::PositiveNumber);
  app.add_option("--depth", o.depth, "how many blocks")->check(CLI::PositiveNumber);
  app.add_option("--max-steps", o.max_steps, "stop after this many steps (-1: one epoch)");
  app.add_option("--batch-size", o.batch_size, "per rank")->check(CLI::PositiveNumber);
  app.add_option("--lr", o.lr, "AdamW's learning rate")->check(CLI::PositiveNumber);
  app.add_option("--min-accuracy", o.min_accuracy, "exit 1 below this test accuracy");
  CLI11_PARSE(app, argc, argv);
  if (o.segments > o.depth * 2) {
    std::fprintf(stderr, "memory: --segments %lld is more than the %lld modules of the blocks\n",
                 static_cast<long long>(o.segments), static_cast<long long>(o.depth * 2));
    return 2;
  }

  try {
    torch::manual_seed(0);
    int rank = 0;
    auto run = [&](auto& rt) {
      rank = rt.strategy().rank();
      return train_and_evaluate(rt, o);
    };
    loom::ZeroOptions zero;
    zero.stage = o.stage;
    const double accuracy =
        loom::with_runtime(o.device, o.precision, run, loom::RuntimeOptions{}, loom::Zero(zero));
    const bool learned = accuracy >= o.min_accuracy;
    if (rank == 0) {
      std::printf("test accuracy %.2f%% over all ranks: %s\n", 100 * accuracy,
                  learned ? "learned" : "did NOT learn");
    }
    return learned ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memory: %s\n", e.what());
    return 2;
  }
}
