#pragma once
// loom::ProgressBar: a training progress bar in the spirit of Lightning's and tqdm's, printed
// by rank 0 only.
//
//   loom::ProgressBar bar(rt, total_steps, 100, "train", {.initial = resumed_step});
//   for (...) { ...; bar.step(batch_size, loss); }   // loss: a tensor, read only to print
//   bar.finish();                                    // total <= 0: no bar and no ETA
//
// On a terminal it redraws one line with '\r' (at most ten times a second):
//   train  420/938 [##########............]  45%  loss 0.4821  38211 samples/s  ETA 0:05
// Elsewhere (ctest, pipes, CI logs) a redrawn line would be one huge line of '\r's, so it
// prints plain lines with the same fields every `every` steps, at least every 2 s, and once
// more at the end. Given the runtime, it prints where rt.strategy().rank() is 0; without it,
// where ProgressBarOptions::rank is 0 or unset (no environment variable is read).
// The loss shown is the mean of the last 20 steps, as Lightning's bar shows it: one step's
// loss is too noisy to read. A loss given as a tensor (on any device) is kept as it is and
// read when a line is printed, all the kept ones in one copy: no host sync per step.
#include <algorithm>
#include <array>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

#include <unistd.h>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <loom/error.hpp>

namespace loom::loggers {

/// Where and by whom a ProgressBar prints.
struct ProgressBarOptions {
  std::FILE* out = stdout;  ///< a terminal redraws one line; anything else gets plain lines
  /// Only rank 0 prints; unset: the runtime's strategy's rank where the bar is given the
  /// runtime (ProgressBar(rt, ...)), else 0.
  std::optional<int64_t> rank = std::nullopt;
  /// The steps done before this bar started (tqdm's `initial`): a resumed run's step. The
  /// count and the bar start there; samples/s and the ETA count only the steps made since.
  int64_t initial = 0;
};

/// A progress bar for a training loop (see the top of this header): a redrawn line with ETA
/// on a terminal, plain periodic lines elsewhere, nothing on ranks other than 0.
class ProgressBar {
 public:
  /// `total` steps expected (<= 0: unknown); plain mode prints every `every` steps.
  explicit ProgressBar(int64_t total, int64_t every = 100, std::string label = "train",
                       ProgressBarOptions options = {})
      : total_(total),
        every_(every > 0 ? every : 1),
        label_(std::move(label)),
        out_(options.out),
        tty_(isatty(fileno(options.out)) != 0),
        quiet_(options.rank.value_or(0) != 0),
        start_(Clock::now()),
        last_line_(start_),
        initial_(std::max<int64_t>(options.initial, 0)),
        steps_(initial_),
        printed_step_(initial_) {}
  /// The same, printing on rank 0 of `rt`'s strategy only (a loom::Runtime, or anything with
  /// strategy().rank()): the bar of a Ddp run prints once. An options.rank other than that
  /// rank is a loom::Error naming both.
  template <class R>
  requires requires(const R& r) {
    { r.strategy().rank() } -> std::convertible_to<int64_t>;
  }
  ProgressBar(const R& rt, int64_t total, int64_t every = 100, std::string label = "train",
              ProgressBarOptions options = {})
      : ProgressBar(total, every, std::move(label),
                    with_rank(options, static_cast<int64_t>(rt.strategy().rank()))) {}

  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;
  ~ProgressBar() { finish(); }

  /// Whether this process prints: it is rank 0.
  bool prints() const noexcept { return !quiet_; }

  /// Records one finished step of `samples` samples and its loss; prints when it is time.
  void step(int64_t samples, double loss) {
    if (quiet_) return;
    const std::size_t slot = next_slot(samples);
    window_[slot] = loss;
    pending_[slot] = at::Tensor();
    maybe_print();
  }
  /// The same with the loss as a tensor of one element on any device: copied on its device
  /// (the value of now, whatever later happens to `loss`) and read only when a line is
  /// printed, the window's copies together.
  void step(int64_t samples, const at::Tensor& loss) {
    if (quiet_) return;
    const std::size_t slot = next_slot(samples);
    pending_[slot] = loss.detach().reshape({}).clone();
    maybe_print();
  }

 private:
  std::size_t next_slot(int64_t samples) {
    ++steps_;
    samples_ += samples;
    return static_cast<std::size_t>(steps_ - initial_ - 1) % window_.size();
  }
  void maybe_print() {
    const auto now = Clock::now();
    const double since_line = seconds(last_line_, now);
    const bool due = tty_ ? since_line >= 0.1 : steps_ % every_ == 0 || since_line >= plain_seconds;
    if (due) print(now);
  }

