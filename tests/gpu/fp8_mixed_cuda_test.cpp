// fp8 on a CUDA device: the casts give the CPU's bytes, the three products of a linear layer
// the CPU's values (up to accumulation order), every recipe runs, delayed scaling updates on
// the device, fp8-mixed trains an MLP classifier as well as bf16-mixed, and a GPU below
// compute capability 8.9 is refused when the runtime is built.
#include "support/catch.hpp"
#include "support/fp8_casts.hpp"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <loom/loom.hpp>

using Catch::Matchers::Contains;
using loom::fp8::Scaling;

namespace {

// Whether this GPU runs fp8 products (compute capability 8.9 and newer); says why not, with
// the marker that makes ctest count the test case as skipped (cmake/LoomTesting.cmake).
bool fp8_capable() {
  loom::Fp8Mixed probe;
  try {
    probe.bind_device(c10::Device(c10::kCUDA, 0));
    return true;
  } catch (const loom::Error& e) {
    CHECK_THAT(e.what(), Contains("compute capability 8.9 or newer"));
    WARN("LOOM-SKIPPED: no fp8 on this GPU: " << e.what());
    return false;
  }
}

double relative(const at::Tensor& got, const at::Tensor& want) {
  const auto g = got.to(at::kCPU, at::kDouble), w = want.to(at::kCPU, at::kDouble);
  return ((g - w).norm() / w.norm()).item<double>();
}

struct Grads {
  at::Tensor y, dx, dw;
};

Grads run(const at::Tensor& x, const at::Tensor& w, const at::Tensor& g,
          const loom::fp8::LinearRecipe& r, const loom::fp8::DelayedRef& delayed = {}) {
  auto xv = x.detach().clone().requires_grad_();
  auto wv = w.detach().clone().requires_grad_();
  auto y = loom::fp8::linear(xv, wv, at::Tensor(), r, delayed);
  (y.to(at::kFloat) * g).sum().backward();
  return {y.detach(), xv.grad(), wv.grad()};
}

torch::nn::Sequential classifier() {
  return torch::nn::Sequential(torch::nn::Linear(256, 1024), torch::nn::GELU(),
                               torch::nn::Linear(1024, 1024), torch::nn::GELU(),
                               torch::nn::Linear(1024, 16));
}

// 16 classes drawn from a teacher's softmax: noisy labels, a loss with a floor.
std::pair<at::Tensor, at::Tensor> classes(int64_t n, uint64_t draw) {
  at::manual_seed(4321);
  const at::Tensor w1 = at::randn({256, 256}) / 16.0, w2 = at::randn({256, 16}) / 2.0;
  at::manual_seed(4322 + draw);
  const at::Tensor x = at::randn({n, 256});
  return {x, at::multinomial(at::softmax(at::tanh(x.mm(w1)).mm(w2) * 2.0, 1), 1).squeeze(1)};
}

// 400 Adam steps of 256 fresh samples on the GPU, then the held-out loss through the run's
// own forward.
template <class P>
double train(P policy) {
  const int steps = 400;
  const auto [x, y] = classes(256 * steps, 0);
  const auto [tx, ty] = classes(8192, 1);
  loom::seed_everything(7);
  auto model = classifier();
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-3));
  loom::Runtime<loom::Cuda, P> rt(loom::Cuda{}, std::move(policy));
  rt.setup(model, opt);
  const auto xd = rt.to_device(x), yd = rt.to_device(y);
  for (int s = 0; s < steps; ++s) {
    auto out = rt.forward(model, xd.narrow(0, s * 256, 256));
    rt.backward(at::cross_entropy_loss(out.to(at::kFloat), yd.narrow(0, s * 256, 256)), model);
    rt.optimizer_step(opt);
    opt.zero_grad();
  }
  at::NoGradGuard no_grad;
  const at::Tensor out = rt.forward(model, rt.to_device(tx));
  const at::Tensor loss = at::cross_entropy_loss(out.to(at::kFloat), rt.to_device(ty));
  return loss.item<double>();
}

}  // namespace

TEST_CASE("fp8 on CUDA: the casts are the CPU's bytes", "[fp8][cuda][gpu]") {
  REQUIRE(loom::Cuda::is_available());
  at::manual_seed(1);
  const auto base = at::randn({96, 80}) * 5.0;
  base[3][4] = 1e4;
  loom::testing::for_each_fp8_cast(
      base, {at::kFloat, at::kBFloat16},
      [](const at::Tensor& t, Scaling s, c10::ScalarType f, const std::string& name) {
        INFO(name);
        const auto cpu = loom::fp8::quantize(t, f, s);
        const auto gpu = loom::fp8::quantize(t.cuda(), f, s);
        CHECK(gpu.data.is_cuda());
        CHECK(gpu.data.is_contiguous());
        CHECK(gpu.data.view(at::kByte).cpu().equal(cpu.data.view(at::kByte)));
        CHECK(gpu.inv_scale.cpu().equal(cpu.inv_scale));
      });
}

