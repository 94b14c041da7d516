// The toolbox on a GPU: a logger reads CUDA loss tensors once per flush, exactly; the memory
// monitor reports the caching allocator's counters; EMA updates CUDA weights without a sync;
// several fused optimizers step under 16-mixed without one; the profiler's trace holds the
// CUDA kernels.
// Registered with label gpu only under LOOM_BUILD_GPU_TESTS; compiled everywhere.
#include <unistd.h>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include "support/catch.hpp"
#include "support/sync_counter.hpp"

#include <loom/loggers/csv_logger.hpp>
#include <loom/loggers/monitors.hpp>
#include <loom/loom.hpp>
#include <loom/optim/ema.hpp>
#include <loom/profiler.hpp>

TEST_CASE("A logger reads CUDA values once per flush and writes them exactly", "[gpu]") {
  const auto dir =
      std::filesystem::temp_directory_path() / ("loom_gpu_logger_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const auto losses = at::rand({40}, at::TensorOptions(at::kCUDA));
  {
    loom::CsvLogger csv(dir, {.flush_every = 20, .rank = 0});
    loom::testing::SyncCounter counter;
    for (int64_t i = 0; i < 40; ++i) csv.log("loss", losses[i], i);
    CHECK(loom::testing::SyncCounter::count() == 0);  // two flushes: one copy each, no item
  }
  const auto host = losses.cpu();
  std::ifstream in(dir / "lightning_logs" / "version_0" / "metrics.csv");
  std::string line;
  std::getline(in, line);
  for (int64_t i = 0; i < 40; ++i) {
    std::getline(in, line);
    const double v = std::strtod(line.c_str(), nullptr);
    CHECK(v == static_cast<double>(host[i].item<float>()));
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("MemoryMonitor reports the CUDA caching allocator's counters", "[gpu]") {
  loom::MemoryMonitor monitor(c10::Device(c10::kCUDA, 0));
  const auto block = at::empty({64 << 20}, at::TensorOptions(at::kCUDA).dtype(at::kByte));
  std::map<std::string, double> m;
  for (const auto& [k, v] : monitor.report()) m[k] = v.number();
  CHECK(m.at("memory/current_allocated_mem") >= 0.067);  // 64 MiB = 0.0671 GB
  CHECK(m.at("memory/peak_reserved_mem") >= m.at("memory/current_allocated_mem"));
  CHECK(m.count("memory/alloc_retries") == 1);
}

TEST_CASE("EMA averages CUDA weights without a host sync", "[gpu]") {
  torch::nn::Linear model(8, 4);
  model->to(at::kCUDA);
  loom::optim::EMA ema(*model, {.decay = 0.5});
  loom::testing::SyncCounter counter;
  for (int i = 0; i < 10; ++i) {
    {
      at::NoGradGuard no_grad;
      model->weight.add_(1.0);
    }
    ema.update();
  }
  CHECK(loom::testing::SyncCounter::count() == 0);
  CHECK(ema.averaged()[0].second.device().is_cuda());
}

TEST_CASE("Several fused optimizers step under 16-mixed on CUDA without a host sync", "[gpu]") {
  loom::Runtime<loom::Cuda, loom::Fp16Mixed> rt;
  torch::nn::Sequential model(torch::nn::Linear(8, 16), torch::nn::ReLU(),
                              torch::nn::Linear(16, 4));
  loom::optim::AdamW a(model[0]->parameters(), loom::optim::AdamWOptions(1e-3));
  loom::optim::Adam b(model[2]->parameters(), loom::optim::AdamOptions(1e-3));
  rt.setup(model, a, b);
  const at::Tensor x = rt.to_device(at::randn({32, 8}));
  std::vector<loom::StepResult> results;
  int syncs = 0;
  for (int i = 0; i < 5; ++i) {
    loom::testing::SyncCounter counter;
    rt.backward(rt.forward(model, x).square().mean(), model);
    results = rt.optimizer_step({a, b});
    a.zero_grad();
    b.zero_grad();
    syncs += loom::testing::SyncCounter::count();
  }
  CHECK(syncs == 0);
  REQUIRE(results.size() == 2);
  CHECK_FALSE(results[0].known());  // the flags are still on the device
  CHECK(results[0].applied());
  CHECK(results[1].applied());
  CHECK(a.param_groups()[0].params()[0].is_cuda());
}

TEST_CASE("The profiler's trace holds the CUDA kernels of its window", "[gpu]") {
  const auto dir =
      std::filesystem::temp_directory_path() / ("loom_gpu_profiler_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const auto a = at::randn({512, 512}, at::TensorOptions(at::kCUDA));
  (void)a.mm(a);  // CUDA's and cuBLAS's start-up outside the window
  loom::Profiler prof({.dir = dir, .rank = 0});
  prof.start();
  for (int i = 0; i < 3; ++i) {
    loom::RecordFunction scope("product");
    (void)a.mm(a);
    prof.step();
  }
  c10::cuda::device_synchronize();
  prof.stop();
  int64_t kernels = 0;
  for (const auto& e : prof.events()) kernels += e.device == c10::DeviceType::CUDA ? 1 : 0;
  CHECK(kernels >= 3);  // a GEMM kernel a product at least
  REQUIRE(prof.traces().size() == 1);
  std::ifstream in(prof.traces()[0]);
  const std::string trace((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(trace.find("\"cat\": \"kernel\"") != std::string::npos);
  CHECK(trace.find("\"product\"") != std::string::npos);
  std::filesystem::remove_all(dir);
}
