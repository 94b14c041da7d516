#pragma once
// loom::Profiler: torch.profiler.profile with a schedule, on Kineto's C++ API (the profiler
// LibTorch ships without a schedule): the steps to skip, wait, warm up and record, a Chrome
// trace per rank for each recorded window (TensorBoard's profiler plugin and Perfetto open
// it), and Python's key_averages().table(). loom::RecordFunction names a scope in the trace
// (Python's record_function). Opt-in: #include <loom/profiler.hpp>; the Kineto side is
// compiled into the loom library (src/profiler.cpp).
//
//   loom::Profiler prof({.schedule = loom::ProfilerSchedule{.wait = 1, .warmup = 1, .active = 2,
//                                                           .repeat = 1},
//                        .dir = "runs/profile"});
//   prof.start();
//   for (int step = 0; step < steps; ++step) {
//     train_step();
//     prof.step();                    // the step ends: the schedule moves on
//   }
//   prof.stop();                      // runs/profile/rank-0.step-3.pt.trace.json
//   std::cout << prof.table();
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/record_function.h>
#include <c10/core/DeviceType.h>

namespace loom {

/// What the profiler does during a step (Python's ProfilerAction): nothing, run without
/// keeping what it records (its start-up cost paid outside the window), record, or record
/// this window's last step and then hand the window over (a trace written, on_trace_ready).
enum class ProfilerAction { None, Warmup, Record, RecordAndSave };

/// Python's torch.profiler.schedule: the first `skip_first` steps nothing, then cycles of
/// `wait` steps of nothing, `warmup` steps of warming up and `active` steps recorded, `repeat`
/// cycles (0: as many as the run has); `skip_first_wait` leaves out the first cycle's wait.
struct ProfilerSchedule {
  int64_t wait = 0;
  int64_t warmup = 0;
  int64_t active = 1;
  int64_t repeat = 0;
  int64_t skip_first = 0;
  bool skip_first_wait = false;

  /// The action of step `step` (from 0), as Python's schedule_fn gives it. A negative step,
  /// or a schedule with a negative count or no active step, is a loom::Error.
  ProfilerAction operator()(int64_t step) const;
};

class Profiler;

/// A Profiler's settings.
struct ProfilerOptions {
  /// None: every step recorded, one window from start() to stop() (Python's profile without
  /// a schedule).
  std::optional<ProfilerSchedule> schedule{};
  /// Where each window's trace is written: DIR/rank-R.step-N.pt.trace.json (N: the window's
  /// last recorded step; ".pt.trace.json" is what TensorBoard's profiler plugin looks for). Created
  /// when needed. Empty: no file (on_trace_ready still runs).
  std::filesystem::path dir{};
  /// The R of the file names and of the trace's distributedInfo: RANK's value when unset.
  std::optional<int> rank{};
  /// The trace's distributedInfo (TensorBoard's distributed view) when the world has more
  /// than one rank: WORLD_SIZE's value when unset, and the backend's name ("gloo", "nccl").
  std::optional<int> world_size{};
  std::string backend{};
  /// Python's record_shapes, profile_memory, with_stack, with_flops: each op's input shapes,
  /// the allocator's events, the C++ call stacks Kineto records, FLOP estimates.
  bool record_shapes = false;
  bool profile_memory = false;
  bool with_stack = false;
  bool with_flops = false;
  /// CUDA activities (kernels, memory copies) too, where LibTorch sees a CUDA device.
  bool cuda = true;
  /// Called after each window is recorded (and its trace written), with the profiler:
  /// key_averages(), table(), events() and last_trace() then describe that window.
  std::function<void(Profiler&)> on_trace_ready{};
};

/// One operator or scope of a window, as Kineto recorded it.
struct ProfilerEvent {
  std::string name;
  uint64_t thread = 0;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  c10::DeviceType device = c10::DeviceType::CPU;
  bool async = false;  // an event that does not nest in its thread's (Kineto's isAsync)
};

/// The events of one name over a window (Python's FunctionEventAvg): how many, their total
/// time, and their self time (their time less that of the events inside them on the same
/// thread), in microseconds.
struct KeyAverage {
  std::string key;
  int64_t count = 0;
  double cpu_time_total_us = 0;
  double self_cpu_time_total_us = 0;
  double cpu_time_avg_us() const { return count > 0 ? cpu_time_total_us / count : 0; }
};

/// torch.profiler.profile(schedule=..., on_trace_ready=...) on Kineto's C++ API. start()
/// begins step 0, step() ends the current step and begins the next, stop() ends the last;
/// each step is a "ProfilerStep#N" scope in the trace, as in Python. The schedule's actions
/// and their transitions are Python's: the Kineto session is prepared at a window's warm-up
/// and enabled at its first recorded step, disabled after its last, and nothing is recorded
/// outside it. Recording happens on the thread that calls start() and the threads LibTorch
/// hands its work to (the autograd engine's). One Profiler records at a time.
class Profiler {
 public:
  explicit Profiler(ProfilerOptions options = {});
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;
  /// Stops a profiler still running (its window is handed over if it was recording).
  ~Profiler();

  /// Begins step 0 (Python's start() or `with profile(...)`).
  void start();
  /// Ends the current step and begins the next (Python's step()).
  void step();
  /// Ends the current step; a window being recorded is handed over (Python's stop()).
  void stop();

  /// The step under way (from 0; in on_trace_ready, as in Python's, the step after the
  /// window).
  int64_t step_num() const;
  /// The current step's action.
  ProfilerAction current_action() const;

  /// The last window handed over: its events, each name's averages sorted by `sort_by`
  /// ("cpu_time_total", "self_cpu_time_total", "count", "cpu_time_avg"), and the table
  /// Python's key_averages().table(sort_by=..., row_limit=...) prints (Name, Self CPU %,
  /// Self CPU, CPU total %, CPU total, CPU time avg, # of Calls).
  const std::vector<ProfilerEvent>& events() const;
  std::vector<KeyAverage> key_averages(std::string_view sort_by = "cpu_time_total") const;
  std::string table(std::string_view sort_by = "cpu_time_total", int row_limit = 100) const;
  /// The last window's trace file (empty when ProfilerOptions::dir is), and every one so far.
  const std::filesystem::path& last_trace() const;
  const std::vector<std::filesystem::path>& traces() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// A scope named in the trace (Python's torch.profiler.record_function): from construction
/// to destruction. Costs a check of a thread-local flag when no profiler records.
///
///   { loom::RecordFunction scope("data"); batch = next(loader); }
class RecordFunction {
 public:
  explicit RecordFunction(std::string_view name) {
    if (guard_.isActive()) guard_.before(name);  // the name copied
  }
  RecordFunction(const RecordFunction&) = delete;
  RecordFunction& operator=(const RecordFunction&) = delete;

 private:
  at::RecordFunction guard_{at::RecordScope::USER_SCOPE};
};

}  // namespace loom
