// A loader whose batches take L ms to make (a sleep: I/O or decoding elsewhere) against a
// training step of C ms (a busy wait on this thread), on the CPU, inline (depth 0) and with
// the producer thread of data/prefetch.hpp (depth 1 and 2). With prefetch the time per batch
// should approach max(L, C); inline it is L + C. Reported time: wall time per batch.
// Run by scripts/run_prefetch_benchmark.sh; results in docs/data-path.md.
#include <algorithm>
#include <chrono>
#include <ranges>
#include <thread>
#include <tuple>

#include <benchmark/benchmark.h>

#include <loom/device/cpu.hpp>
#include <loom/device/prefetch.hpp>

namespace {

using Clock = std::chrono::steady_clock;
constexpr int batches_per_epoch = 24;

void busy_wait(std::chrono::microseconds d) {
  const auto until = Clock::now() + d;
  while (Clock::now() < until) {
  }
}

void bm_loader(benchmark::State& state) {
  const auto load = std::chrono::milliseconds(state.range(0));
  const auto compute = std::chrono::milliseconds(state.range(1));
  const auto depth = std::size_t(state.range(2));  // 0: inline, no producer thread
  auto source = std::views::iota(0, batches_per_epoch) | std::views::transform([&](int i) {
                  std::this_thread::sleep_for(load);
                  return std::make_tuple(at::full({64}, float(i)), i);  // (64,) f32, label
                });
  loom::device::Cpu cpu;
  auto step = [&](const std::tuple<at::Tensor, int>& b) {
    busy_wait(compute);
    benchmark::DoNotOptimize(std::get<0>(b).data_ptr());
  };
  auto inline_view = cpu.dataloader_to_device(source);
  auto prefetch_view = cpu.dataloader_to_device(
      source, loom::device::NoPrefetch{}, loom::device::Prefetch{std::max<std::size_t>(depth, 1)});
  double total = 0;
  for (auto _ : state) {
    const auto start = Clock::now();
    int n = 0;
    if (depth > 0) {
      for (auto& b : prefetch_view) step(b), ++n;
    } else {
      for (auto& b : inline_view) step(b), ++n;
    }
    const double per_batch = std::chrono::duration<double>(Clock::now() - start).count() / n;
    state.SetIterationTime(per_batch);
    total += per_batch;
  }
  const double bound_ms = double(std::max(state.range(0), state.range(1)));
  const double mean_ms = 1e3 * total / double(state.iterations());
  state.counters["L_ms"] = double(state.range(0));
  state.counters["C_ms"] = double(state.range(1));
  state.counters["depth"] = double(depth);
  state.counters["ms_per_batch"] = mean_ms;
  state.counters["x_max_LC"] = mean_ms / bound_ms;  // target with prefetch: <= 1.1
}

void pairs(benchmark::internal::Benchmark* b) {
  for (auto [l, c] : {std::pair{5, 5}, {10, 2}, {2, 10}, {8, 8}, {1, 1}}) {
    for (int depth : {0, 1, 2}) b->Args({l, c, depth});
  }
}

BENCHMARK(bm_loader)
    ->ArgNames({"L_ms", "C_ms", "depth"})
    ->Apply(pairs)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(5)
    ->Repetitions(3)
    ->ReportAggregatesOnly(true);

}  // namespace

BENCHMARK_MAIN();
