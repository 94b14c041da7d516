#pragma once
// loom::dist::ProcessGroup: the one owner of a run's rendezvous store and c10d process group,
// and of the collectives on it with their timeout and failure wording (Ddp's reducer and its
// setup checks run c10d's own on the same group). loom::Ddp and loom::Zero hold one; a
// strategy of a user's holds one too and derives from dist::GroupDefaults (below) for its
// ranks and collectives. Declarations only: the definitions are the compiled library
// loom::dist (src/dist/process_group.cpp, rendezvous.cpp), so c10d stays out of the
// translation units that include this header.
#include <chrono>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include <loom/checkpoint/checkpoint_io.hpp>
#include <loom/concepts/strategy.hpp>
#include <loom/dist/defaults.hpp>
#include <loom/error.hpp>
#include <loom/state_dict.hpp>

namespace loom::dist {

/// Where this process sits in the run: what torchrun (or a hand launch) put in the
/// environment, validated. Read by ProcessGroup's constructor; read_environment() is the same
/// check.
struct Environment {
  int rank = 0;             ///< RANK, default 0
  int world_size = 1;       ///< WORLD_SIZE, default 1
  int local_rank = 0;       ///< LOCAL_RANK, default 0
  int node_rank = 0;        ///< GROUP_RANK (torchrun's index of this machine), default 0
  std::string master_addr;  ///< MASTER_ADDR, required when world_size > 1
  int master_port = 0;      ///< MASTER_PORT, required when world_size > 1
  /// TORCHELASTIC_USE_AGENT_STORE is "True": the launcher hosts the store, every rank is a
  /// client (rank 0 included).
  bool agent_store = false;
  /// Started by torchrun's elastic agent: TORCHELASTIC_RUN_ID is set.
  bool under_agent = false;
  /// TORCHELASTIC_RESTART_COUNT: how many times the agent has restarted the workers (0 in
  /// the first attempt). The agent's store outlives the workers, so under it each attempt's
  /// keys live under the prefix "/worker/attempt_<count>": a restarted worker never reads
  /// the address that a worker of the attempt before it left there.
  int restart_count = 0;
  /// TORCHELASTIC_MAX_RESTARTS: torchrun's --max-restarts (0 when not under an agent).
  int max_restarts = 0;
  /// None of RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT is set: one process, a
  /// store in memory, no sockets for the rendezvous.
  bool single_process = true;
};

/// The environment, read strictly: a malformed number, RANK >= WORLD_SIZE or a missing
/// MASTER_ADDR/MASTER_PORT with WORLD_SIZE > 1 throws loom::Error naming the variable.
Environment read_environment();

/// A ProcessGroup's settings (DdpOptions carries the same three for loom::Ddp).
struct GroupOptions {
  /// One timeout for the rendezvous (the TCPStore) and for every collective of the group:
  /// a rank that died or hung makes the others fail after at most this long.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  /// The backend, when not the one connect() is given: "gloo" on a Cuda device, say.
  std::optional<std::string> backend;
  /// Under torchrun's agent, ask the kernel to kill this process when the agent dies, and
  /// leave at once if it already has (DdpOptions::exit_with_agent).
  bool exit_with_agent = true;
};

namespace detail {
struct GroupState;  // src/dist/process_group.hpp: the store, the c10d group, the device
}

/// The processes of a run and the collectives between them, on torch.distributed's engine.
///
/// Built from the environment torchrun sets (read_environment); connect() then makes a
/// TCPStore with Python's key prefixes (rank 0 hosts it, or torchrun's agent does) and a c10d
/// process group on it: gloo, or NCCL with its current device set first. Without torchrun's
/// variables the run is one process and the collectives do nothing (a broadcast from another
/// rank than 0 is an error, as for one process).
///
/// A collective that fails (a rank died, hung past the timeout, or left early) throws
/// loom::CollectiveError naming the collective, this rank, the world size, the timeout and the
/// ranks that did not answer a roll call through the store; the group is then abandoned, not
/// waited for, so the process can leave with an error code. teardown() (or the destructor)
/// waits for every rank at a barrier, then shuts the group down. Move-only.
///
///   loom::dist::ProcessGroup group("my_strategy");
///   group.connect(device, "gloo");
///   group.all_reduce(t, loom::dist::ReduceOp::Sum);
class ProcessGroup {
 public:
  /// Reads and validates the environment; connects nothing yet. `name` starts every error
  /// message ("loom::Ddp", or a user strategy's name). A non-positive timeout is a loom::Error.
  explicit ProcessGroup(std::string name = "loom::dist::ProcessGroup", GroupOptions options = {});
  ProcessGroup(ProcessGroup&&) noexcept;
  ProcessGroup& operator=(ProcessGroup&&) noexcept;
  ~ProcessGroup();

