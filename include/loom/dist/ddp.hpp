#pragma once
// loom::Ddp, data parallelism on torch.distributed's engine: a dist::ProcessGroup and c10d's
// Reducer over it. Declarations only: the definitions are the compiled library loom::dist
// (src/dist/), which links c10d from libtorch; include this header anywhere, link loom::dist
// where a Ddp is constructed.
#include <chrono>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <c10/util/intrusive_ptr.h>

#include <loom/concepts/strategy.hpp>
#include <loom/dist/process_group.hpp>
#include <loom/state_dict.hpp>
#include <loom/step_result.hpp>

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}
namespace c10d {
class CommHookInterface;
class ProcessGroup;
}  // namespace c10d

namespace loom::dist {

/// How the reducer reduces each bucket of gradients: Python DDP's communication hooks
/// (register_comm_hook, _register_builtin_comm_hook), registered by Ddp::setup before the
/// first forward.
///
///   hook              each bucket's gradients (fp32 here)            Python's counterpart
///   all_reduce()      divided by the world size while copied into    no hook (the default)
///                     the bucket, then a sum all-reduce
///   fp16_compress()   cast to fp16, divided by the world size (in    _register_builtin_comm_hook(
///                     fp16), all-reduced in fp16, copied back BuiltinCommHookType.FP16_COMPRESS)
///   bf16_compress()   the same in bf16: buffer.to(bf16).div_(world), register_comm_hook(None,
///                     sum all-reduce, copied back into the bucket     bf16_compress_hook)
///   user(name, make)  whatever the c10d::CommHookInterface that      register_comm_hook(state,
///   hook)
///                     `make` builds for the group does
///
/// The compressing hooks halve the bytes on the wire and round every gradient to 16 bits: the
/// division comes before the all-reduce (the sum of the ranks' shares cannot overflow where
/// each share does not), so the result is the rounded average, not the average rounded once.
class CommHook {
 public:
  /// Builds a user's hook for the run's process group. The hook derives from
  /// c10d::CppCommHookInterface<State> (torch/csrc/distributed/c10d/comm.hpp); its runHook
  /// gets each bucket (c10d::GradBucket) once per synchronized backward and returns a future
  /// whose value is the bucket's reduced gradients, the average over the ranks.
  using Factory = std::function<std::unique_ptr<c10d::CommHookInterface>(
      const c10::intrusive_ptr<c10d::ProcessGroup>& group)>;
  enum class Kind { AllReduce, Fp16Compress, Bf16Compress, User };

  /// The default: the reducer's own averaging all-reduce.
  CommHook() = default;
  static CommHook all_reduce() { return {}; }
  static CommHook fp16_compress() { return CommHook(Kind::Fp16Compress, "fp16_compress", {}); }
  static CommHook bf16_compress() { return CommHook(Kind::Bf16Compress, "bf16_compress", {}); }
  /// A user's hook, named for DDP's logging data and error messages; an empty `make` is a
  /// loom::Error.
  static CommHook user(std::string name, Factory make);
  /// A command line's choice: "none" (or "allreduce"), "fp16", "bf16"; anything else is a
  /// loom::Error listing these.
  static CommHook parse(std::string_view name);

  Kind kind() const { return kind_; }
  /// "allreduce", "fp16_compress", "bf16_compress" or the user's name.
  const std::string& name() const { return name_; }
  /// The user's factory (Kind::User); empty otherwise.
  const Factory& factory() const { return make_; }

 private:
  CommHook(Kind kind, std::string name, Factory make)
      : kind_(kind), name_(std::move(name)), make_(std::move(make)) {}

