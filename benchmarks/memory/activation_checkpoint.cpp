// Activation checkpointing's trade: a 16-block MLP (Linear-GELU-Dropout, width 1024) at batch
// 256, one training step (forward, backward) plainly and with loom::checkpoint_sequential in 4
// and in 16 segments, on the CPU or (--cuda 1) on the first GPU.
//
//   loom_bench_activation_checkpoint [--steps 5] [--width 1024] [--batch 256] [--blocks 16]
//                                    [--cuda 0]
//
// Activation memory: the peak of the bytes the allocator holds during the step, minus the
// bytes held just before the forward (weights, gradients of the last step, the input): on the
// CPU from a counting allocator loom installs in front of c10's, on a GPU from the CUDA caching
// allocator's statistics (getDeviceStats, allocated bytes, the peak reset before each step). Step
// time: the median of
// --steps steps after one warm-up. Prints one line per variant and the ratios to the plain
// step (targets: activation memory <= 0.5x, step time <= 1.4x).
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/cuda.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include <loom/nn/activation_checkpoint.hpp>

#include "../common/counting_allocator.hpp"

namespace {

using loom::bench::CountingAllocator;

torch::nn::Sequential make_mlp(int64_t blocks, int64_t width) {
  torch::nn::Sequential s;
  for (int64_t i = 0; i < blocks; ++i) {
    s->push_back(torch::nn::Linear(width, width));
    s->push_back(torch::nn::GELU());
    s->push_back(torch::nn::Dropout(0.1));
  }
  s->push_back(torch::nn::Linear(width, 10));
  return s;
}

struct Figures {
  double activation_mib, step_ms;
};

/// The bytes an allocator holds and their peak: the counting CPU allocator's, or the CUDA
/// caching allocator's statistics for `device` (synchronized first).
struct Held {
  std::optional<c10::DeviceIndex> cuda;
  int64_t held() const {
    if (!cuda) return CountingAllocator::instance().held();
    c10::cuda::device_synchronize();
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(*cuda);
    return stats
        .allocated_bytes[static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
        .current;
  }
  int64_t peak() const {
    if (!cuda) return CountingAllocator::instance().peak();
    c10::cuda::device_synchronize();
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(*cuda);
    return stats
        .allocated_bytes[static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
        .peak;
  }
  void reset_peak() const {
    if (!cuda) return CountingAllocator::instance().reset_peak();
    c10::cuda::device_synchronize();
    c10::cuda::CUDACachingAllocator::resetPeakStats(*cuda);
  }
};

Figures measure(const Held& counter, torch::nn::Sequential& model, int64_t segments,
                const at::Tensor& x, int steps) {
  std::vector<double> times;
  int64_t activation = 0;
  for (int i = 0; i <= steps; ++i) {
    model->zero_grad(/*set_to_none=*/false);  // the gradients stay allocated between steps
    counter.reset_peak();
    const int64_t before = counter.held();
    const auto t0 = std::chrono::steady_clock::now();
    at::Tensor out =
        segments == 0 ? model->forward(x) : loom::checkpoint_sequential(model, segments, x);
    out.square().mean().backward();
    if (counter.cuda) c10::cuda::device_synchronize();
    const auto t1 = std::chrono::steady_clock::now();
    if (i == 0) continue;  // warm-up: the gradients are allocated here
    activation = std::max(activation, counter.peak() - before);
    times.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::sort(times.begin(), times.end());
  return {static_cast<double>(activation) / (1 << 20), times[times.size() / 2]};
}

int64_t flag(int argc, char** argv, const std::string& name, int64_t fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (name == argv[i]) return std::atoll(argv[i + 1]);
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = static_cast<int>(flag(argc, argv, "--steps", 5));
  const int64_t width = flag(argc, argv, "--width", 1024);
  const int64_t batch = flag(argc, argv, "--batch", 256);
  const int64_t blocks = flag(argc, argv, "--blocks", 16);
  Held counter;
  if (flag(argc, argv, "--cuda", 0) != 0) {
    if (!torch::cuda::is_available()) {
      std::printf("activation checkpointing: --cuda 1 but torch sees no CUDA device\n");
      return 77;
    }
    counter.cuda = c10::DeviceIndex{0};
  } else {
    c10::SetCPUAllocator(&CountingAllocator::instance(), /*priority=*/1);
  }

  torch::manual_seed(0);
  auto model = make_mlp(blocks, width);
  at::Tensor x = at::randn({batch, width});
  if (counter.cuda) {
    model->to(torch::Device(torch::kCUDA, 0));
    x = x.to(torch::Device(torch::kCUDA, 0));
  }
  std::printf(
      "activation checkpointing: %lld blocks of Linear(%lld)-GELU-Dropout, batch %lld, on %s "
      "(%d CPU threads), median of %d steps\n",
      static_cast<long long>(blocks), static_cast<long long>(width), static_cast<long long>(batch),
      counter.cuda ? "cuda:0" : "the CPU", at::get_num_threads(), steps);
  const Figures plain = measure(counter, model, 0, x, steps);
  std::printf("%-14s activation %8.1f MiB  step %8.2f ms\n", "plain", plain.activation_mib,
              plain.step_ms);
  for (int64_t segments : {int64_t{4}, blocks}) {
    const Figures f = measure(counter, model, segments, x, steps);
    std::printf(
        "%-14s activation %8.1f MiB  step %8.2f ms  memory %.2fx (<= 0.50)  time %.2fx "
        "(<= 1.40)\n",
        (std::to_string(segments) + " segments").c_str(), f.activation_mib, f.step_ms,
        f.activation_mib / plain.activation_mib, f.step_ms / plain.step_ms);
  }
  return 0;
}
