#pragma once
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include <loom/checkpoint/checkpoint_io.hpp>
#include <loom/checkpoint/shards.hpp>
#include <loom/concepts/strategy.hpp>
#include <loom/detail/refuse_state.hpp>
#include <loom/error.hpp>
#include <loom/guards.hpp>
#include <loom/state_dict.hpp>
#include <loom/step_result.hpp>

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace loom::dist {

/// The one-process behaviour of every StrategyPolicy member except the name. Empty and
/// non-virtual: every hook is an empty inline function, so a Runtime on these defaults
/// compiles to the same code as a Runtime without a strategy.
///
/// Self is the policy deriving from it (CRTP):
///   struct Local : loom::dist::Defaults<Local> {
///     static constexpr std::string_view strategy() { return "local"; }
///   };
template <class Self>
struct Defaults {
  /// Names this base for loom::is_default (is_default.hpp).
  using defaults_type = Defaults;

  void setup(torch::nn::Module&, c10::Device, std::string_view) {}
  void pre_forward() {}
  /// Runs the precision's backward; a distributed strategy reduces gradients around it.
  template <class Step>
  void backward(const at::Tensor&, Step&& step) {
    step();
  }
  /// Gradient accumulation: within the guard's scope backward does not synchronize.
  NullGuard no_sync() { return {}; }
  /// Uneven inputs: one process never waits for another.
  NullGuard join() { return {}; }

  int rank() const { return 0; }
  int world_size() const { return 1; }
  int local_rank() const { return 0; }
  /// The machine's index among the run's machines (torchrun's GROUP_RANK); one process: 0.
  int node_rank() const { return 0; }
  bool is_global_zero() const { return static_cast<const Self&>(*this).rank() == 0; }

  void barrier() {}
  /// A barrier whose failure names it (logs, errors); one process: nothing.
  void barrier(std::string_view) {}
  /// One process: `t` already is the sum, mean, max and min over all processes.
  void all_reduce(at::Tensor&, ReduceOp) {}
  void broadcast(at::Tensor&, int src) { broadcast_source(src); }
  std::vector<at::Tensor> all_gather(const at::Tensor& t) { return {t.clone()}; }
  /// Rank `src`'s string or StateDict on every rank (Python's broadcast_object_list); one
  /// process: `value` itself.
  std::string broadcast_object(const std::string& value, int src) {
    broadcast_source(src);
    return value;
  }
  StateDict broadcast_object(const StateDict& value, int src) {
    broadcast_source(src);
    return value;
  }
  /// A step every process takes (a write, a read): `failure` is this process's reason (empty:
  /// it did not fail). Every process throws the same loom::Error, "WHAT failed on rank R:
  /// REASON" for the lowest rank R that failed, or none does. One process: its own failure.
  void agree(const std::string& failure, const std::string& what) {
    if (!failure.empty()) throw Error(what + " failed on rank 0: " + failure);
  }

  /// Runs `step`, the precision's optimizer step of `optimizers`, and returns what it returns.
  /// A strategy that changes what an optimizer sees (loom::Zero: each rank steps its shard)
  /// first calls `unscale`, the precision's unscale_gradients for each optimizer (16-mixed: the
  /// inf check then covers every gradient), and gathers the updated parameters afterwards.
  template <class Unscale, class Step>
  auto optimizer_step(Optimizers, Unscale&&, Step&& step) {
    return std::forward<Step>(step)();
  }
  /// Runs `clip(max_norm)`, the precision's clip of the optimizer's gradients (unscaled first),
  /// which returns the total norm before clipping. A strategy whose ranks hold different
  /// gradients (loom::Zero stage 2: each its shard's) makes the norm the one over all ranks.
  template <class Clip>
  GradNorm clip_gradients(torch::optim::Optimizer&, double max_norm, double, Clip&& clip) {
    return std::forward<Clip>(clip)(max_norm);
  }

  /// rt.save: saves `state`'s entries (state::save_entries, on every rank) and writes the value
  /// through `io`. One process: it writes. A distributed strategy decides which ranks write
  /// (Ddp: rank 0) and how a failed write reaches every rank (Ddp: a loom::Error on all of
  /// them); a sharded one picks entries by their kind() (Zero: the optimizers) and may write
  /// each rank's part.
  void save_checkpoint(const std::filesystem::path& path, const State& state,
                       const checkpoint::CheckpointIO& io) {
    io.save(path, c10::IValue(state::save_entries(state)));
  }
  /// rt.load: reads the value `state`'s entries then load from (rt.load does) through `io`,
  /// tensors on `device`: every process reads the whole file, and a sharded checkpoint's
  /// other files (checkpoint/shards.hpp). A strategy that holds entries in its own layout
  /// (sharded modules) finds them by kind() in `state`.
  c10::IValue load_checkpoint(const std::filesystem::path& path, const State& state,
                              const checkpoint::CheckpointIO& io, c10::Device device) {
    (void)state;
    return checkpoint::merge_shards(path, io.load(path, device), io, device);
  }

  StateDict state_dict() const { return {}; }
  void load_state_dict(const StateDict& state) {
    loom::detail::refuse_state(Self::strategy(), "strategy", state);
  }
  void teardown() {}

 private:
  void broadcast_source(int src) const {
    if (src != 0) {
      throw Error("loom: broadcast from rank " + std::to_string(src) + " in a run of " +
                  std::to_string(static_cast<const Self&>(*this).world_size()) + " process");
    }
  }
};

}  // namespace loom::dist