  Kind kind_ = Kind::AllReduce;
  std::string name_ = "allreduce";
  Factory make_;
};

/// Ddp's settings; the defaults are Python DistributedDataParallel's.
struct DdpOptions {
  /// One timeout for the rendezvous (the TCPStore) and for every collective of the group:
  /// a rank that died or hung makes the others fail after at most this long.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  /// Search the graph of each loss for parameters that get no gradient (a slower backward).
  bool find_unused_parameters = false;
  /// Python's static_graph=True: the set of parameters that get a gradient, and the order in
  /// which they do, is the same in every iteration. The reducer learns both in the first
  /// iteration (all-reduced once, after the whole backward pass) and then skips the search
  /// find_unused_parameters makes; parameters unused in every step are fine without it.
  bool static_graph = false;
  /// Gradients become views into the all-reduce buckets (saves a copy and memory).
  bool gradient_as_bucket_view = false;
  /// Bucket size in MiB after the first iteration; unset: 25 MiB, with a 1 MiB first bucket.
  std::optional<double> bucket_cap_mb;
  /// Broadcast rank 0's buffers (batch-norm statistics, ...) before every forward.
  bool broadcast_buffers = true;
  /// The backend, when not the device's ddp_backend(): "gloo" on a Cuda device, say.
  std::optional<std::string> backend;
  /// How each bucket is reduced (CommHook above); the reducer's all-reduce by default.
  CommHook comm_hook;
  /// Under torchrun's agent (Environment::under_agent), ask the kernel to kill this process
  /// (SIGKILL, prctl PR_SET_PDEATHSIG on Linux) when the agent dies, and leave at once if it
  /// already has: an orphaned worker would train on and overwrite the checkpoints that the
  /// next launch resumes from. Checked when the Ddp is built.
  bool exit_with_agent = true;
};

namespace detail {
struct DdpState;
}  // namespace detail

/// Restores gradient synchronization when it goes out of scope (Ddp::no_sync()).
class NoSyncGuard {
 public:
  explicit NoSyncGuard(detail::DdpState* state);
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;
  ~NoSyncGuard();

 private:
  detail::DdpState* state_;
  bool previous_;
};

/// Ddp::join's settings: Python's DistributedDataParallel.join(...).
struct JoinOptions {
  /// Divide the gradients by the world size the run started with (true, Python's default),
  /// or by the number of ranks that have not joined yet (every input weighs the same).
  bool divide_by_initial_world_size = true;
  /// A rank that runs out of inputs makes every rank throw loom::Error (at its next forward)
  /// instead of shadowing the others until they finish.
  bool throw_on_early_termination = false;
};

class Ddp;

/// The scope Ddp::join() returns: Python's `with ddp.join():`. Ranks with fewer batches than
/// others shadow the collectives of the others' forwards and backwards when they leave the
/// scope, until every rank has left it; then every rank holds the parameters (and buffers,
/// with broadcast_buffers) of the rank that joined last. A scope left by an exception does
/// not wait; a failed collective at its end throws loom::Error from the destructor.
class JoinGuard {
 public:
  explicit JoinGuard(Ddp* ddp);
  JoinGuard(const JoinGuard&) = delete;
  JoinGuard& operator=(const JoinGuard&) = delete;
  ~JoinGuard() noexcept(false);

 private:
  Ddp* ddp_;
  int exceptions_;
};

/// "ddp": Python's DistributedDataParallel, driving the same engine from C++.
///
/// The process group (dist::ProcessGroup) comes from the environment torchrun sets (RANK,
/// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT): a TCPStore with Python's key prefixes, then
/// gloo for a CPU device or NCCL for a CUDA one (its current device set first). setup() checks that
/// every rank's parameters have the same shapes, broadcasts rank 0's parameters and buffers, and
/// builds a c10d::Reducer (with its c10d::Logger) over the parameters that require a
/// gradient: one bucket in the first iteration, then 1 MiB and 25 MiB buckets in the order
/// gradients became ready, all-reduced while the backward pass runs. When Runtime::backward
/// returns, every rank holds the gradients averaged over the ranks.
///
/// A collective that fails (a rank died, hung past the timeout, or left early) throws
/// loom::Error naming the rank, the world size, the timeout and what to check; the process
/// group is then abandoned, not waited for, so the process can leave with an error code.
/// One module per Ddp. Move-only. The ranks, the collectives and rt.save's rank-0 write are
/// the group's (dist::GroupDefaults).
///
///   loom::Runtime<loom::Cpu, loom::Fp32, loom::Ddp> rt;
///   rt.setup(model, optimizer);           // rank 0's weights on every rank
///   rt.backward(loss, model);             // gradients averaged when this returns
class Ddp : public GroupDefaults<Ddp> {
 public:
  static constexpr std::string_view strategy() { return "ddp"; }

