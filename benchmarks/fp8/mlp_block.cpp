// One transformer-style MLP block's training step, bf16 autocast against fp8 (loom::fp8::linear
// for both linear layers, the rest under bf16 autocast), side by side in one process: steps/s
// and the loss curves over STEPS steps from the same weights and data (scripts/gpu-check.sh,
// docs/fp8.md).
//
//   loom_bench_fp8_mlp [device=cuda] [tokens=8192] [dim=4096] [hidden=16384] [steps=200]
//
// The block: Linear(dim, hidden) -> GELU -> Linear(hidden, dim), fp32 master weights, fused
// AdamW, an MSE loss against a fixed target (a random teacher block's output). Prints
// `key value` lines: "bf16 steps_per_s X", "fp8 steps_per_s X", "speedup X", then one
// "loss STEP BF16 FP8" line every 10 steps. On a machine without CUDA, or a GPU below compute
// capability 8.9 (no fp8 matmuls), it says so and exits 0.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>

#include <loom/amp/autocast.hpp>
#include <loom/fp8/linear.hpp>
#include <loom/optim/adam.hpp>

namespace {

struct Block {
  at::Tensor w1, b1, w2, b2;
  std::vector<at::Tensor> params() const { return {w1, b1, w2, b2}; }
};

Block make_block(int64_t dim, int64_t hidden, const at::TensorOptions& o, uint64_t seed) {
  at::manual_seed(seed);
  auto init = [&](int64_t out, int64_t in) {
    return (at::randn({out, in}, o) / std::sqrt(static_cast<double>(in))).requires_grad_();
  };
  return {init(hidden, dim), at::zeros({hidden}, o).requires_grad_(), init(dim, hidden),
          at::zeros({dim}, o).requires_grad_()};
}

at::Tensor forward(const Block& b, const at::Tensor& x, bool fp8, c10::DeviceType device) {
  loom::amp::AutocastGuard autocast(device, at::kBFloat16);
  if (fp8) {
    auto h = at::gelu(loom::fp8::linear(x, b.w1, b.b1));
    return loom::fp8::linear(h, b.w2, b.b2);
  }
  auto h = at::gelu(at::linear(x, b.w1, b.b1));
  return at::linear(h, b.w2, b.b2);
}

void sync(const at::Device& d) {
  if (d.is_cuda()) c10::cuda::device_synchronize();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dev = argc > 1 ? argv[1] : "cuda";
  const int64_t tokens = argc > 2 ? std::atoll(argv[2]) : 8192;
  const int64_t dim = argc > 3 ? std::atoll(argv[3]) : 4096;
  const int64_t hidden = argc > 4 ? std::atoll(argv[4]) : 16384;
  const int steps = argc > 5 ? std::atoi(argv[5]) : 200;
  if (dev == "cuda") {
    if (!at::hasCUDA() || c10::cuda::device_count() == 0) {
      std::printf("no GPU: torch sees no CUDA device\n");
      return 0;
    }
    const auto* p = at::cuda::getCurrentDeviceProperties();
    if (p->major * 10 + p->minor < 89) {
      std::printf("no fp8: compute capability %d.%d is below 8.9\n", p->major, p->minor);
      return 0;
    }
  }
  const at::Device device(dev);
  const auto o = at::TensorOptions().device(device).dtype(at::kFloat);
  const auto x = at::randn({tokens, dim}, o).to(at::kBFloat16);
  at::Tensor target;
  {
    at::NoGradGuard no_grad;
    target = forward(make_block(dim, hidden, o, 1), x, false, device.type()).to(at::kFloat);
  }
  struct Run {
    Block block;
    std::unique_ptr<loom::optim::AdamW> opt;
    bool fp8;
  };
  auto make_run = [&](bool fp8) {
    Block b = make_block(dim, hidden, o, 2);
    auto opt = std::make_unique<loom::optim::AdamW>(b.params(), loom::optim::AdamWOptions(1e-3));
    return Run{b, std::move(opt), fp8};
  };
  std::vector<Run> runs;
  runs.push_back(make_run(false));
  runs.push_back(make_run(true));
  auto step = [&](Run& r) {
    auto out = forward(r.block, x, r.fp8, device.type());
    auto loss = at::mse_loss(out.to(at::kFloat), target);
    loss.backward();
    r.opt->step();
    r.opt->zero_grad();
    return loss.detach();
  };
  // Throughput: warm-up, then timed steps, each precision in turn.
  double rate[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    for (int w = 0; w < 3; ++w) step(runs[i]);
    sync(device);
    const int timed = std::max(5, steps / 10);
    const auto t0 = std::chrono::steady_clock::now();
    for (int s = 0; s < timed; ++s) step(runs[i]);
    sync(device);
    rate[i] = timed / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  std::printf("bf16 steps_per_s %.3f\nfp8 steps_per_s %.3f\nspeedup %.3f\n", rate[0], rate[1],
              rate[1] / rate[0]);
  // Loss curves from the same start.
  runs.clear();
  runs.push_back(make_run(false));
  runs.push_back(make_run(true));
  for (int s = 0; s < steps; ++s) {
    const auto a = step(runs[0]), b = step(runs[1]);
    if (s % 10 == 0 || s == steps - 1) {
      std::printf("loss %d %.6g %.6g\n", s, a.item<double>(), b.item<double>());
    }
  }
  return 0;
}
