// loom::ProgressBar, loom::SpeedMonitor and loom::MemoryMonitor: what they print and log, under
// Composer's names, and rank 0 only.
#include "support/catch.hpp"

#include <cstdio>
#include <map>
#include <string>
#include <thread>

#include <ATen/ops/full.h>
#include <c10/cuda/CUDAFunctions.h>

#include <loom/loggers/monitors.hpp>
#include <loom/loggers/progress_bar.hpp>

namespace {

std::string contents(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  char buf[256];
  while (std::fgets(buf, sizeof buf, f)) s += buf;
  return s;
}

std::map<std::string, double> numbers(const loom::Metrics& m) {
  std::map<std::string, double> out;
  for (const auto& [k, v] : m) out[k] = v.number();
  return out;
}

}  // namespace

TEST_CASE("ProgressBar prints plain lines off a terminal, on rank 0 only", "[progress]") {
  std::FILE* out = std::tmpfile();
  REQUIRE(out != nullptr);
  {
    loom::ProgressBar bar(4, 2, "train", {.out = out, .rank = 0});
    for (int i = 0; i < 4; ++i) bar.step(16, 1.0 + i);
    CHECK(bar.steps() == 4);
    CHECK(bar.mean_loss() == 2.5);
  }
  const auto text = contents(out);
  CHECK(text.find("train 2/4  50%  loss 1.5000") != std::string::npos);
  CHECK(text.find("train 4/4 100%  loss 2.5000") != std::string::npos);
  CHECK(text.find("took ") != std::string::npos);
  CHECK(text.find('\r') == std::string::npos);  // no redraws in a file
  std::fclose(out);

  std::FILE* quiet = std::tmpfile();
  {
    loom::ProgressBar bar(4, 1, "train", {.out = quiet, .rank = 1});
    for (int i = 0; i < 4; ++i) bar.step(16, 1.0);
  }
  CHECK(contents(quiet).empty());
  std::fclose(quiet);
}

TEST_CASE("ProgressBar given a runtime prints on its strategy's rank 0 only", "[progress]") {
  // What the bar asks of a runtime: rt.strategy().rank().
  struct Strategy {
    int r;
    int rank() const { return r; }
  };
  struct FakeRuntime {
    Strategy s;
    const Strategy& strategy() const { return s; }
  };
  std::FILE* out = std::tmpfile();
  REQUIRE(out != nullptr);
  {
    loom::ProgressBar bar(FakeRuntime{{0}}, 2, 1, "train", {.out = out});
    CHECK(bar.prints());
    for (int i = 0; i < 2; ++i) bar.step(16, 1.0);
  }
  CHECK(contents(out).find("train 2/2 100%") != std::string::npos);
  std::fclose(out);

  std::FILE* quiet = std::tmpfile();
  REQUIRE(quiet != nullptr);
  {
    loom::ProgressBar bar(FakeRuntime{{1}}, 2, 1, "train", {.out = quiet});
    CHECK_FALSE(bar.prints());
    for (int i = 0; i < 2; ++i) bar.step(16, 1.0);
    CHECK(loom::ProgressBar(FakeRuntime{{1}}, 2, 1, "train", {.out = quiet, .rank = 1}).prints() ==
          false);
  }
  CHECK(contents(quiet).empty());
  std::fclose(quiet);
  CHECK_THROWS_WITH(
      loom::ProgressBar(FakeRuntime{{1}}, 2, 1, "train", {.rank = 0}),
      Catch::Matchers::Equals(
          "loom::ProgressBar: the options give rank 0 but the runtime's strategy has rank 1"));
}

TEST_CASE("ProgressBar starts at a resumed step and reads tensor losses only to print",
          "[progress]") {
  std::FILE* out = std::tmpfile();
  REQUIRE(out != nullptr);
  {
    loom::ProgressBar bar(10, 2, "train", {.out = out, .rank = 0, .initial = 6});
    CHECK(bar.steps() == 6);
    at::Tensor first = at::full({}, 1.0f);
    bar.step(16, first);
    first.fill_(100.0f);  // the bar copied the value it was given
    bar.step(16, at::full({1}, 3.0f));
    CHECK(bar.steps() == 8);
    bar.step(16, 5.0);  // a number and tensors in one window
    bar.step(16, at::full({}, 7.0, at::kDouble));
    CHECK(bar.mean_loss() == (1.0 + 3.0 + 5.0 + 7.0) / 4);
  }
  const auto text = contents(out);
  CHECK(text.find("train  8/10  80%  loss 2.0000") != std::string::npos);  // steps 7 and 8
  CHECK(text.find("train 10/10 100%") != std::string::npos);
  CHECK(text.find("train  2/") == std::string::npos);  // never counted from 0
  std::fclose(out);
}

TEST_CASE("SpeedMonitor logs Composer's throughput, flops and time metrics", "[monitors]") {
  loom::SpeedMonitor speed(
      {.window_size = 2, .flops_per_sample = 1e6, .device_peak_flops = 1e12, .world_size = 2});
  auto first = numbers(speed.step(8));
  CHECK(first.count("throughput/samples_per_sec") == 0);  // the window is not full yet
  CHECK(first.count("time/train") == 1);
  CHECK(first.at("time/secs_per_step") == 0.0);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  speed.step(8);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  auto m = numbers(speed.step(8, 100));
  const double batches = m.at("throughput/batches_per_sec");
  CHECK(batches > 0);
  CHECK(m.at("throughput/samples_per_sec") == Approx(batches * 16));  // 8 per rank, 2 ranks
  CHECK(m.at("throughput/device/samples_per_sec") == Approx(batches * 8));
  CHECK(m.at("throughput/device/batches_per_sec") == Approx(batches / 2));
  CHECK(m.at("throughput/tokens_per_sec") == Approx(batches / 2 * 200));  // 200 in 2 steps
  CHECK(m.at("throughput/flops_per_sec") == Approx(batches * 16 * 1e6));
  CHECK(m.at("throughput/device/mfu") == Approx(batches * 8 * 1e6 / 1e12));
  CHECK(m.at("time/secs_per_step") > 0.004);
  CHECK(m.at("time/total") == Approx(m.at("time/train") + m.at("time/val")));
  CHECK_THROWS_WITH(loom::SpeedMonitor({.window_size = 0}),
                    Catch::Matchers::Contains("window_size must be at least 1"));
}

TEST_CASE("MemoryMonitor reports the process's memory, and CUDA's where there is CUDA",
          "[monitors]") {
  loom::MemoryMonitor cpu;
  const auto m = numbers(cpu.report());
  CHECK(m.at("memory/cpu_rss_mem") > 0.0);
  CHECK(m.at("memory/cpu_peak_rss_mem") >= m.at("memory/cpu_rss_mem"));
  CHECK(m.count("memory/current_allocated_mem") == 0);
  if (c10::cuda::device_count() == 0) {
    CHECK_THROWS_WITH(loom::MemoryMonitor(c10::Device(c10::kCUDA, 0)),
                      Catch::Matchers::Contains("CUDA is not available"));
  } else {
    const auto g = numbers(loom::MemoryMonitor(c10::Device(c10::kCUDA, 0)).report());
    CHECK(g.count("memory/peak_reserved_mem") == 1);
    CHECK(g.count("memory/alloc_retries") == 1);
  }
}