TEST_CASE("fp8 on CUDA: a linear layer's products are the CPU's, every recipe",
          "[fp8][cuda][gpu]") {
  REQUIRE(loom::Cuda::is_available());
  if (!fp8_capable()) return;
  at::manual_seed(2);
  for (const int64_t m : {256, 200}) {  // 200: dW's contraction is padded to 208
    const int64_t k = 512, n = 384;
    const auto x = at::randn({m, k}).to(at::kBFloat16);
    const auto w = at::randn({n, k}) * 0.05;
    const auto g = at::randn({m, n}).to(at::kBFloat16).to(at::kFloat);
    for (const Scaling s : {Scaling::Tensorwise, Scaling::Rowwise, Scaling::Delayed}) {
      INFO("m " << m << " scaling " << static_cast<int>(s));
      loom::fp8::LinearRecipe r{s};
      auto block = [&](c10::Device d) {
        auto b = std::make_shared<loom::fp8::DelayedBlock>(
            loom::fp8::DelayedBlock::make(1, r.delayed, d));
        b->scale.copy_(at::tensor(std::vector<float>{100.0f, 3000.0f, 1e5f}).view({1, 3}));
        return b;
      };
      const auto cpu_block = block(c10::kCPU), gpu_block = block(c10::Device(c10::kCUDA, 0));
      const auto want = run(x, w, g, r, {cpu_block, 0});
      const auto got = run(x.cuda(), w.cuda(), g.cuda(), r, {gpu_block, 0});
      CHECK(got.y.is_cuda());
      CHECK(got.y.scalar_type() == at::kBFloat16);
      CHECK(got.dx.scalar_type() == at::kBFloat16);
      CHECK(got.dw.scalar_type() == at::kFloat);
      const double ey = relative(got.y, want.y), ex = relative(got.dx, want.dx),
                   ew = relative(got.dw, want.dw);
      std::printf("[fp8 cuda] m %ld %-10s CUDA against CPU: y %.2e, dx %.2e, dW %.2e\n",
                  static_cast<long>(m),
                  s == Scaling::Tensorwise ? "tensorwise"
                  : s == Scaling::Rowwise  ? "rowwise"
                                           : "delayed",
                  ey, ex, ew);
      // The same fp8 operands; only the accumulation (fast, for y) and its order differ.
      CHECK(ey < 1e-2);
      CHECK(ex < 1e-2);
      CHECK(ew < 1e-2);
      // And the product is fp8's, not bf16's: about 4% from the exact one.
      const auto exact = x.to(at::kDouble).mm(w.to(at::kDouble).t());
      CHECK(relative(got.y, exact) > 5e-3);
      if (s == Scaling::Delayed)
        CHECK(gpu_block->amax_history.cpu().equal(cpu_block->amax_history));
    }
  }
}

TEST_CASE("fp8-mixed on CUDA: delayed scales update on the device", "[fp8][cuda][gpu]") {
  REQUIRE(loom::Cuda::is_available());
  if (!fp8_capable()) return;
  auto model = torch::nn::Sequential(torch::nn::Linear(64, 128), torch::nn::GELU(),
                                     torch::nn::Linear(128, 16));
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01));
  loom::fp8::LinearRecipe r{Scaling::Delayed};
  r.delayed.history_len = 8;
  loom::Runtime<loom::Cuda, loom::Fp8Mixed> rt(loom::Cuda{}, loom::Fp8Mixed(r));
  rt.setup(model, opt);
  CHECK(rt.precision().fp8_layers() == std::vector<std::string>{"0", "2"});
  const auto x = rt.to_device(at::randn({32, 64}) * 3.0);
  for (int s = 0; s < 3; ++s) {
    auto out = rt.forward(model, x);
    CHECK(out.is_cuda());
    rt.backward(out.square().mean(), model);
    CHECK(rt.optimizer_step(opt));
    opt.zero_grad();
  }
  const auto state = rt.precision().delayed_state();
  REQUIRE(state != nullptr);
  CHECK(state->scale.is_cuda());
  CHECK(state->amax_history.select(0, 0).abs().sum().item<double>() == 0);  // zeroed
  CHECK(state->amax_history.abs().sum().item<double>() > 0);
  CHECK(state->scale.isfinite().all().item<bool>());
  CHECK((state->scale != 1.0).all().item<bool>());  // every scale came from an amax
  // The input's scale: 448 over the largest magnitude of the input, which arrives in bf16.
  const double want = 448.0 / x.to(at::kBFloat16).abs().max().item<double>();
  CHECK(state->scale[0][0].item<double>() == Approx(want).epsilon(1e-6));
}

TEST_CASE("fp8-mixed on CUDA trains an MLP classifier as well as bf16-mixed", "[fp8][cuda][gpu]") {
  REQUIRE(loom::Cuda::is_available());
  if (!fp8_capable()) return;
  const double bf16 = train(loom::Bf16Mixed{});
  for (const Scaling s : {Scaling::Tensorwise, Scaling::Rowwise, Scaling::Delayed}) {
    loom::fp8::LinearRecipe r{s};
    r.delayed.history_len = 16;
    const double fp8 = train(loom::Fp8Mixed(r));
    const double pct = 100.0 * (fp8 - bf16) / bf16;
    std::printf(
        "[fp8 cuda] classifier %-10s held-out loss: bf16-mixed %.5f, fp8-mixed %.5f (%+.2f%%)\n",
        s == Scaling::Tensorwise ? "tensorwise"
        : s == Scaling::Rowwise  ? "rowwise"
                                 : "delayed",
        bf16, fp8, pct);
    CHECK(std::abs(pct) <= 1.0);
  }
}

TEST_CASE("fp8-mixed on CUDA: a training step, or the refusal below 8.9", "[fp8][cuda][gpu]") {
  REQUIRE(loom::Cuda::is_available());
  auto model = torch::nn::Sequential(torch::nn::Linear(64, 128), torch::nn::GELU(),
                                     torch::nn::Linear(128, 16));
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01));
  try {
    loom::Runtime<loom::Cuda, loom::Fp8Mixed> rt;
    rt.setup(model, opt);
    auto out = rt.forward(model, rt.to_device(at::randn({32, 64})));
    CHECK(out.is_cuda());
    rt.backward(out.square().mean(), model);
    CHECK(rt.optimizer_step(opt));
  } catch (const loom::Error& e) {
    // Below compute capability 8.9 the runtime refuses the policy when it is built.
    CHECK_THAT(e.what(), Contains("compute capability 8.9 or newer"));
  }
}
