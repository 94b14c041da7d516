// loom::Cuda and the CUDA data path on a GPU: device choice, TF32, copies, the data loaders
// with and without prefetch, the RNG state, precision scopes bound to CUDA.
// Registered with label gpu only under LOOM_BUILD_GPU_TESTS; compiled everywhere.
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <ATen/Context.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include "support/catch.hpp"
#include "support/env.hpp"
#include "support/warnings.hpp"

#include <loom/checkpoint/async.hpp>
#include <loom/device/cpu.hpp>
#include <loom/device/cuda.hpp>
#include <loom/device/prefetch.hpp>
#include <loom/device/select.hpp>
#include <loom/optim/adam.hpp>
#include <loom/precision/fp32.hpp>
#include <loom/precision/mixed.hpp>
#include <loom/runtime.hpp>
#include <loom/state/checkpoint.hpp>

using Catch::Matchers::Contains;
using Catch::Matchers::Equals;
using loom::device::Cuda;
using loom::device::Prefetch;
using loom::device::Tf32;
using loom::testing::EnvGuard;

namespace {

using Batch = std::tuple<at::Tensor, std::vector<at::Tensor>, int>;

std::vector<Batch> host_batches(int n, bool pinned) {
  std::vector<Batch> out;
  for (int i = 0; i < n; ++i) {
    at::Tensor x = at::randn({256, 1024});  // (256, 1024) f32, 1 MiB
    at::Tensor y = at::randint(0, 10, {256});
    if (pinned) {
      x = x.pin_memory();
      y = y.pin_memory();
    }
    out.emplace_back(x, std::vector<at::Tensor>{y, x.sum(1)}, i);
  }
  return out;
}

}  // namespace

TEST_CASE("Cuda picks the explicit index, else LOCAL_RANK, and prepare sets it", "[gpu]") {
  const c10::DeviceIndex count = c10::cuda::device_count();
  REQUIRE(count > 0);
  REQUIRE(Cuda::is_available());
  {
    EnvGuard env("LOCAL_RANK", "1");
    Cuda zero(0);  // an explicit 0 wins over LOCAL_RANK
    CHECK(zero.index() == 0);
    CHECK(zero.device() == c10::Device(c10::kCUDA, 0));
    if (count > 1) {
      CHECK(Cuda().index() == 1);
    } else {
      CHECK_THROWS_WITH(
          Cuda(), Contains("device index 1 is out of range") && Contains("sees 1 CUDA device"));
    }
  }
  {
    EnvGuard env("LOCAL_RANK", nullptr);
    CHECK(Cuda().index() == 0);
  }
  {
    EnvGuard env("LOCAL_RANK", "0");
    CHECK(Cuda().index() == 0);
  }
  CHECK_THROWS_WITH(Cuda(count), Contains("device index " + std::to_string(count)) &&
                                     Contains("sees " + std::to_string(count)));
  const c10::DeviceIndex last = static_cast<c10::DeviceIndex>(count - 1);
  Cuda cuda(last);
  cuda.prepare();
  CHECK(c10::cuda::current_device() == last);
  cuda.prepare();  // idempotent
  CHECK(c10::cuda::current_device() == last);
  Cuda(0).prepare();
  CHECK(Cuda::name() == "cuda");
  CHECK(Cuda::ddp_backend() == "nccl");
  CHECK(loom::device::parse_device("auto") == loom::device::Kind::Cuda);
}

TEST_CASE("TF32 is set only when asked", "[gpu]") {
  auto& ctx = at::globalContext();
  const bool cublas = ctx.allowTF32CuBLAS(), cudnn = ctx.allowTF32CuDNN();
  Cuda on(0, Tf32::Enabled);
  CHECK(ctx.allowTF32CuBLAS());
  CHECK(ctx.allowTF32CuDNN());
  Cuda off(0, Tf32::Disabled);
  CHECK_FALSE(ctx.allowTF32CuBLAS());
  CHECK_FALSE(ctx.allowTF32CuDNN());
  Cuda later(0);  // a default Cuda keeps the earlier explicit choice
  CHECK(later.tf32() == Tf32::Unchanged);
  CHECK_FALSE(ctx.allowTF32CuBLAS());
  CHECK_FALSE(ctx.allowTF32CuDNN());
  ctx.setAllowTF32CuBLAS(true);
  ctx.setAllowTF32CuDNN(false);
  Cuda again;
  CHECK(ctx.allowTF32CuBLAS());
  CHECK_FALSE(ctx.allowTF32CuDNN());
  ctx.setAllowTF32CuBLAS(cublas);
  ctx.setAllowTF32CuDNN(cudnn);
}

