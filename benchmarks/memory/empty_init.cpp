// Building a model without its memory (loom::EmptyInit) and loading its checkpoint, against
// building it normally (every parameter allocated and initialized) and loading the same file:
// a Sequential of --layers Linear(width, width) layers (16 x 8192: 1.07 B parameters, 4 GiB of
// fp32), one process (loom::SingleProcess on the CPU), the checkpoint written once by rt.save
// and read by rt.load (mapped: its pages come from the page cache, which the save left warm).
//
//   loom_bench_empty_init [--layers 16] [--width 8192] [--rounds 2] [--file PATH]
//
// Three ways, each round in one process one after the other: built normally; built under
// EmptyInit and loaded by copying into the memory rt.setup gave (rt.load's default); built
// under EmptyInit and loaded keeping the file's pages (LoadOptions::keep_mapped). Each model
// is compared bit for bit with the file (read mapped) and freed before the next. Time: from the
// first constructor to rt.load's return (build, rt.setup, rt.load), the best of the rounds;
// beside it the first write to every weight after the load (x * 1: what the first optimizer
// step pays on top), which writes memory already touched after a copy and copies each page
// the parameters kept. Memory: the peak of the bytes the CPU allocator holds while one way
// runs, above what it held before (a counting allocator in front of c10's; the mapped file is
// not allocator memory), as a multiple of the weights' bytes. Targets: empty >= 3x faster,
// peak <= 1.1x the weights, the same weights.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include <loom/checkpoint/io.hpp>
#include <loom/loom.hpp>
#include <loom/nn/empty_init.hpp>

#include "../common/counting_allocator.hpp"

namespace {

using loom::bench::CountingAllocator;
using Clock = std::chrono::steady_clock;

torch::nn::Sequential make_model(int64_t layers, int64_t width) {
  torch::nn::Sequential s;
  for (int64_t i = 0; i < layers; ++i) s->push_back(torch::nn::Linear(width, width));
  return s;
}

struct Run {
  torch::nn::Sequential model{nullptr};
  double build_s = 0, total_s = 0, write_s = 0;
  int64_t peak = 0;
};

enum class Way { Normal, EmptyCopied, EmptyMapped };

/// One way: built (normally, or under EmptyInit), set up, loaded from `file`.
Run build_and_load(Way way, int64_t layers, int64_t width, const std::string& file) {
  auto& counter = CountingAllocator::instance();
  counter.reset_peak();
  const int64_t before = counter.held();
  Run r;
  const auto t0 = Clock::now();
  {
    std::optional<loom::EmptyInit> meta;
    if (way != Way::Normal) meta.emplace();
    r.model = make_model(layers, width);
  }
  const auto t1 = Clock::now();
  loom::Runtime<loom::Cpu, loom::Fp32> rt;
  rt.setup(r.model);
  rt.load(file, loom::State{{"model", r.model}},
          loom::LoadOptions{.keep_mapped = way == Way::EmptyMapped});
  const auto t2 = Clock::now();
  // What the first optimizer step pays on top: a write to every weight (x * 1, the same bits).
  for (const auto& p : r.model->parameters()) p.mul_(1);
  const auto t3 = Clock::now();
  r.build_s = std::chrono::duration<double>(t1 - t0).count();
  r.total_s = std::chrono::duration<double>(t2 - t0).count();
  r.write_s = std::chrono::duration<double>(t3 - t2).count();
  r.peak = counter.peak() - before;
  return r;
}

/// Whether every parameter of `model` holds the bits of the file's "model" entry.
bool equals_file(const torch::nn::Sequential& model, const std::string& file) {
  const c10::IValue value = loom::checkpoint::load_value(file);
  const auto saved = value.toGenericDict().at("model").toGenericDict();
  for (const auto& item : model->named_parameters()) {
    if (!at::equal(item.value(), saved.at(item.key()).toTensor())) return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t layers = 16, width = 8192, rounds = 2;
  std::string file = (std::filesystem::temp_directory_path() / "loom_empty_init_bench.pt").string();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--layers")
      layers = std::stoll(value);
    else if (key == "--width")
      width = std::stoll(value);
    else if (key == "--rounds")
      rounds = std::stoll(value);
    else if (key == "--file")
      file = value;
    else {
      std::fprintf(stderr, "unknown option %s\n", key.c_str());
      return 2;
    }
  }
  c10::SetCPUAllocator(&CountingAllocator::instance(), /*priority=*/1);
  torch::NoGradGuard no_grad;
  const int64_t params = layers * (width * width + width);
  const double weights = static_cast<double>(params) * 4;
  {
    torch::manual_seed(0);
    auto model = make_model(layers, width);
    loom::Runtime<loom::Cpu, loom::Fp32> rt;
    rt.setup(model);
    const auto t0 = Clock::now();
    rt.save(file, loom::State{{"model", model}});  // synced: no writeback while timed
    std::printf("saved %lld parameters (%.2f GiB) to %s in %.2f s\n",
                static_cast<long long>(params), weights / (1 << 30), file.c_str(),
                std::chrono::duration<double>(Clock::now() - t0).count());
  }
  const char* names[] = {"built normally, then loaded", "EmptyInit, loaded by copying",
                         "EmptyInit, loaded keeping the file's pages"};
  Run best[3];
  double peak[3] = {0, 0, 0};
  bool same = true;
  for (int64_t round = 0; round < rounds; ++round) {
    std::printf("round %lld:", static_cast<long long>(round + 1));
    for (int w = 0; w < 3; ++w) {
      Run run = build_and_load(static_cast<Way>(w), layers, width, file);
      same = same && equals_file(run.model, file);
      run.model = nullptr;
      if (round == 0 || run.total_s < best[w].total_s) best[w] = run;
      peak[w] = std::max(peak[w], static_cast<double>(run.peak) / weights);
      std::printf(" [%d] %.2f s (build %.4f, first write %.2f)", w, run.total_s, run.build_s,
                  run.write_s);
    }
    std::printf("\n");
  }
  for (int w = 0; w < 3; ++w) {
    std::printf(
        "%-44s build + setup + load %.2f s (build %.4f s), then first write %.2f s; peak %.2fx "
        "the weights; speed-up %.2fx (with the first write %.2fx)\n",
        names[w], best[w].total_s, best[w].build_s, best[w].write_s, peak[w],
        best[0].total_s / best[w].total_s,
        (best[0].total_s + best[0].write_s) / (best[w].total_s + best[w].write_s));
  }
  std::printf("weights %s\n", same ? "bitwise equal" : "DIFFERENT");
  std::filesystem::remove(file);
  return same ? 0 : 1;
}
