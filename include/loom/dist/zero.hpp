#pragma once
// loom::Zero, ZeRO sharding on torch.distributed's engine: loom::Ddp with each rank owning a
// shard of the parameters, stepping only its shard's optimizer state (stage 1) and keeping only
// its shard's averaged gradients (stage 2). Declarations and the template hooks; the rest is
// the compiled library loom::dist (src/dist/zero.cpp), as for loom::Ddp.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include <loom/checkpoint/checkpoint_io.hpp>
#include <loom/concepts/strategy.hpp>
#include <loom/dist/ddp.hpp>
#include <loom/state_dict.hpp>
#include <loom/step_result.hpp>

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace loom::dist {

/// How rt.save writes Zero's optimizer state (ZeroOptions::checkpoint).
enum class ZeroCheckpoint {
  /// Every rank's shard gathered on rank 0, which writes one file in Python's
  /// `optimizer.state_dict()` layout (stock torch.load and load_state_dict take it).
  Consolidated,
  /// Each rank writes its own shard: rank 0 the main file (everything but the other ranks'
  /// optimizer states, plus an index), every other rank one file beside it
  /// (checkpoint/shards.hpp). No rank ever holds more than its shard; a run with the same
  /// partition reads back its own file only.
  Sharded,
};

/// Which collective sums stage 2's gradient buckets (ZeroOptions::gradient_collective).
enum class ZeroCollective {
  /// `reduce` to the bucket's owner on NCCL; `all_reduce` on gloo, whose reduce is slower than
  /// its all-reduce (docs/memory.md has the figures).
  Automatic,
  /// ProcessGroup::reduce to the owner: the least traffic.
  Reduce,
  /// ProcessGroup::allreduce, then the ranks that do not own the bucket drop it.
  AllReduce,
};

/// Zero's settings.
struct ZeroOptions {
  /// 1: each rank keeps the optimizer state of its shard only (Python's
  /// ZeroRedundancyOptimizer); gradients are all-reduced as by Ddp. 2: also the gradients:
  /// after each synchronized backward every bucket of a shard's gradients is summed on the
  /// shard's owner (gradient_collective), and the other ranks drop theirs.
  int stage = 1;
  /// The process group, timeouts and (stage 1) the reducer's settings: Ddp's.
  DdpOptions ddp;
  /// The size of stage 2's gradient buckets (each reduced as soon as its gradients are in,
  /// while the backward goes on: smaller buckets start sooner) and of the parameter broadcast's
  /// coalesced buckets after each step (parameters of an eighth of it or more go alone).
  std::size_t bucket_bytes = std::size_t{4} << 20;
  /// One consolidated file (the default) or one file per rank.
  ZeroCheckpoint checkpoint = ZeroCheckpoint::Consolidated;
  /// Stage 2: how each bucket of gradients is summed on its owner.
  ZeroCollective gradient_collective = ZeroCollective::Automatic;
};

/// Bytes one rank holds, by kind (Zero::memory()).
struct ShardMemory {
  std::int64_t parameters = 0;       ///< every parameter of the module (each rank has all)
  std::int64_t gradients = 0;        ///< the defined .grad tensors on this rank
  std::int64_t optimizer_state = 0;  ///< the optimizer state tensors this rank holds
};

namespace detail {
struct ZeroState;
}

/// "zero": ZeRO stage 1 or 2 over c10d, the torchrun environment and process group of
/// loom::Ddp.
///
/// The partition is Python ZeroRedundancyOptimizer's: the module's parameters that require a
/// gradient, largest first (a stable sort by element count), each to the rank with the fewest
/// elements so far (the lowest such rank). It decides who computes each update, never its
/// value: every parameter's update is its own, so the trained weights are those of Ddp.
///
/// Runtime::optimizer_step: `unscale` first on every parameter (16-mixed: the inf check covers
/// every gradient), then each optimizer's param groups are cut to this rank's shard for the
/// precision's step (loom's fused kernels run on the shard only; optimizer state is created for
/// the shard only), restored, and each rank broadcasts its shard's updated parameters.
/// Stage 2 sums each bucket of a shard's gradients on its owner (a reduce; on gloo an
/// all-reduce, ZeroCollective) from hooks on the gradient accumulators, while the backward
/// runs (buckets launched in one order on every rank), and
/// drops the gradients of other ranks' shards when the backward is done; so that every rank's
/// 16-mixed scaler skips together, a non-finite gradient in any shard makes the first element
/// of every shard's first gradient nan too (one one-element all-reduce per step), and
/// clip_gradients computes each shard's norm and all-reduces it (the global norm up to
/// rounding, not bit for bit that of one process).
///
/// rt.save consolidates by default: each rank's optimizer state (its shard's parameters) goes
/// to rank 0, which writes the optimizer entries in Python's `optimizer.state_dict()` layout,
/// whole. With ZeroCheckpoint::Sharded each rank writes its shard to a file of its own beside
/// rank 0's main file. rt.load reads either form on every rank (of a sharded one, only its own
/// shard when the partition is the one that saved); each rank drops the state of other shards
/// at its next step, so a checkpoint from any world size (or from Ddp, or one process) resumes
/// at any other.
///
///   loom::Runtime<loom::Cpu, loom::Fp32, loom::Zero> rt(loom::Cpu(), loom::Fp32(),
///                                                      loom::Zero({.stage = 2}));
class Zero : public GroupDefaults<Zero> {
 public:
  static constexpr std::string_view strategy() { return "zero"; }

  /// Reads and validates the environment (Ddp's); stage must be 1 or 2.
  Zero();
  explicit Zero(ZeroOptions options);
  Zero(Zero&&) noexcept;
  Zero& operator=(Zero&&) noexcept;
  ~Zero();

  /// Ddp's setup (stage 2 without the reducer), then the partition of `module`'s parameters.
  void setup(torch::nn::Module& module, c10::Device device, std::string_view backend);
  void pre_forward();
  /// Stage 1: Ddp's backward. Stage 2: `step`, then (unless a no_sync guard lives) each
  /// shard's gradients, divided by the world size, summed on its owner; others are dropped.
  template <class Step>
  void backward(const at::Tensor& loss, Step&& step) {
    if (stage() == 1) {
      ddp_.backward(loss, std::forward<Step>(step));
      return;
    }
    try {
      std::forward<Step>(step)();
    } catch (...) {
      fail("backward", std::current_exception());
    }
    reduce_gradients();
  }
  [[nodiscard]] NoSyncGuard no_sync() { return ddp_.no_sync(); }
  /// The Ddp's process group: the ranks and the collectives (dist::GroupDefaults).
  ProcessGroup& process_group() { return ddp_.process_group(); }
  const ProcessGroup& process_group() const { return ddp_.process_group(); }

  /// `unscale`, then `step` on this rank's shard, then every shard's parameters broadcast from
  /// its owner.
  template <class Unscale, class Step>
  auto optimizer_step(Optimizers optimizers, Unscale&& unscale, Step&& step) {
    before_step(optimizers);
    std::forward<Unscale>(unscale)();
    Narrowed narrowed(*this, optimizers);
    auto result = std::forward<Step>(step)();
    narrowed.restore();
    broadcast_parameters();
    return result;
  }
  /// Stage 1: the precision's clip (every rank holds every averaged gradient). Stage 2: the
  /// shard's norm, all-reduced into the global one, then the shard's gradients scaled.
  template <class Clip>
  GradNorm clip_gradients(torch::optim::Optimizer& optimizer, double max_norm, double norm_type,
                          Clip&& clip) {
    if (stage() == 1 || world_size() == 1) return std::forward<Clip>(clip)(max_norm);
    const GradNorm local = std::forward<Clip>(clip)(std::numeric_limits<double>::infinity());
    return clip_shard(optimizer, max_norm, norm_type, local);
  }

  int stage() const { return options_.stage; }
  const ZeroOptions& options() const { return options_; }
  /// The Ddp underneath: its options and (stage 1) its reducer.
  Ddp& ddp() { return ddp_; }

  /// Which rank owns each of the module's parameters that require a gradient, in the
  /// module's order (empty before setup).
  const std::vector<int>& owners() const;
  /// Python's partition of parameters of these sizes over `world` ranks: the owner of each.
  static std::vector<int> partition(const std::vector<std::int64_t>& numels, int world);
  /// What this rank holds now: the module's parameters, its gradients, `optimizer`'s state.
  ShardMemory memory(const torch::optim::Optimizer& optimizer) const;

  /// rt.save: the optimizer entries (kind() EntryKind::Optimizer) hold this rank's shard;
  /// consolidated, every rank's states gathered on rank 0, which writes; sharded, each rank
  /// writes its own (rank 0 the main file with the index, last).
  void save_checkpoint(const std::filesystem::path& path, const State& state,
                       const checkpoint::CheckpointIO& io);
  /// rt.load: every rank reads the main file and the shard files it needs (all of them, or
  /// its own when the partition is the saving run's); a failure on any rank is a loom::Error
  /// on every rank. Other shards' state goes at the next step.
  c10::IValue load_checkpoint(const std::filesystem::path& path, const State& state,
                              const checkpoint::CheckpointIO& io, c10::Device device);

  /// Stage 1: the reducer's bucket layout (Ddp::state_dict); stage 2: empty.
  StateDict state_dict() const { return ddp_.state_dict(); }
  void load_state_dict(const StateDict& state) { ddp_.load_state_dict(state); }
  void teardown() { ddp_.teardown(); }

 private:
  /// Cuts each optimizer's param groups to this rank's shard; restore() (or the destructor,
  /// when the step threw) puts the whole groups back.
  class Narrowed {
   public:
    Narrowed(Zero& zero, Optimizers optimizers);
    Narrowed(const Narrowed&) = delete;
    Narrowed& operator=(const Narrowed&) = delete;
    ~Narrowed();
    void restore();

   private:
    Optimizers optimizers_;
    std::vector<std::vector<at::Tensor>> saved_;
    bool restored_ = false;
  };

  void before_step(Optimizers optimizers);
  void reduce_gradients();
  void broadcast_parameters();
  GradNorm clip_shard(torch::optim::Optimizer& optimizer, double max_norm, double norm_type,
                      const GradNorm& local);
  [[noreturn]] void fail(std::string_view what, std::exception_ptr error);

  ZeroOptions options_;
  Ddp ddp_;
  std::unique_ptr<detail::ZeroState> state_;
};

}  // namespace loom::dist

namespace loom {
using dist::ShardMemory;
using dist::Zero;
using dist::ZeroCheckpoint;
using dist::ZeroCollective;
using dist::ZeroOptions;
}  // namespace loom