 public:
  /// Prints the last line (if the last step has not been printed yet) and ends it.
  void finish() {
    if (finished_) return;
    finished_ = true;
    if (steps_ == initial_) return;
    if (tty_ || printed_step_ != steps_) print(Clock::now());
    if (tty_) std::fputc('\n', out_);
    std::fflush(out_);
  }

  /// The steps counted, `initial` included.
  int64_t steps() const { return steps_; }
  /// The mean loss of the last (up to) 20 steps of this bar; tensors given to step() are read
  /// here, together (one copy to the host per call).
  double mean_loss() {
    const auto n = static_cast<std::size_t>(std::min<int64_t>(steps_ - initial_, window_.size()));
    at::Tensor on_device;
    for (std::size_t i = 0; i < n; ++i) {
      if (!pending_[i].defined()) continue;
      const at::Tensor v = pending_[i].to(c10::kDouble);
      on_device = on_device.defined() ? on_device.add(v) : v;
    }
    double sum = on_device.defined() ? on_device.item<double>() : 0.0;
    for (std::size_t i = 0; i < n; ++i) sum += pending_[i].defined() ? 0.0 : window_[i];
    return n == 0 ? 0.0 : sum / static_cast<double>(n);
  }

 private:
  using Clock = std::chrono::steady_clock;
  static ProgressBarOptions with_rank(ProgressBarOptions options, int64_t rank) {
    if (options.rank && *options.rank != rank) {
      throw Error("loom::ProgressBar: the options give rank " + std::to_string(*options.rank) +
                  " but the runtime's strategy has rank " + std::to_string(rank));
    }
    options.rank = rank;
    return options;
  }
  static double seconds(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  }

  /// "1:05" or "1:02:05".
  static std::string clock_time(double secs) {
    const auto s = static_cast<long long>(secs + 0.5);
    char buf[32];
    if (s >= 3600) {
      std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
    } else {
      std::snprintf(buf, sizeof buf, "%lld:%02lld", s / 60, s % 60);
    }
    return buf;
  }

  void print(Clock::time_point now) {
    const double elapsed = std::max(seconds(start_, now), 1e-9);
    const double rate = static_cast<double>(samples_) / elapsed;
    const auto done_here = static_cast<double>(std::max<int64_t>(steps_ - initial_, 1));
    std::string line = label_;
    line.push_back(' ');
    char buf[96];
    if (total_ > 0) {
      const double done = std::min(1.0, static_cast<double>(steps_) / static_cast<double>(total_));
      std::snprintf(buf, sizeof buf, "%*lld/%lld ", digits(total_), static_cast<long long>(steps_),
                    static_cast<long long>(total_));
      line += buf;
      if (tty_) {  // the bar only where it redraws; in a log the percentage says the same
        constexpr int width = 24;
        const int filled = static_cast<int>(done * width);
        line.push_back('[');
        line.append(static_cast<std::size_t>(filled), '#');
        line.append(static_cast<std::size_t>(width - filled), '.');
        line.append("] ");
      }
      std::snprintf(buf, sizeof buf, "%3d%%  ", static_cast<int>(done * 100));
      line += buf;
    } else {
      std::snprintf(buf, sizeof buf, "step %lld  ", static_cast<long long>(steps_));
      line += buf;
    }
    std::snprintf(buf, sizeof buf, "loss %.4f  %.0f samples/s", mean_loss(), rate);
    line += buf;
    if (total_ > 0) {
      const double eta =
          elapsed / done_here * static_cast<double>(std::max<int64_t>(total_ - steps_, 0));
      line.append(steps_ >= total_ ? "  took " : "  ETA ");
      line.append(clock_time(steps_ >= total_ ? elapsed : eta));
    }
    if (tty_) {
      // "\033[K" clears what a longer previous line left to the right.
      std::fprintf(out_, "\r%s\033[K", line.c_str());
    } else {
      std::fprintf(out_, "%s\n", line.c_str());
    }
    std::fflush(out_);
    printed_step_ = steps_;
    last_line_ = now;
  }

  static int digits(int64_t n) {
    int d = 1;
    while (n >= 10) {
      n /= 10;
      ++d;
    }
    return d;
  }

  static constexpr double plain_seconds = 2.0;  // plain mode: at least one line this often

  int64_t total_;
  int64_t every_;
  std::string label_;
  std::FILE* out_;
  bool tty_, quiet_;
  Clock::time_point start_, last_line_;
  int64_t initial_;
  int64_t steps_, samples_ = 0, printed_step_;
  std::array<double, 20> window_{};
  std::array<at::Tensor, 20> pending_{};  // losses given as tensors, not read yet
  bool finished_ = false;
};

}  // namespace loom::loggers

// The loggers' names in loom::, where users write them.
namespace loom {
using loggers::ProgressBar;
using loggers::ProgressBarOptions;
}  // namespace loom