TEST_CASE("tensor_to_device: pageable at once, pinned after a sync, D2H readable", "[gpu]") {
  Cuda cuda(0);
  cuda.prepare();
  at::Tensor pageable = at::arange(1 << 20, at::kFloat);
  at::Tensor a = cuda.tensor_to_device(pageable);
  CHECK(a.is_cuda());
  CHECK(a.cpu().equal(pageable));
  at::Tensor pinned = pageable.pin_memory();
  at::Tensor b = cuda.tensor_to_device(pinned);
  c10::cuda::getCurrentCUDAStream(0).synchronize();
  CHECK(b.device() == cuda.device());
  CHECK(b.cpu().equal(pageable));
  at::Tensor back = b.to(at::kCPU);  // D2H: blocking, readable at once
  CHECK(back[12345].item<float>() == 12345.f);
  CHECK(cuda.tensor_to_device(a).unsafeGetTensorImpl() == a.unsafeGetTensorImpl());
}

TEST_CASE("dataloader_to_device on Cuda: order, count, errors, equal with prefetch", "[gpu]") {
  Cuda cuda(0);
  cuda.prepare();
  for (bool pinned : {false, true}) {
    CAPTURE(pinned);
    auto source = host_batches(9, pinned);
    auto fn = [](Batch b) {  // runs on the side stream under prefetch
      std::get<0>(b) = std::get<0>(b).mul(2).add_(1);
      std::get<1>(b)[1] = std::get<1>(b)[1].exp();
      return b;
    };
    std::vector<Batch> inline_out, prefetch_out;
    for (auto& b : cuda.dataloader_to_device(source, fn)) inline_out.push_back(b);
    for (std::size_t depth : {1u, 2u}) {
      prefetch_out.clear();
      auto view = cuda.dataloader_to_device(source, fn, Prefetch{depth});
      for (int epoch = 0; epoch < 2; ++epoch) {
        prefetch_out.clear();
        for (auto& b : view) {
          // Use the batch on the consumer stream before keeping it.
          CHECK(std::get<0>(b).is_cuda());
          prefetch_out.push_back(b);
        }
      }
      REQUIRE(inline_out.size() == 9);
      REQUIRE(prefetch_out.size() == 9);
      for (std::size_t i = 0; i < 9; ++i) {
        CHECK(std::get<2>(prefetch_out[i]) == int(i));
        CHECK(std::get<0>(prefetch_out[i]).cpu().equal(std::get<0>(inline_out[i]).cpu()));
        for (std::size_t j = 0; j < 2; ++j) {
          CHECK(std::get<1>(prefetch_out[i])[j].device() == cuda.device());
          CHECK(std::get<1>(prefetch_out[i])[j].cpu().equal(std::get<1>(inline_out[i])[j].cpu()));
        }
      }
    }
  }
  // A prefetch_fn error surfaces at its batch, and the epoch ends cleanly.
  auto source = host_batches(5, true);
  auto bad = [](Batch b) {
    if (std::get<2>(b) == 3) throw std::runtime_error("bad batch 3");
    return b;
  };
  auto view = cuda.dataloader_to_device(source, bad, Prefetch{});
  int seen = 0;
  auto loop = [&] {
    for (auto& b : view) seen += std::get<2>(b) == seen;
  };
  CHECK_THROWS_WITH(loop(), "bad batch 3");
  CHECK(seen == 3);
  // Leaving early, then a full epoch.
  auto good = cuda.dataloader_to_device(source, loom::device::NoPrefetch{}, Prefetch{2});
  for (auto& b : good) {
    if (std::get<2>(b) == 1) break;
  }
  int n = 0;
  for (auto& b : good) n += std::get<0>(b).is_cuda();
  CHECK(n == 5);
}