  /// Reads and validates the environment; connects nothing yet (setup() does).
  Ddp();
  explicit Ddp(DdpOptions options);
  /// For a strategy built on a Ddp (loom::Zero): errors start with `name`; without the
  /// reducer (`reducer` false) setup connects, checks and broadcasts the module only, and
  /// backward runs the step alone (the strategy reduces the gradients itself).
  Ddp(DdpOptions options, std::string name, bool reducer);
  Ddp(Ddp&&) noexcept;
  Ddp& operator=(Ddp&&) noexcept;
  ~Ddp();

  /// Connects the process group for `backend` ("gloo", "nccl") on `device`, checks and
  /// broadcasts `module`'s parameters and buffers from rank 0, builds the reducer.
  void setup(torch::nn::Module& module, c10::Device device, std::string_view backend);
  /// The reducer's per-forward work: prepare_for_forward, rebuild_buckets, buffer broadcast.
  void pre_forward();
  /// prepare_for_backward, then `step` (the precision's backward, during which the reducer
  /// all-reduces the buckets); a failed collective becomes loom::Error.
  template <class Step>
  void backward(const at::Tensor& loss, Step&& step) {
    prepare_backward(loss);
    try {
      std::forward<Step>(step)();
    } catch (...) {
      fail("the gradient all-reduce in backward", std::current_exception());
    }
  }
  /// Gradient accumulation: forwards and backwards within the guard's scope do not
  /// synchronize; the first backward after it does, over the accumulated gradients.
  [[nodiscard]] NoSyncGuard no_sync();
  /// Uneven inputs (Python's DDP join()): every forward inside the scope tells the others that
  /// this rank still has inputs; a rank leaving the scope shadows the others' all-reduces (its
  /// gradients count as zero) until all have left. Collectives the loop makes besides DDP's
  /// own (a metric's all_reduce, fp8-mixed's amax reduction) are not shadowed: keep them out
  /// of the scope. Valid after setup(); one join at a time.
  [[nodiscard]] JoinGuard join(JoinOptions options = {});

  const DdpOptions& options() const;
  /// The process group: the environment, the backend and the collectives.
  ProcessGroup& process_group() { return group_; }
  const ProcessGroup& process_group() const { return group_; }

  /// The precision's step, as on one process: every rank holds the averaged gradients and
  /// steps every parameter. A step after backward passes that all ran under no_sync (the
  /// gradients never reduced: the ranks would drift apart) is a loom::Error.
  template <class Unscale, class Step>
  auto optimizer_step(Optimizers, Unscale&&, Step&& step) {
    check_step_synchronized();
    return std::forward<Step>(step)();
  }
  /// Before an optimizer step: a loom::Error when backward passes ran since the last step
  /// and none of them reduced the gradients (each under no_sync); then counts anew.
  void check_step_synchronized();
  /// Whether a backward now reduces the gradients (no no_sync() guard lives).
  bool synchronizing() const;
  /// For a strategy that reduces the gradients itself: a backward ran (`synced`: it reduced
  /// them), for check_step_synchronized.
  void record_backward(bool synced);

  /// {"bucket_order": the reducer's buckets, each a list of parameter indices} once the
  /// reducer is built (else empty): the layout its all-reduces sum in, which the reducer
  /// rebuilds after its first step. On 3 ranks and more a sum's rounding depends on an
  /// element's place in its bucket, so a resumed run must reduce in the saved layout to stay
  /// bitwise.
  StateDict state_dict() const;
  /// Takes state_dict()'s layout (applied now, or when setup builds the reducer); an empty
  /// state is fine. Another key, or a layout that is not one of this model's parameters each
  /// once, is a loom::Error.
  void load_state_dict(const StateDict& state);
  /// A barrier, then the process group shuts down (no "connection closed by peer" on the
  /// others) and the reducer goes; called by Runtime::teardown, and by the destructor if not
  /// called before.
  void teardown();

 private:
  friend class JoinGuard;
  void prepare_backward(const at::Tensor& loss);
  /// JoinGuard's end: the shadowing loop, then the last joiner's state on every rank.
  void finish_join();
  void join_main_hook();
  [[noreturn]] void fail(std::string_view what, std::exception_ptr error);

  ProcessGroup group_;  // first: it outlives the reducer, which holds its c10d group
  std::unique_ptr<detail::DdpState> state_;
};

}  // namespace loom::dist

namespace loom {
using dist::CommHook;
using dist::Ddp;
using dist::DdpOptions;
using dist::JoinOptions;
}  // namespace loom
