#pragma once
#include <loom/concepts/checkpointable.hpp>
#include <loom/detail/strategy_rows.hpp>

namespace loom::dist {

/// The reductions StrategyPolicy::all_reduce offers; Mean is Sum divided by the world size.
enum class ReduceOp : int { Sum, Mean, Max, Min };

}  // namespace loom::dist

namespace loom {

/// What `Runtime`'s Strategy argument must provide: how the processes of a run cooperate.
///
///   s: S&  cs: const S&  m: torch::nn::Module&  dev: torch::Device  backend: std::string_view
///   loss, t: torch::Tensor  step: a callable running the precision's backward  op: ReduceOp
///   path: const std::filesystem::path&  v: const c10::IValue&  io: const CheckpointIO&
///
///   expression               returns                   dist::Defaults<S> does (one process)
///   S::strategy()            std::string_view, const   (none) "single_device", "ddp"
///   s.setup(m, dev, backend) void                      nothing
///   s.pre_forward()          void                      nothing
///   s.backward(loss, step)   void                      step()
///   s.no_sync()              ScopeGuard                NullGuard
///   cs.rank()                int                       0
///   cs.world_size()          int                       1
///   cs.local_rank()          int                       0
///   cs.is_global_zero()      bool                      rank() == 0
///   s.barrier()              void                      nothing
///   s.all_reduce(t, op)      void (t in place)         nothing (one process: t is the result)
///   s.broadcast(t, src)      void (t in place)         nothing; src must be 0
///   s.all_gather(t)          std::vector<Tensor>       {t.clone()}
///   + node_rank, barrier(name), broadcast_object, agree: the Collectives rows (below)
///   s.optimizer_step(os, unscale, step)  step()'s      step()
///   s.clip_gradients(o, max, type, clip)  GradNorm     clip(max)
///   s.save_checkpoint(path, v, io)  void               io.save(path, v): it writes
///   s.load_checkpoint(path, io, dev)  c10::IValue      io.load(path, dev): it reads
///   + Checkpointable<S>: state_dict {}, load_state_dict (non-empty: loom::Error), teardown
///
/// When Runtime calls them (the step table of runtime.hpp): setup after the device has moved
/// the module (`dev` is the device's device(), `backend` its ddp_backend()); pre_forward at
/// the start of every forward; save_checkpoint in rt.save (who writes: Ddp's rank 0, a failure
/// reaching every rank), load_checkpoint in rt.load; backward around the precision's backward, so
/// that gradients are reduced when Runtime::backward returns, before unscale, clip or step;
/// teardown between the precision's and the device's. Minimal complete definition, on
/// dist::Defaults<S>: `S::strategy()`. Laws: every rank calls the collectives in the same order;
/// after backward every rank holds the same gradients unless a no_sync() guard is alive. Models:
/// dist::SingleProcess, dist::Ddp, dist::Zero. Page: docs/concepts/strategy.md
template <class S>
concept StrategyPolicy =
    true LOOM_DETAIL_STRATEGY_ROWS(LOOM_DETAIL_ROW_AND, S) && Checkpointable<S>;

/// The part of StrategyPolicy that the library calls outside the runtime's hooks: ranks and
/// collectives (dist/collectives.hpp, dist/rank_zero.hpp, DistributedSampler, Checkpoints,
/// state/). Every row has a default on dist::Defaults (one process) and dist::GroupDefaults
/// (a dist::ProcessGroup's).
///
///   cs.node_rank()                      int           0 (torchrun's GROUP_RANK)
///   s.barrier(name)                     void          nothing (a failure names the barrier)
///   s.broadcast_object(text|dict, src)  std::string | StateDict: the value (src must be 0)
///   s.agree(failure, what)              void          throws "WHAT failed on rank 0: FAILURE"
///                                                     when `failure` is not empty
///   + rank, world_size, local_rank, is_global_zero, barrier, all_reduce, broadcast,
///     all_gather, as in the table above
template <class S>
concept Collectives = true LOOM_DETAIL_COLLECTIVES_ROWS(LOOM_DETAIL_ROW_AND, S);

}  // namespace loom
