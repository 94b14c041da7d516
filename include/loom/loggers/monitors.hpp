#pragma once
// loom::SpeedMonitor and loom::MemoryMonitor: Composer's throughput and memory metrics, under
// Composer's names, for the loggers (rt.log_dict(monitor.step(...), step)).
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/Device.h>

#include <loom/loggers/logger.hpp>

namespace loom::loggers {

/// Metrics by name, for rt.log_dict or a logger's log_dict.
using Metrics = std::vector<std::pair<std::string, MetricValue>>;

/// SpeedMonitor's settings, Composer's arguments.
struct SpeedMonitorOptions {
  /// Steps in the rolling window; the throughput is logged once window_size + 1 steps are in.
  int64_t window_size = 100;
  /// The model's flops per sample (forward and backward; 6 x parameters per token for a
  /// transformer is the usual estimate); 0: no flops metrics.
  double flops_per_sample = 0.0;
  /// The device's peak flops per second in the precision trained (e.g. 989e12 for an H100's
  /// dense bf16); 0: no MFU.
  double device_peak_flops = 0.0;
  /// The processes training together (each step's samples are this process's; all ranks are
  /// taken to process as many).
  int64_t world_size = 1;
};

/// Composer's SpeedMonitor: after each step, `step(samples, tokens)` returns
/// `throughput/batches_per_sec`, `throughput/samples_per_sec`, their `throughput/device/...`
/// (divided by the world size), `throughput/tokens_per_sec` (where tokens are given),
/// `throughput/flops_per_sec`, `throughput/device/flops_per_sec` and `throughput/device/mfu`
/// (where flops are), each a rolling average over the last window_size steps, and always
/// `time/train`, `time/val`, `time/total` (hours, Composer's default unit), `time/secs_per_step`.
/// Wall time counts from construction; add_eval_time takes evaluation out of `time/train`.
class SpeedMonitor {
 public:
  explicit SpeedMonitor(SpeedMonitorOptions options = {});

  /// One finished training step of `samples` samples (and `tokens` tokens) in this process.
  Metrics step(int64_t samples, int64_t tokens = 0);
  /// Seconds spent evaluating since the last call (counted as `time/val`).
  void add_eval_time(double seconds) { eval_s_ += seconds; }

 private:
  SpeedMonitorOptions o_;
  double start_s_;
  double eval_s_ = 0.0;
  int64_t samples_ = 0, tokens_ = 0;
  std::deque<int64_t> hist_samples_, hist_tokens_;
  std::deque<double> hist_s_, hist_flops_;
};

/// Composer's MemoryMonitor on CUDA: `memory/current_allocated_mem`, `current_active_mem`,
/// `current_inactive_mem`, `current_reserved_mem`, their `peak_...` and `alloc_retries`, from
/// the caching allocator's statistics of the device, in gigabytes (1e9 bytes) rounded to 5
/// places as Composer logs them; and on every device loom's `memory/cpu_rss_mem` and
/// `memory/cpu_peak_rss_mem` (the process's resident memory, gigabytes).
class MemoryMonitor {
 public:
  /// `device`: the CUDA device to report (none, or a CPU device: the CPU numbers only).
  explicit MemoryMonitor(std::optional<c10::Device> device = std::nullopt);

  /// The numbers now (reads the allocator's counters: no device sync).
  Metrics report() const;

 private:
  std::optional<c10::Device> device_;
};

}  // namespace loom::loggers

// The loggers' names in loom::, where users write them.
namespace loom {
using loggers::MemoryMonitor;
using loggers::Metrics;
using loggers::SpeedMonitor;
using loggers::SpeedMonitorOptions;
}  // namespace loom