  /// Connects the store and the group for GroupOptions::backend, else `backend` ("gloo",
  /// "nccl"), on `device` (where loom's own collectives run), and writes this rank's address
  /// to the store for the roll call. One process: records the backend and the device only.
  /// A second connect, or one after a failure, is a loom::Error.
  void connect(c10::Device device, std::string_view backend);
  /// Whether connect() made a group (false before it, in one process, and after teardown).
  bool connected() const;
  /// Whether a collective failed (the group is gone).
  bool failed() const;

  int rank() const;
  int world_size() const;
  int local_rank() const;
  /// This machine's index among the run's machines: torchrun's GROUP_RANK (--node-rank).
  int node_rank() const;
  const Environment& environment() const;
  const GroupOptions& options() const;
  /// The name errors start with.
  const std::string& name() const;
  /// The backend connect() chose ("gloo", "nccl"); empty before it.
  std::string_view backend() const;
  /// connect()'s device (the CPU before it).
  c10::Device device() const;

  /// Collectives over every rank, in place; valid after connect().
  void barrier();
  /// A barrier whose failure names it: "the barrier \"name\"".
  void barrier(std::string_view name);
  void all_reduce(at::Tensor& t, ReduceOp op);
  void broadcast(at::Tensor& t, int src);
  std::vector<at::Tensor> all_gather(const at::Tensor& t);
  /// Every rank's `input` into `output`, rank after rank (c10d's all_gather_single, Python's
  /// all_gather_into_tensor): `output` holds world_size() times `input`'s elements; both
  /// contiguous and of one dtype.
  void all_gather_into(at::Tensor& output, const at::Tensor& input);
  /// `input` (world_size() equal parts, rank after rank) reduced with `op` over the ranks,
  /// this rank's part into `output` (c10d's reduce_scatter_single, Python's
  /// reduce_scatter_tensor); Mean is the sum divided by world_size(), as gloo's AVG.
  void reduce_scatter(at::Tensor& output, at::Tensor& input, ReduceOp op);
  /// Rank `src`'s value on every rank (Python's broadcast_object_list): pickled as torch.save
  /// pickles (torch::pickle_save), its size and then its bytes broadcast on the group's
  /// device; what the other ranks pass is ignored.
  c10::IValue broadcast_object(const c10::IValue& value, int src);
  std::string broadcast_object(const std::string& value, int src);
  StateDict broadcast_object(const StateDict& value, int src);
  /// A step every rank takes (a write, a read): `failure` is this rank's reason (empty: it did
  /// not fail). When some rank failed, every rank throws loom::Error "WHAT failed on rank R:
  /// REASON" for the lowest such rank R; one all-reduce of one element when none did.
  void agree(const std::string& failure, const std::string& what);

  /// Writes `value` to `path` through `io` on rank 0 (one process: itself); every rank returns
  /// once it is written, and a failed write is a loom::Error on every rank (rank 0's message
  /// there, elsewhere one naming the file). A run of several processes must be connected.
  void save_on_rank_zero(const std::filesystem::path& path, const c10::IValue& value,
                         const checkpoint::CheckpointIO& io);