TEST_CASE("the producer thread copies on a side stream, not the consumer's", "[gpu]") {
  Cuda cuda(0);
  cuda.prepare();
  auto source = host_batches(4, true);
  std::atomic<std::int64_t> producer_stream{0};
  auto fn = [&](Batch b) {
    producer_stream = c10::cuda::getCurrentCUDAStream(0).id();
    return b;
  };
  auto consumer = c10::cuda::getCurrentCUDAStream(0);
  int n = 0;
  for (auto& b : cuda.dataloader_to_device(source, fn, Prefetch{})) n += std::get<0>(b).is_cuda();
  CHECK(n == 4);
  CHECK(producer_stream.load() != consumer.id());
}

TEST_CASE("the CUDA RNG round-trips, and a wrong-size state only warns", "[gpu]") {
  Cuda cuda(0);
  auto state = cuda.state_dict();
  REQUIRE(state.count("torch.cuda") == 1);
  REQUIRE(state.at("torch.cuda").isTensor());
  REQUIRE(state.count("torch") == 1);  // the CPU generator too
  CHECK(state.at("torch").toTensor().numel() == 5056);
  at::Tensor first = at::rand({8}, at::TensorOptions().device(cuda.device()));
  cuda.load_state_dict(state);
  at::Tensor again = at::rand({8}, at::TensorOptions().device(cuda.device()));
  CHECK(first.equal(again));

  loom::testing::WarningCatcher collector;
  at::Tensor before = at::rand({4}, at::TensorOptions().device(cuda.device()));
  auto after_state = cuda.state_dict();
  CHECK_NOTHROW(cuda.load_state_dict({{"torch.cuda", at::zeros({3}, at::kByte)}}));
  REQUIRE(collector.messages.size() == 1);
  CHECK_THAT(collector.messages[0], Contains("RNG state was not restored"));
  CHECK_THROWS_WITH(cuda.load_state_dict({{"seed", at::zeros({3}, at::kByte)}}),
                    Equals("loom::device::Cuda::load_state_dict: unexpected key(s) \"seed\""));
  CHECK_NOTHROW(cuda.load_state_dict({}));
  (void)before;
  (void)after_state;
}

TEST_CASE("precision_context binds the precision to CUDA", "[gpu]") {
  Cuda cuda(0);
  auto a = at::randn({8, 8}, at::TensorOptions().device(cuda.device()));
  loom::precision::Fp32 fp32;
  {
    [[maybe_unused]] auto guard = cuda.precision_context(fp32);
    CHECK(at::mm(a, a).scalar_type() == at::kFloat);
  }
  loom::precision::Fp16Mixed fp16;
  {
    [[maybe_unused]] auto guard = cuda.precision_context(fp16);
    CHECK(at::mm(a, a).scalar_type() == at::kHalf);
    CHECK(at::mm(a.cpu(), a.cpu()).scalar_type() == at::kFloat);  // CPU autocast stays off
  }
  CHECK(at::mm(a, a).scalar_type() == at::kFloat);
}

TEST_CASE("A Runtime on Cuda trains and keeps optimizer state on the device", "[gpu]") {
  loom::Runtime<Cuda, loom::precision::Fp32> rt{Cuda(0)};
  torch::nn::Linear model(16, 4);
  torch::optim::Adam adam(model->parameters(), 1e-3);
  rt.setup(model, adam);
  auto source = host_batches(3, true);
  for (auto& [x, ys, i] : rt.dataloader(source, loom::device::NoPrefetch{}, Prefetch{})) {
    (void)ys;
    (void)i;
    auto out = rt.forward(model, x.narrow(1, 0, 16));
    auto loss = out.pow(2).mean();
    rt.backward(loss, model);
    rt.optimizer_step(adam);
    adam.zero_grad();
  }
  for (auto& p : model->parameters()) CHECK(p.is_cuda());
  for (auto& kv : adam.state()) {
    CHECK(static_cast<torch::optim::AdamParamState&>(*kv.second).exp_avg().is_cuda());
  }
  rt.device().synchronize();
  rt.device().teardown();
}

