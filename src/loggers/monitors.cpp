// loom::SpeedMonitor and loom::MemoryMonitor (include/loom/loggers/monitors.hpp).
#include <loom/loggers/monitors.hpp>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

#include <loom/error.hpp>

namespace loom::loggers {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// Composer's `round(bytes / 1e9, 5)`.
double gigabytes(double bytes) { return std::nearbyint(bytes / 1.0e9 * 1e5) / 1e5; }

}  // namespace

SpeedMonitor::SpeedMonitor(SpeedMonitorOptions options) : o_(options), start_s_(now_s()) {
  if (o_.window_size < 1) throw Error("loom::SpeedMonitor: window_size must be at least 1");
  if (o_.world_size < 1) throw Error("loom::SpeedMonitor: world_size must be at least 1");
}

Metrics SpeedMonitor::step(int64_t samples, int64_t tokens) {
  const auto world = static_cast<double>(o_.world_size);
  samples_ += samples * o_.world_size;
  tokens_ += tokens * o_.world_size;
  const double train_s = now_s() - start_s_ - eval_s_;
  const auto keep = static_cast<std::size_t>(o_.window_size + 1);
  auto push = [keep](auto& q, auto v) {
    q.push_back(v);
    if (q.size() > keep) q.pop_front();
  };
  push(hist_samples_, samples_);
  push(hist_tokens_, tokens_);
  push(hist_s_, train_s);
  if (o_.flops_per_sample > 0) {
    push(hist_flops_, o_.flops_per_sample * static_cast<double>(samples) * world);
  }

  Metrics m;
  if (hist_s_.size() == keep) {
    const double elapsed = hist_s_.back() - hist_s_.front();
    const double batches = static_cast<double>(keep - 1) / elapsed;
    const double per_s =
        static_cast<double>(hist_samples_.back() - hist_samples_.front()) / elapsed;
    m.emplace_back("throughput/batches_per_sec", batches);
    m.emplace_back("throughput/samples_per_sec", per_s);
    m.emplace_back("throughput/device/batches_per_sec", batches / world);
    m.emplace_back("throughput/device/samples_per_sec", per_s / world);
    const auto toks = hist_tokens_.back() - hist_tokens_.front();
    if (toks > 0) {
      m.emplace_back("throughput/tokens_per_sec", static_cast<double>(toks) / elapsed);
      m.emplace_back("throughput/device/tokens_per_sec",
                     static_cast<double>(toks) / elapsed / world);
    }
  }
  if (!hist_flops_.empty() && hist_flops_.size() == keep) {
    const double elapsed = hist_s_.back() - hist_s_.front();
    const double flops =
        std::accumulate(hist_flops_.begin(), hist_flops_.end(), 0.0) - hist_flops_.front();
    m.emplace_back("throughput/flops_per_sec", flops / elapsed);
    m.emplace_back("throughput/device/flops_per_sec", flops / elapsed / world);
    if (o_.device_peak_flops > 0) {
      m.emplace_back("throughput/device/mfu", flops / elapsed / world / o_.device_peak_flops);
    }
  }
  constexpr double hour = 3600.0;
  m.emplace_back("time/train", train_s / hour);
  m.emplace_back("time/val", eval_s_ / hour);
  m.emplace_back("time/total", (train_s + eval_s_) / hour);
  m.emplace_back("time/secs_per_step",
                 hist_s_.size() > 1 ? hist_s_.back() - hist_s_[hist_s_.size() - 2] : 0.0);
  return m;
}

MemoryMonitor::MemoryMonitor(std::optional<c10::Device> device) : device_(device) {
  if (device_ && device_->is_cuda() && c10::cuda::device_count() == 0) {
    throw Error("loom::MemoryMonitor: CUDA is not available (no CUDA device or driver)");
  }
}

Metrics MemoryMonitor::report() const {
  Metrics m;
  if (device_ && device_->is_cuda()) {
    using c10::CachingAllocator::StatType;
    const auto idx = device_->has_index() ? device_->index() : c10::DeviceIndex{0};
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(idx);
    const auto all = static_cast<std::size_t>(StatType::AGGREGATE);
    auto both = [&](const char* name, const auto& stat) {
      m.emplace_back(std::string("memory/current_") + name,
                     gigabytes(static_cast<double>(stat[all].current)));
      m.emplace_back(std::string("memory/peak_") + name,
                     gigabytes(static_cast<double>(stat[all].peak)));
    };
    both("allocated_mem", stats.allocated_bytes);
    both("active_mem", stats.active_bytes);
    both("inactive_mem", stats.inactive_split_bytes);
    both("reserved_mem", stats.reserved_bytes);
    m.emplace_back("memory/alloc_retries", static_cast<int64_t>(stats.num_alloc_retries));
  }
  long pages = 0, resident = 0;
  if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  const double rss = static_cast<double>(resident) * static_cast<double>(::sysconf(_SC_PAGESIZE));
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  // The kernel's high-water mark lags the current count a little: the peak is at least now.
  const double peak = std::max(rss, static_cast<double>(u.ru_maxrss) * 1024.0);
  m.emplace_back("memory/cpu_rss_mem", gigabytes(rss));
  m.emplace_back("memory/cpu_peak_rss_mem", gigabytes(peak));
  return m;
}

}  // namespace loom::loggers
