// Host-to-device prefetch on a GPU, the measurement that decides whether Cuda prefetches by
// default (docs/data-path.md): pinned batches of >= 64 MiB, a step whose GPU time is set
// relative to one batch's copy time, mean step time with and without Cuda's prefetching view
// (both pinned + non-blocking), and the peak device memory of each of 3 epochs. Prints
// `key value` lines (scripts/gpu-check.sh turns them into a report); exits 0 with "no GPU"
// where CUDA is missing.
//
//   loom_bench_prefetch_cuda [batch_mib=64] [batches=16] [epochs=3]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>

#include <loom/device/cuda.hpp>
#include <loom/device/prefetch.hpp>

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

/// The "model": `reps` matmuls of a (n, n) f32 weight with a (n, n) slice of the batch.
struct Step {
  at::Tensor weight;  // (n, n) f32
  int reps;
  void operator()(const at::Tensor& x) const {  // x: (rows, n) f32 on the device
    at::Tensor h = x.narrow(0, 0, weight.size(0));
    for (int i = 0; i < reps; ++i) h = at::mm(h, weight).tanh_();
    (void)h.sum();
  }
};

struct Result {
  double mean_step_ms;
  std::vector<double> peak_mib;  // per epoch
};

Result run(const loom::device::Cuda& cuda, std::vector<at::Tensor>& source, const Step& step,
           int epochs, bool prefetch) {
  const auto dev = cuda.index();
  namespace alloc = c10::cuda::CUDACachingAllocator;
  Result r{0, {}};
  auto epoch = [&](auto& view) {
    alloc::resetPeakStats(dev);
    const auto start = Clock::now();
    int n = 0;
    for (auto& x : view) step(x), ++n;
    c10::cuda::device_synchronize();
    const double s = seconds_since(start) / n;
    const auto stats = alloc::getDeviceStats(dev);
    r.peak_mib.push_back(double(stats
                                    .allocated_bytes[static_cast<std::size_t>(
                                        c10::CachingAllocator::StatType::AGGREGATE)]
                                    .peak) /
                         (1 << 20));
    return s;
  };
  double total = 0;
  if (prefetch) {
    auto view =
        cuda.dataloader_to_device(source, loom::device::NoPrefetch{}, loom::device::Prefetch{1});
    epoch(view);  // warm-up
    r.peak_mib.clear();
    for (int e = 0; e < epochs; ++e) total += epoch(view);
  } else {
    auto view = cuda.dataloader_to_device(source);
    epoch(view);
    r.peak_mib.clear();
    for (int e = 0; e < epochs; ++e) total += epoch(view);
  }
  r.mean_step_ms = 1e3 * total / epochs;
  return r;
}

/// GPU time of one batch copy and of one step of `reps` matmuls, in ms.
double time_copy_ms(const loom::device::Cuda& cuda, const at::Tensor& pinned) {
  for (int i = 0; i < 3; ++i) (void)cuda.tensor_to_device(pinned);
  c10::cuda::device_synchronize();
  const auto start = Clock::now();
  for (int i = 0; i < 10; ++i) (void)cuda.tensor_to_device(pinned);
  c10::cuda::device_synchronize();
  return 1e3 * seconds_since(start) / 10;
}

double time_step_ms(const Step& step, const at::Tensor& x) {
  for (int i = 0; i < 3; ++i) step(x);
  c10::cuda::device_synchronize();
  const auto start = Clock::now();
  for (int i = 0; i < 10; ++i) step(x);
  c10::cuda::device_synchronize();
  return 1e3 * seconds_since(start) / 10;
}

void print_case(const char* name, const Result& off, const Result& on) {
  std::printf("%s.off_ms %.4f\n%s.on_ms %.4f\n%s.ratio %.4f\n", name, off.mean_step_ms, name,
              on.mean_step_ms, name, on.mean_step_ms / off.mean_step_ms);
  for (std::size_t e = 0; e < on.peak_mib.size(); ++e) {
    std::printf("%s.peak_mib.epoch%zu off %.1f on %.1f\n", name, e, off.peak_mib[e],
                on.peak_mib[e]);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int batch_mib = argc > 1 ? std::atoi(argv[1]) : 64;
  const int batches = argc > 2 ? std::atoi(argv[2]) : 16;
  const int epochs = argc > 3 ? std::atoi(argv[3]) : 3;
  if (!loom::device::Cuda::is_available()) {
    std::printf("no GPU: CUDA is not available; nothing measured\n");
    return 0;
  }
  loom::device::Cuda cuda(0);
  cuda.prepare();
  const int64_t n = 1024;                                       // model width
  const int64_t rows = int64_t(batch_mib) * (1 << 20) / 4 / n;  // (rows, 1024) f32
  std::vector<at::Tensor> source;
  for (int i = 0; i < batches; ++i) source.push_back(at::randn({rows, n}).pin_memory());
  at::Tensor weight = at::randn({n, n}, at::TensorOptions().device(cuda.device())) / 32;

  const double copy_ms = time_copy_ms(cuda, source[0]);
  const double one_mm_ms = time_step_ms(Step{weight, 1}, cuda.tensor_to_device(source[0]));
  std::printf("device %s\nbatch_mib %d\nbatches %d\nepochs %d\ncopy_ms %.4f\nmatmul_ms %.4f\n",
              cuda.device().str().c_str(), batch_mib, batches, epochs, copy_ms, one_mm_ms);

  // H2D-bound: the step takes about half a copy. Compute-bound: about four copies.
  const int light = std::max(1, int(0.5 * copy_ms / std::max(one_mm_ms, 1e-3)));
  const int heavy = std::max(2, int(4.0 * copy_ms / std::max(one_mm_ms, 1e-3)));
  for (auto [name, reps] : {std::pair{"h2d_bound", light}, std::pair{"compute_bound", heavy}}) {
    Step step{weight, reps};
    std::printf("%s.reps %d\n%s.step_ms %.4f\n", name, reps, name,
                time_step_ms(step, cuda.tensor_to_device(source[0])));
    Result off = run(cuda, source, step, epochs, false);
    Result on = run(cuda, source, step, epochs, true);
    print_case(name, off, on);
  }
  return 0;
}
