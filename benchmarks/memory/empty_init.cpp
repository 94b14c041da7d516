// Building a model without its memory (loom::EmptyInit) and loading its checkpoint, against
// building it normally (every parameter allocated and initialized) and loading the same file:
// a Sequential of --layers Linear(width, width) layers (16 x 8192: 1.07 B parameters, 4 GiB of
// fp32), one process (loom::SingleProcess on the CPU), the checkpoint written once by rt.save
// and read by rt.load (mapped: its pages come from the page cache, which the save left warm).
//
//   loom_bench_empty_init [--layers 16] [--width 8192] [--rounds 2] [--file PATH]
//
// Each round times both ways in one process, one after the other (the normal build first),
// each model compared bit for bit with the file (read mapped) and freed before the next. Time:
// from the first constructor to rt.load's return (build, rt.setup, rt.load); the best of the
// rounds. Memory:
// the peak of the bytes the CPU allocator holds while one way runs, above what it held before
// (a counting allocator in front of c10's; the mapped file is not allocator memory), as a
// multiple of the weights' bytes. Targets: empty >= 3x faster, peak <= 1.1x the weights, the
// same weights.
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
  double build_s = 0, total_s = 0;
  int64_t peak = 0;
};

/// One way: built (normally, or under EmptyInit), set up, loaded from `file`.
Run build_and_load(bool empty, int64_t layers, int64_t width, const std::string& file) {
  auto& counter = CountingAllocator::instance();
  counter.reset_peak();
  const int64_t before = counter.held();
  Run r;
  const auto t0 = Clock::now();
  {
    std::optional<loom::EmptyInit> meta;
    if (empty) meta.emplace();
    r.model = make_model(layers, width);
  }
  const auto t1 = Clock::now();
  loom::Runtime<loom::Cpu, loom::Fp32> rt;
  rt.setup(r.model);
  rt.load(file, loom::State{{"model", r.model}});
  const auto t2 = Clock::now();
  r.build_s = std::chrono::duration<double>(t1 - t0).count();
  r.total_s = std::chrono::duration<double>(t2 - t0).count();
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
  double best_normal = 1e30, best_empty = 1e30, normal_build = 0, empty_build = 0;
  double peak_normal = 0, peak_empty = 0;
  bool same = true;
  for (int64_t round = 0; round < rounds; ++round) {
    Run normal = build_and_load(false, layers, width, file);
    same = same && equals_file(normal.model, file);
    normal.model = nullptr;
    Run empty = build_and_load(true, layers, width, file);
    same = same && equals_file(empty.model, file);
    empty.model = nullptr;
    if (normal.total_s < best_normal) {
      best_normal = normal.total_s;
      normal_build = normal.build_s;
    }
    if (empty.total_s < best_empty) {
      best_empty = empty.total_s;
      empty_build = empty.build_s;
    }
    peak_normal = std::max(peak_normal, static_cast<double>(normal.peak) / weights);
    peak_empty = std::max(peak_empty, static_cast<double>(empty.peak) / weights);
    std::printf("round %lld: normal %.2f s (build %.2f), empty %.2f s (build %.4f)\n",
                static_cast<long long>(round + 1), normal.total_s, normal.build_s, empty.total_s,
                empty.build_s);
  }
  std::printf("normal build + load: %.2f s (build %.2f s), peak %.2fx the weights\n", best_normal,
              normal_build, peak_normal);
  std::printf("EmptyInit build + load: %.2f s (build %.4f s), peak %.2fx the weights\n", best_empty,
              empty_build, peak_empty);
  std::printf("speed-up %.2fx; weights %s\n", best_normal / best_empty,
              same ? "bitwise equal" : "DIFFERENT");
  std::filesystem::remove(file);
  return same ? 0 : 1;
}
