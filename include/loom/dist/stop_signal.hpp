#pragma once
// loom::StopSignal: preemption. SIGTERM, SIGINT and SIGUSR1 (a cluster's wall-time warning, a
// spot preemption, torchrun passing on its own SIGTERM, Ctrl-C) become a flag; at a step
// boundary should_stop(rt) agrees on it across the ranks, so that every rank saves the same
// step and leaves with the same exit code. Opt-in: #include <loom/dist/stop_signal.hpp>.
#include <atomic>
#include <csignal>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include <loom/concepts/strategy.hpp>
#include <loom/error.hpp>

namespace loom::dist {

/// StopSignal's settings.
struct StopSignalOptions {
  /// The signals that ask the run to stop: SIGTERM (schedulers, torchrun, `kill`), SIGINT
  /// (Ctrl-C; a second one stops the process at once) and SIGUSR1 (SLURM's --signal).
  std::vector<int> signals{SIGTERM, SIGINT, SIGUSR1};
  /// should_stop(rt) asks the other ranks on every N-th call (one all-reduce of one int and a
  /// read of it to the host); the calls in between answer false without any collective. One
  /// process (SingleProcess, or a Ddp of one rank) looks at its own flag on every call.
  std::int64_t check_every = 1;
};

/// Turns stop signals into a flag while it lives (the previous handlers come back when it
/// is destroyed), and agrees on that flag across the ranks at step boundaries.
///
///   loom::StopSignal stop;                     // before the loop, on every rank
///   for (; step < steps; ++step) {
///     train_step();
///     if (stop.should_stop(rt)) {              // every rank, after the same step
///       ckpt.save(rt, step + 1, state);        // every rank saves step + 1
///       return stop.exit_code();               // 128 + the signal: 143 for SIGTERM
///     }
///   }
///
/// The handler only stores the signal's number (async-signal-safe); nothing is written from
/// it. A signal that reaches one rank stops them all at the next agreed check: the number is
/// all-reduced with Max, so every rank returns true after the same call, with the same
/// signal(). The flag belongs to the process: it outlives the StopSignal that caught it
/// (received() tells), and clear() resets it.
class StopSignal {
 public:
  explicit StopSignal(StopSignalOptions options = {}) : options_(std::move(options)) {
    if (options_.check_every < 1) {
      throw Error("loom::StopSignal: check_every must be at least 1");
    }
    for (int sig : options_.signals) {
      struct sigaction action {};
      action.sa_handler = &StopSignal::handle;
      sigemptyset(&action.sa_mask);
      action.sa_flags = SA_RESTART;
      struct sigaction previous {};
      if (sigaction(sig, &action, &previous) != 0) {
        restore();
        throw Error("loom::StopSignal: cannot handle signal " + std::to_string(sig));
      }
      installed_.emplace_back(sig, previous);
    }
  }
  StopSignal(const StopSignal&) = delete;
  StopSignal& operator=(const StopSignal&) = delete;
  ~StopSignal() { restore(); }

  /// The signal this process received (0: none): local, no collective.
  static int received() { return flag().load(std::memory_order_relaxed); }
  /// Stops the run as if `sig` had arrived (a watchdog, a time budget, a test).
  static void request(int sig = SIGTERM) { flag().store(sig, std::memory_order_relaxed); }
  /// Forgets a received signal.
  static void clear() { flag().store(0, std::memory_order_relaxed); }

  /// At a step boundary, on every rank: true when any rank received a stop signal, decided
  /// on the same call on every rank. Every check_every-th call all-reduces the signal number
  /// (Max) on the runtime's device and reads it back; other calls return false.
  template <class Runtime>
  bool should_stop(Runtime& rt) {
    if (agreed_ != 0) return true;
    auto& strategy = rt.strategy();
    if (strategy.world_size() == 1) {
      agreed_ = received();
      return agreed_ != 0;
    }
    if (++calls_ % options_.check_every != 0) return false;
    at::Tensor t = rt.to_device(at::full({1}, received(), at::kInt));
    strategy.all_reduce(t, dist::ReduceOp::Max);
    agreed_ = t.item<int>();
    return agreed_ != 0;
  }

  /// The signal the ranks agreed on after should_stop returned true (0 before).
  int signal() const { return agreed_; }
  /// The exit code of a process stopped by signal(): 128 + its number, as a shell reports
  /// a process that a signal ended (143 for SIGTERM, 130 for SIGINT, 138 for SIGUSR1), so
  /// that a scheduler or a launcher sees a stopped run, not a finished one. 0 before.
  int exit_code() const { return agreed_ == 0 ? 0 : 128 + agreed_; }

 private:
  static std::atomic<int>& flag() {
    static std::atomic<int> value{0};
    return value;
  }
  static void handle(int sig) {
    // Ctrl-C twice: the second one ends the process as if no handler had been installed.
    if (sig == SIGINT && flag().load(std::memory_order_relaxed) == SIGINT) {
      std::signal(SIGINT, SIG_DFL);
      std::raise(SIGINT);
      return;
    }
    flag().store(sig, std::memory_order_relaxed);
  }
  void restore() {
    for (auto it = installed_.rbegin(); it != installed_.rend(); ++it) {
      sigaction(it->first, &it->second, nullptr);
    }
    installed_.clear();
  }

  StopSignalOptions options_;
  std::vector<std::pair<int, struct sigaction>> installed_;
  std::int64_t calls_ = 0;
  int agreed_ = 0;
};

static_assert(std::atomic<int>::is_always_lock_free,
              "loom::StopSignal's handler stores into a lock-free atomic");

}  // namespace loom::dist

// In loom::, where users write them.
namespace loom {
using dist::StopSignal;
using dist::StopSignalOptions;
}  // namespace loom