TEST_CASE("rt.load maps a CPU checkpoint onto CUDA and a CUDA one onto the CPU", "[gpu]") {
  const auto dir = std::filesystem::temp_directory_path() / "loom_gpu_checkpoint";
  std::filesystem::create_directories(dir);
  auto train = [](auto& rt, torch::nn::Linear& m, torch::optim::Optimizer& opt) {
    auto x = rt.to_device(at::ones({4, 3}));
    rt.backward(rt.forward(m, x).pow(2).mean(), m);
    rt.optimizer_step(opt);
    opt.zero_grad();
  };
  loom::Runtime<loom::Cpu, loom::Fp32> cpu;
  torch::nn::Linear m(3, 2);
  loom::optim::Adam opt(m->parameters(), loom::optim::AdamOptions(1e-2));
  cpu.setup(m, opt);
  train(cpu, m, opt);
  cpu.save(dir / "cpu.pt", {{"model", m}, {"optimizer", opt}, {"runtime", cpu}});

  loom::Runtime<Cuda, loom::Fp32> gpu(Cuda(0));
  torch::nn::Linear g(3, 2);
  loom::optim::Adam gopt(g->parameters(), loom::optim::AdamOptions(1.0));
  gpu.setup(g, gopt);
  gpu.load(dir / "cpu.pt", {{"model", g}, {"optimizer", gopt}, {"runtime", gpu}});
  CHECK(g->weight.is_cuda());
  CHECK(g->weight.cpu().equal(m->weight));
  const auto& s = static_cast<const loom::optim::AdamParamState&>(
      *gopt.state().at(g->weight.unsafeGetTensorImpl()));
  CHECK(s.exp_avg().is_cuda());
  CHECK(s.step().is_cuda());  // Python's fused layout: the step on the parameter's device
  train(gpu, g, gopt);
  gpu.save(dir / "gpu.pt", {{"model", g}, {"optimizer", gopt}, {"runtime", gpu}});
  const auto saved = loom::checkpoint::load_value(dir / "gpu.pt").toGenericDict();
  const auto dev = saved.at("runtime").toGenericDict().at("device").toList().get(0);
  CHECK(dev.toGenericDict().contains("torch.cuda"));  // both generators

  cpu.load(dir / "gpu.pt", {{"model", m}, {"optimizer", opt}, {"runtime", cpu}});
  CHECK(m->weight.is_cpu());
  CHECK(m->weight.equal(g->weight.cpu()));
  std::filesystem::remove_all(dir);
}

TEST_CASE(
    "An asynchronous save's snapshot of CUDA tensors: pinned copies, taken before the "
    "device changes them",
    "[gpu][checkpoint][async]") {
  REQUIRE(Cuda::is_available());
  at::Tensor base = at::arange(1 << 20, at::TensorOptions(at::kFloat).device(at::kCUDA));
  at::Tensor view = base.narrow(0, 8, 16);
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("base", base);
  d.insert("view", view);
  loom::checkpoint::Snapshot snap{c10::IValue(d)};
  base.mul_(-1);  // queued on the stream after the copy: the snapshot keeps the old values
  const auto copy = snap.ready().toGenericDict();
  const at::Tensor b = copy.at("base").toTensor(), v = copy.at("view").toTensor();
  CHECK(b.is_cpu());
  CHECK(b.is_pinned());
  CHECK(b.equal(at::arange(1 << 20, at::kFloat)));
  CHECK(v.storage().is_alias_of(b.storage()));
  CHECK(v.equal(at::arange(8, 24, at::kFloat)));
  CHECK(base.cpu().equal(-at::arange(1 << 20, at::kFloat)));
}
