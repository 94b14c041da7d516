// One transformer-style MLP block's training step under "bf16-mixed" against "fp8-mixed"
// (loom::Runtime with loom::Bf16Mixed and loom::Fp8Mixed: the same torch::nn::Sequential,
// whose two linear layers fp8-mixed converts), side by side in one process: steps/s and the
// loss curves over STEPS steps from the same weights and data (scripts/gpu-check.sh,
// docs/fp8.md).
//
//   loom_bench_fp8_mlp [device=cuda] [tokens=8192] [dim=4096] [hidden=16384] [steps=200]
//
// The block: Linear(dim, hidden) -> GELU -> Linear(hidden, dim), fp32 master weights, fused
// AdamW, an MSE loss against a fixed target (a random teacher block's output). Prints
// `key value` lines: "bf16 steps_per_s X", "fp8 steps_per_s X", "speedup X"; then where the
// time goes, "op NAME MS" lines (mean of 20, after warm-up): one product of the first layer's
// shape in bf16 and in fp8 (operands already cast), one cast to fp8 of the hidden activation
// (tokens x hidden, bf16), and the first layer's forward and backward in bf16 autocast and in
// fp8; then one "loss STEP BF16 FP8" line every 10 steps. On a machine without CUDA, or a GPU below
// compute capability 8.9 (no fp8 matmuls), it says so and exits 0.
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
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <loom/loom.hpp>

namespace {

torch::nn::Sequential make_block(int64_t dim, int64_t hidden, uint64_t seed) {
  at::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(dim, hidden), torch::nn::GELU(),
                               torch::nn::Linear(hidden, dim));
}

// One precision's run: its own copy of the block (the same initial weights), optimizer and
// runtime.
template <class Device, class Precision>
struct Run {
  torch::nn::Sequential model;
  std::unique_ptr<loom::optim::AdamW> opt;
  loom::Runtime<Device, Precision> rt;

  Run(int64_t dim, int64_t hidden) : model(make_block(dim, hidden, 2)) {
    opt =
        std::make_unique<loom::optim::AdamW>(model->parameters(), loom::optim::AdamWOptions(1e-3));
    rt.setup(model, *opt);
  }
  at::Tensor step(const at::Tensor& x, const at::Tensor& target) {
    auto out = rt.forward(model, x);
    auto loss = at::mse_loss(out, target);
    rt.backward(loss, model);
    rt.optimizer_step(*opt);
    opt->zero_grad();
    return loss.detach();
  }
};

void sync(const at::Device& d) {
  if (d.is_cuda()) c10::cuda::device_synchronize();
}

// Mean milliseconds of `f` over 20 calls after 3 untimed ones.
template <class F>
double ms(const at::Device& device, F&& f) {
  for (int i = 0; i < 3; ++i) f();
  sync(device);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) f();
  sync(device);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
         20.0;
}

// Where a step's time goes: the first layer's product in bf16 and in fp8, one cast, and the
// layer's forward and backward both ways.
void ops(const at::Device& device, int64_t tokens, int64_t dim, int64_t hidden) {
  namespace fp8 = loom::fp8;
  const auto bf = at::TensorOptions().device(device).dtype(at::kBFloat16);
  const auto x = at::randn({tokens, dim}, bf), w = at::randn({hidden, dim}, bf) * 0.02;
  const auto h = at::randn({tokens, hidden}, bf);
  const auto e4 = c10::kFloat8_e4m3fn;
  const fp8::Quantized qx = fp8::quantize(x, e4, fp8::Scaling::Tensorwise);
  const fp8::Quantized qw = fp8::quantize(w, e4, fp8::Scaling::Tensorwise);
  std::printf("op bf16_mm %.4f\n", ms(device, [&] { return at::mm(x, w.t()); }));
  std::printf("op fp8_mm %.4f\n",
              ms(device, [&] { return fp8::mm(qx, qw, c10::kBFloat16, /*fast_accum=*/true); }));
  std::printf("op fp8_cast_hidden %.4f\n",
              ms(device, [&] { return fp8::quantize(h, e4, fp8::Scaling::Tensorwise); }));
  const auto wf = (at::randn({hidden, dim}, bf.dtype(at::kFloat)) * 0.02).requires_grad_();
  const auto g = at::randn({tokens, hidden}, bf);
  std::printf("op bf16_linear_fwd_bwd %.4f\n", ms(device, [&] {
                loom::amp::AutocastGuard autocast(device.type(), c10::kBFloat16);
                auto xg = x.detach().requires_grad_();
                auto y = at::linear(xg, wf);
                y.backward(g);
                wf.mutable_grad().reset();
              }));
  std::printf("op fp8_linear_fwd_bwd %.4f\n", ms(device, [&] {
                auto xg = x.detach().requires_grad_();
                auto y = fp8::linear(xg, wf, at::Tensor());
                y.backward(g);
                wf.mutable_grad().reset();
              }));
}

template <class Device>
int bench(int64_t tokens, int64_t dim, int64_t hidden, int steps) {
  const at::Device device = Device().device();
  const auto o = at::TensorOptions().device(device).dtype(at::kFloat);
  at::manual_seed(0);
  const auto x = at::randn({tokens, dim}, o);
  at::Tensor target;
  {
    at::NoGradGuard no_grad;
    auto teacher = make_block(dim, hidden, 1);
    teacher->to(device);
    target = teacher->forward(x);
  }
  using Bf16 = Run<Device, loom::Bf16Mixed>;
  using Fp8 = Run<Device, loom::Fp8Mixed>;
  auto time = [&](auto& run) {
    for (int w = 0; w < 3; ++w) run.step(x, target);  // warm-up
    sync(device);
    const int timed = std::max(5, steps / 10);
    const auto t0 = std::chrono::steady_clock::now();
    for (int s = 0; s < timed; ++s) run.step(x, target);
    sync(device);
    return timed / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  double rate[2];
  {
    Bf16 a(dim, hidden);
    rate[0] = time(a);
  }
  {
    Fp8 b(dim, hidden);
    rate[1] = time(b);
  }
  std::printf("bf16 steps_per_s %.3f\nfp8 steps_per_s %.3f\nspeedup %.3f\n", rate[0], rate[1],
              rate[1] / rate[0]);
  ops(device, tokens, dim, hidden);
  // Loss curves from the same start.
  Bf16 a(dim, hidden);
  Fp8 b(dim, hidden);
  for (int s = 0; s < steps; ++s) {
    const auto la = a.step(x, target), lb = b.step(x, target);
    if (s % 10 == 0 || s == steps - 1) {
      std::printf("loss %d %.6g %.6g\n", s, la.template item<double>(), lb.template item<double>());
    }
  }
  return 0;
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
  return dev == "cuda" ? bench<loom::Cuda>(tokens, dim, hidden, steps)
                       : bench<loom::Cpu>(tokens, dim, hidden, steps);
}
