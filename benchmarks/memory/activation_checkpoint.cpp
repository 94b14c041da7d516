// Activation checkpointing's trade, measured on the CPU: a 16-block MLP (Linear-GELU-Dropout,
// width 1024) at batch 256, one training step (forward, backward) plainly and with
// loom::checkpoint_sequential in 4 and in 16 segments.
//
//   loom_bench_activation_checkpoint [--steps 5] [--width 1024] [--batch 256] [--blocks 16]
//
// Activation memory: the peak of the bytes the CPU allocator holds during the step, minus the
// bytes held just before the forward (weights, gradients of the last step, the input), from a
// counting allocator loom installs in front of c10's CPU allocator. Step time: the median of
// --steps steps after one warm-up. Prints one line per variant and the ratios to the plain
// step (targets: activation memory <= 0.5x, step time <= 1.4x).
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
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

Figures measure(CountingAllocator& counter, torch::nn::Sequential& model, int64_t segments,
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
  CountingAllocator& counter = CountingAllocator::instance();
  c10::SetCPUAllocator(&counter, /*priority=*/1);

  torch::manual_seed(0);
  auto model = make_mlp(blocks, width);
  const at::Tensor x = at::randn({batch, width});
  std::printf(
      "activation checkpointing: %lld blocks of Linear(%lld)-GELU-Dropout, batch %lld, "
      "%d threads, median of %d steps\n",
      static_cast<long long>(blocks), static_cast<long long>(width), static_cast<long long>(batch),
      at::get_num_threads(), steps);
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