  /// What a strategy does with an exception from a collective it ran on the group: a misuse
  /// becomes loom::Error with a hint; a failed collective abandons the group, holds the roll
  /// call and throws loom::CollectiveError naming `what`.
  [[noreturn]] void fail(std::string_view what, std::exception_ptr error);
  /// loom::Error naming `what` before connect() (in a run of several processes);
  /// loom::CollectiveError after a failed collective.
  void require_connected(std::string_view what) const;

  /// A barrier, then the group shuts down (no "connection closed by peer" on the others);
  /// nothing after a failure or a teardown.
  void teardown();

  /// The store, the c10d group and the device, for the loom::dist library's strategies
  /// (src/dist/group_state.hpp): an incomplete type elsewhere.
  detail::GroupState& state() { return *state_; }
  const detail::GroupState& state() const { return *state_; }

 private:
  void barrier_named(std::string_view what);

  std::unique_ptr<detail::GroupState> state_;
};

/// dist::Defaults for a strategy over a ProcessGroup: the ranks and every collective are the
/// group's, rank 0 writes a checkpoint and every rank learns whether it did. Self provides
/// `ProcessGroup& process_group()` (and its const form); setup connects the group, teardown
/// tears it down.
///
///   struct Echo : loom::dist::GroupDefaults<Echo> {
///     static constexpr std::string_view strategy() { return "echo"; }
///     loom::dist::ProcessGroup group{"Echo"};
///     loom::dist::ProcessGroup& process_group() { return group; }
///     const loom::dist::ProcessGroup& process_group() const { return group; }
///   };
template <class Self>
struct GroupDefaults : Defaults<Self> {
  /// Names this base for loom::is_default (is_default.hpp).
  using defaults_type = GroupDefaults;

  /// Connects the group; a strategy that also wraps the module declares its own.
  void setup(torch::nn::Module&, c10::Device device, std::string_view backend) {
    group().connect(device, backend);
  }

  /// Uneven inputs need a strategy's own support (Ddp::join shadows its reducer's
  /// collectives): across processes, Defaults' join (a no-op) would leave ranks waiting.
  void join() = delete;

  int rank() const { return group().rank(); }
  int world_size() const { return group().world_size(); }
  int local_rank() const { return group().local_rank(); }
  int node_rank() const { return group().node_rank(); }
  const Environment& environment() const { return group().environment(); }
  /// The backend the group connected ("gloo", "nccl"); empty before setup.
  std::string_view backend() const { return group().backend(); }

  void barrier() { group().barrier(); }
  void barrier(std::string_view name) { group().barrier(name); }
  void all_reduce(at::Tensor& t, ReduceOp op) { group().all_reduce(t, op); }
  void broadcast(at::Tensor& t, int src) { group().broadcast(t, src); }
  std::vector<at::Tensor> all_gather(const at::Tensor& t) { return group().all_gather(t); }
  std::string broadcast_object(const std::string& value, int src) {
    return group().broadcast_object(value, src);
  }
  StateDict broadcast_object(const StateDict& value, int src) {
    return group().broadcast_object(value, src);
  }
  void agree(const std::string& failure, const std::string& what) { group().agree(failure, what); }

  /// rt.save: every rank saves `state`'s entries, rank 0 writes them through `io`
  /// (ProcessGroup::save_on_rank_zero). Reading (rt.load) is Defaults': every rank reads the
  /// whole file.
  void save_checkpoint(const std::filesystem::path& path, const State& state,
                       const checkpoint::CheckpointIO& io) {
    group().save_on_rank_zero(path, c10::IValue(state::save_entries(state)), io);
  }

  void teardown() { group().teardown(); }

 private:
  ProcessGroup& group() { return static_cast<Self&>(*this).process_group(); }
  const ProcessGroup& group() const { return static_cast<const Self&>(*this).process_group(); }
};

}  // namespace loom::dist
