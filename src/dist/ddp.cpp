// loom::Ddp on c10d: the store, the process group, the Reducer and its Logger, driven in the
// order Python's torch.nn.parallel.DistributedDataParallel drives them.
#include <loom/dist/ddp.hpp>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#ifdef __linux__
#include <sys/prctl.h>
#include <unistd.h>
#endif

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/generated/variable_factories.h>
#include <torch/csrc/distributed/c10d/debug.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/nn/module.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/default_comm_hooks.hpp>
#include <torch/csrc/distributed/c10d/logger.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include <loom/checkpoint/shards.hpp>
#include <loom/detail/agree_on_failure.hpp>
#include <loom/detail/env.hpp>
#include <loom/detail/message_of.hpp>
#include <loom/detail/refuse_state.hpp>
#include <loom/error.hpp>

#include "backends.hpp"
#include "ddp_state.hpp"
#include "roll_call.hpp"

namespace loom::dist {
namespace {

constexpr std::string_view who = "loom::Ddp";
// Python's DistributedDataParallel's broadcast_bucket_size; the reducer's bucket sizes are
// c10d's own (c10d::kDefaultFirstBucketBytes, c10d::kDefaultBucketBytesCap in reducer.hpp).
constexpr std::size_t broadcast_bucket_bytes = 250u << 20;

const char* env(const char* name) { return std::getenv(name); }

std::string seconds(std::chrono::milliseconds t) {
  auto ms = t.count();
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + " s";
  return std::to_string(ms) + " ms";
}

/// Whether `error` came from communication (a peer, the network, a timeout), not from a misuse
/// the reducer diagnosed: gloo throws gloo::IoException (a std::runtime_error, not c10::Error).
bool is_communication_error(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::DistError&) {
    return true;
  } catch (const c10::Error&) {
    return false;
  } catch (const loom::Error&) {
    return false;
  } catch (...) {
    return true;
  }
}

/// Whether each backward searches the loss's graph for unused parameters: Python's
/// find_unused_parameters and not static_graph (a static graph learns them once).
bool searches_unused(const DdpOptions& o) { return o.find_unused_parameters && !o.static_graph; }

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::Max:
      return c10d::ReduceOp(c10d::ReduceOp::MAX);
    case ReduceOp::Min:
      return c10d::ReduceOp(c10d::ReduceOp::MIN);
    case ReduceOp::Sum:
    case ReduceOp::Mean:
      break;
  }
  return c10d::ReduceOp(c10d::ReduceOp::SUM);
}

/// Python's bf16_compress_hook (torch.distributed.algorithms.ddp_comm_hooks.default_hooks):
/// the bucket cast to bf16 and divided by the world size there, a sum all-reduce in bf16, the
/// result copied back into the bucket. c10d has no builtin bf16 hook.
class Bf16CompressHook final
    : public c10d::CppCommHookInterface<c10::intrusive_ptr<c10d::ProcessGroup>> {
 public:
  explicit Bf16CompressHook(const c10::intrusive_ptr<c10d::ProcessGroup>& group)
      : CppCommHookInterface(group) {}

  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    at::Tensor buffer = bucket.getBufferRef();
    std::vector<at::Tensor> compressed{buffer.to(at::kBFloat16).div_(state_->getSize())};
    auto reduced = state_->allreduce(compressed)->getFuture();
    return reduced->then(
        [buffer](c10::ivalue::Future& done) {
          buffer.copy_(done.value().toTensorVector()[0]);
          return c10::IValue(buffer);
        },
        reduced->elementType());
  }
};

}  // namespace

CommHook CommHook::user(std::string name, Factory make) {
  if (!make) throw Error("loom::CommHook::user(\"" + name + "\"): the factory is empty");
  return CommHook(Kind::User, std::move(name), std::move(make));
}

CommHook CommHook::parse(std::string_view name) {
  if (name == "none" || name == "allreduce") return all_reduce();
  if (name == "fp16") return fp16_compress();
  if (name == "bf16") return bf16_compress();
  throw Error("loom::CommHook: unknown communication hook \"" + std::string(name) +
              "\"; choose none, fp16 or bf16");
}

namespace {

/// Under torchrun's agent: the kernel kills this process when its parent (the agent, which
/// started it) dies. A parent that died between getppid() and prctl() changed getppid()
/// (this process went to init or a subreaper): then it leaves now. One that died earlier
/// took its store with it, and connecting fails within DdpOptions::timeout.
void die_with_parent() {
#ifdef __linux__
  const pid_t parent = getppid();
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) {
    throw Error(std::string("loom::Ddp: prctl(PR_SET_PDEATHSIG) failed: ") + std::strerror(errno));
  }
  if (getppid() != parent) {
    throw Error(
        "loom::Ddp: torchrun's agent, which started this worker, has exited (TORCHELASTIC_RUN_ID "
        "is set but the parent process is gone); leaving without training");
  }
#endif
}

}  // namespace

Environment read_environment() {
  Environment e;
  const char* rank = env("RANK");
  const char* world = env("WORLD_SIZE");
  const char* local = env("LOCAL_RANK");
  const char* addr = env("MASTER_ADDR");
  const char* port = env("MASTER_PORT");
  e.single_process = !rank && !world && !local && !addr && !port;
  e.world_size = loom::detail::parse_env_index(world, who, "WORLD_SIZE", INT_MAX).value_or(1);
  if (e.world_size < 1) {
    throw Error("loom::Ddp: WORLD_SIZE is \"0\"; a run has at least one process");
  }
  e.rank = loom::detail::parse_env_index(rank, who, "RANK", INT_MAX).value_or(0);
  if (e.rank >= e.world_size) {
    throw Error("loom::Ddp: RANK is " + std::to_string(e.rank) + " but WORLD_SIZE is " +
                std::to_string(e.world_size) + "; RANK must be from 0 to WORLD_SIZE - 1");
  }
  e.local_rank = loom::detail::parse_env_index(local, who, "LOCAL_RANK", INT_MAX).value_or(0);
  e.node_rank =
      loom::detail::parse_env_index(env("GROUP_RANK"), who, "GROUP_RANK", INT_MAX).value_or(0);
  if (addr) e.master_addr = addr;
  if (port) e.master_port = loom::detail::parse_env_index(port, who, "MASTER_PORT", 65535).value();
  if (e.world_size > 1 && (!addr || e.master_addr.empty() || !port)) {
    throw Error("loom::Ddp: WORLD_SIZE is " + std::to_string(e.world_size) + " but " +
                std::string(!addr || e.master_addr.empty() ? "MASTER_ADDR" : "MASTER_PORT") +
                " is not set; start the processes with torchrun, or set MASTER_ADDR and "
                "MASTER_PORT to rank 0's address and a free port on every rank");
  }
  const char* agent = env("TORCHELASTIC_USE_AGENT_STORE");
  e.agent_store = agent && std::string_view(agent) == "True";
  e.under_agent = env("TORCHELASTIC_RUN_ID") != nullptr;
  e.restart_count = loom::detail::parse_env_index(env("TORCHELASTIC_RESTART_COUNT"), who,
                                                  "TORCHELASTIC_RESTART_COUNT", INT_MAX)
                        .value_or(0);
  e.max_restarts = loom::detail::parse_env_index(env("TORCHELASTIC_MAX_RESTARTS"), who,
                                                 "TORCHELASTIC_MAX_RESTARTS", INT_MAX)
                       .value_or(0);
  return e;
}

NoSyncGuard::NoSyncGuard(detail::DdpState* state)
    : state_(state), previous_(state ? state->sync : true) {
  if (state_) state_->sync = false;
}
NoSyncGuard::~NoSyncGuard() {
  if (state_) state_->sync = previous_;
}

Ddp::Ddp() : Ddp(DdpOptions{}) {}

Ddp::Ddp(DdpOptions options) : state_(std::make_unique<detail::DdpState>()) {
  if (options.timeout.count() <= 0) {
    throw Error("loom::Ddp: DdpOptions::timeout must be positive");
  }
  if (options.bucket_cap_mb && !(*options.bucket_cap_mb > 0)) {
    throw Error("loom::Ddp: DdpOptions::bucket_cap_mb must be positive");
  }
  state_->options = std::move(options);
  state_->env = read_environment();
  if (state_->options.exit_with_agent && state_->env.under_agent) die_with_parent();
}

Ddp::Ddp(Ddp&&) noexcept = default;
Ddp& Ddp::operator=(Ddp&&) noexcept = default;

Ddp::~Ddp() {
  if (!state_) return;
  // Leaving by an exception: the other ranks may be inside another collective, so a barrier
  // could only wait for the timeout.
  if (state_->failed || std::uncaught_exceptions() > 0) {
    state_->abandon();
    return;
  }
  if (state_->group && !state_->torn_down) {
    try {
      teardown();
    } catch (...) {
      state_->abandon();
      return;
    }
  }
  state_->release();
}

int Ddp::rank() const { return state_->env.rank; }
int Ddp::world_size() const { return state_->env.world_size; }
int Ddp::local_rank() const { return state_->env.local_rank; }
int Ddp::node_rank() const { return state_->env.node_rank; }
const Environment& Ddp::environment() const { return state_->env; }
const DdpOptions& Ddp::options() const { return state_->options; }
std::string_view Ddp::backend() const { return state_->backend; }

namespace {

/// What Ddp::fail does, for setup's phases below (file-local, so they take the state): a
/// misuse the reducer diagnosed becomes loom::Error with a hint; a failed collective abandons
/// the group first and names what to check.
[[noreturn]] void throw_failure(detail::DdpState& s, std::string_view what,
                                std::exception_ptr error) {
  const std::string text = loom::detail::message_of(error);
  try {
    std::rethrow_exception(error);
  } catch (const CollectiveError&) {
    throw;  // already said
  } catch (...) {
  }
  // c10d's ProcessGroupWrapper (TORCH_DISTRIBUTED_DEBUG=DETAIL) compares each collective's
  // fingerprint across the ranks before running it: a mismatch is the ranks' misuse, found
  // on every rank, and the group cannot go on.
  if (text.find("Detected mismatch between collectives") != std::string::npos) {
    s.failed = true;
    s.abandon();
    throw CollectiveError(s.name + ": " + std::string(what) + " on rank " +
                          std::to_string(s.env.rank) + " of " + std::to_string(s.env.world_size) +
                          ": the ranks called different collectives (TORCH_DISTRIBUTED_DEBUG="
                          "DETAIL compared them): " +
                          text);
  }
  // The wrapper's monitored barrier failing (a rank that never came) is a communication error.
  const bool wrapper = text.find("ProcessGroupWrapper") != std::string::npos;
  if (!wrapper && !is_communication_error(error)) {
    std::string hint;
    if (text.find("Expected to have finished reduction") != std::string::npos) {
      hint =
          " (a parameter got no gradient: set loom::DdpOptions::find_unused_parameters, or "
          "make every parameter take part in the loss)";
    }
    throw Error(s.name + ": " + std::string(what) + " on rank " + std::to_string(s.env.rank) +
                " of " + std::to_string(s.env.world_size) + ": " + text + hint);
  }
  s.failed = true;
  s.abandon();
  // Which peers are gone, as the store sees them (gloo's timeouts name none).
  std::string peers;
  if (s.store && !s.env.master_addr.empty()) {
    peers = " " + detail::roll_call(s.store, s.env.rank, s.env.world_size,
                                    s.env.master_addr + ":" + std::to_string(s.env.master_port));
  }
  throw CollectiveError(
      s.name + ": " + std::string(what) + " failed on rank " + std::to_string(s.env.rank) + " of " +
      std::to_string(s.env.world_size) + " processes (timeout " + seconds(s.options.timeout) +
      "): " + text + "." + peers +
      " Another rank has died, hung for longer than the timeout or stopped calling "
      "collectives: check the other ranks' output (torchrun names the rank that failed "
      "first), that every rank runs the same number of steps (a DistributedSampler "
      "gives each the same count), and loom::DdpOptions::timeout (TORCH_DISTRIBUTED_DEBUG="
      "DETAIL makes ranks that call different collectives fail at once, naming both)");
}

// Ddp::setup's phases, in the order setup calls them.

/// Refuses a second setup and a failed group, then records the backend (DdpOptions::backend,
/// else the device's) and the device, refusing a backend loom cannot connect.
void choose_backend(detail::DdpState& s, c10::Device device, std::string_view backend) {
  if (s.module) {
    throw Error(s.name +
                ": setup() was called a second time; one Ddp wraps one module "
                "(use one runtime per model)");
  }
  if (s.failed) throw CollectiveError(s.name + ": a collective failed earlier; the group is gone");
  s.backend = s.options.backend ? *s.options.backend : std::string(backend);
  s.device_type = device.type();
  s.device = device;
  if (s.backend != "gloo" && s.backend != "nccl") {
    throw Error(s.name + ": the backend \"" + s.backend +
                "\" is not available; loom::Ddp runs on \"gloo\" (CPU, CUDA) and \"nccl\" (CUDA)");
  }
  if (s.backend == "nccl" && device.type() != c10::kCUDA) {
    throw Error(s.name + ": the nccl backend needs a CUDA device, not " + device.str());
  }
}

/// The parameters the reducer reduces, with their names by index.
struct ReducedParameters {
  std::vector<at::Tensor> params;
  std::unordered_map<std::size_t, std::string> names;
};

/// Those that require a gradient, each once, in Python's order (modules in pre-order, each
/// module's own parameters); none is an error.
ReducedParameters collect_reduced_parameters(torch::nn::Module& module,
                                             const std::string& strategy) {
  ReducedParameters r;
  std::unordered_set<const void*> seen;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const at::Tensor& p = item.value();
    if (!p.requires_grad() || !seen.insert(p.unsafeGetTensorImpl()).second) continue;
    r.names.emplace(r.params.size(), item.key());
    r.params.push_back(p);
  }
  if (r.params.empty()) {
    throw Error(strategy +
                ": the module has no parameter that requires a gradient; data "
                "parallelism has nothing to synchronize");
  }
  return r;
}

/// A write to a socket whose peer died raises SIGPIPE, whose default action ends the process
/// before gloo can report the dead rank. Python ignores SIGPIPE at start-up, so Python DDP sees
/// an error instead; a process that left SIGPIPE at its default gets the same. A handler the
/// program installed is kept.
void ignore_default_sigpipe() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    std::signal(SIGPIPE, SIG_IGN);
  }
}

/// The rendezvous store: in memory without MASTER_ADDR, else a TCPStore that rank 0 hosts
/// (unless the launcher's agent does); a failure names the address and what to check.
///
/// One timeout bounds connecting as it bounds every later wait. The server waits for the
/// other ranks for `timeout`. A client's TCPStore tries to connect (and validate) until a
/// deadline of its options' timeout, but each try may itself last that long, and c10d then
/// sleeps about a second (jittered back-off) before the last: with `timeout` itself, a lone
/// rank or a wrong MASTER_PORT failed only after twice the timeout and more. A client is
/// therefore built with half the timeout (two tries and the pause fit in the timeout plus
/// about two seconds), and its store is given the whole timeout for the waits that follow.
c10::intrusive_ptr<c10d::Store> connect_store(const detail::DdpState& s) {
  const auto timeout = s.options.timeout;
  const std::string where = s.env.master_addr + ":" + std::to_string(s.env.master_port);
  try {
    if (s.env.master_addr.empty()) return c10::make_intrusive<c10d::HashStore>();
    c10d::TCPStoreOptions o;
    o.port = static_cast<std::uint16_t>(s.env.master_port);
    o.isServer = s.env.rank == 0 && !s.env.agent_store;
    o.numWorkers = static_cast<std::size_t>(s.env.world_size);
    o.waitWorkers = true;
    o.timeout = o.isServer ? timeout : std::max(timeout / 2, std::chrono::milliseconds(1));
    o.multiTenant = true;
    auto store = c10::make_intrusive<c10d::TCPStore>(s.env.master_addr, o);
    store->setTimeout(timeout);
    // The agent's store outlives the workers: each attempt (TORCHELASTIC_RESTART_COUNT) keeps
    // its keys under a prefix of its own, so restarted workers never meet the last attempt's.
    if (s.env.agent_store) {
      return c10::make_intrusive<c10d::PrefixStore>(
          "/worker/attempt_" + std::to_string(s.env.restart_count), store);
    }
    return store;
  } catch (...) {
    std::string text = loom::detail::message_of(std::current_exception());
    while (!text.empty() && (text.back() == '.' || text.back() == '\n')) text.pop_back();
    const bool server = s.env.rank == 0 && !s.env.agent_store;
    throw Error(s.name + ": rank " + std::to_string(s.env.rank) + " of " +
                std::to_string(s.env.world_size) +
                (server ? " could not host the rendezvous store on "
                        : " could not join the "
                          "rendezvous store at ") +
                where + " within " + seconds(timeout) + ": " + text +
                (server ? ". Is MASTER_PORT in use by another process, or did every rank start?"
                        : ". Check MASTER_ADDR and MASTER_PORT, and that rank 0 is running"));
  }
}

/// The process group on `store`, with Python's prefixes: default_pg, then the group's name
/// "0", then the device type for the backend.
void connect_process_group(detail::DdpState& s, const c10::intrusive_ptr<c10d::Store>& store,
                           c10::Device device) {
  const auto timeout = s.options.timeout;
  try {
    auto group_store = c10::make_intrusive<c10d::PrefixStore>(
        "0/", c10::make_intrusive<c10d::PrefixStore>("default_pg", store));
    s.group = c10::make_intrusive<c10d::ProcessGroup>(group_store, s.env.rank, s.env.world_size);
    using Type = c10d::ProcessGroup::BackendType;
    // Python's switch, read as torch.distributed reads it at import.
    c10d::setDebugLevelFromEnvironment();
    const bool compare_collectives = c10d::debug_level() == c10d::DebugLevel::Detail;
    auto checked = [&](c10::intrusive_ptr<c10d::Backend> b, const std::string& prefix) {
      if (!compare_collectives) return b;
      return detail::wrap_for_debug(
          b, c10::make_intrusive<c10d::PrefixStore>(prefix + "wrapper/", group_store), s.env.rank,
          s.env.world_size, timeout);
    };
    if (s.backend == "gloo") {
      const std::string prefix = device.is_cuda() ? "cuda/" : "cpu/";
      auto b =
          checked(detail::make_gloo(c10::make_intrusive<c10d::PrefixStore>(prefix, group_store),
                                    s.env.rank, s.env.world_size, timeout),
                  prefix);
      s.group->setDefaultBackend(Type::GLOO);
      s.group->setBackend(c10::kCPU, Type::GLOO, b);
      if (device.is_cuda()) s.group->setBackend(c10::kCUDA, Type::GLOO, b);
    } else {
      s.group->setBoundDeviceId(device);
      auto b =
          checked(detail::make_nccl(c10::make_intrusive<c10d::PrefixStore>("cuda/", group_store),
                                    s.env.rank, s.env.world_size, timeout, device),
                  "cuda/");
      s.group->setDefaultBackend(Type::NCCL);
      s.group->setBackend(c10::kCUDA, Type::NCCL, b);
    }
    s.group->setGroupName("0");
  } catch (const loom::Error&) {
    throw;
  } catch (...) {
    throw_failure(s, "connecting the " + s.backend + " process group", std::current_exception());
  }
}

/// Python's constructor: the same parameter shapes on every rank. c10d's check fails only on
/// the ranks that differ from rank 0, leaving rank 0 waiting; a fingerprint gathered first
/// makes every rank fail.
void check_same_parameters_on_every_rank(detail::DdpState& s,
                                         const std::vector<at::Tensor>& params) {
  std::string shapes;
  std::uint64_t hash = 1469598103934665603ull;  // FNV-1a over every size, with separators
  for (const auto& p : params) {
    shapes += (shapes.empty() ? "" : " ") + c10::str(p.sizes());
    for (auto d : p.sizes()) hash = (hash ^ static_cast<std::uint64_t>(d)) * 1099511628211ull;
    hash = (hash ^ 0xffu) * 1099511628211ull;
  }
  std::vector<at::Tensor> prints;
  try {
    auto mine = torch::tensor(
        {static_cast<std::int64_t>(params.size()), static_cast<std::int64_t>(hash >> 1)},
        torch::kLong);
    std::vector<std::vector<at::Tensor>> all(1);
    for (int i = 0; i < s.env.world_size; ++i) all[0].push_back(at::empty_like(mine));
    std::vector<at::Tensor> in{mine};
    s.group->allgather(all, in)->wait();
    prints = all[0];
  } catch (...) {
    throw_failure(s, "comparing the ranks' parameters", std::current_exception());
  }
  for (int r = 0; r < s.env.world_size; ++r) {
    if (!torch::equal(prints[static_cast<std::size_t>(r)], prints[0])) {
      throw Error(s.name + ": the ranks' models differ: rank " + std::to_string(r) + "'s " +
                  std::to_string(prints[static_cast<std::size_t>(r)][0].item<std::int64_t>()) +
                  " parameters do not have rank 0's shapes (every rank must build the same "
                  "model); this rank's (" +
                  std::to_string(s.env.rank) + ") shapes: " + shapes);
    }
  }
  try {
    c10d::verify_params_across_processes(s.group, params, std::nullopt);
  } catch (...) {
    auto error = std::current_exception();
    if (is_communication_error(error)) {
      throw_failure(s, "checking the parameters across ranks", error);
    }
    throw Error(s.name +
                ": the ranks' models differ (their parameters must have the same "
                "count, shapes and strides on every rank): " +
                loom::detail::message_of(error));
  }
}

/// Rank `src`'s parameters (all of them, as Python) and, with DdpOptions::broadcast_buffers,
/// its buffers, on every rank.
void broadcast_module_state(detail::DdpState& s, torch::nn::Module& module, int src) {
  try {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> states;
    for (const auto& p : module.parameters(true)) states.push_back(p.detach());
    if (s.options.broadcast_buffers) {
      for (const auto& b : module.buffers(true)) states.push_back(b.detach());
    }
    c10d::broadcast_coalesced(s.group, states, broadcast_bucket_bytes, src);
  } catch (...) {
    throw_failure(s, "broadcasting rank " + std::to_string(src) + "'s parameters and buffers",
                  std::current_exception());
  }
}

/// DdpOptions::comm_hook on the reducer, named in the logger as Python names it.
void register_comm_hook(detail::DdpState& s) {
  const CommHook& hook = s.options.comm_hook;
  switch (hook.kind()) {
    case CommHook::Kind::AllReduce:
      return;
    case CommHook::Kind::Fp16Compress:
      s.logger->set_comm_hook("BuiltinCommHookType.FP16_COMPRESS");
      s.reducer->register_builtin_comm_hook(c10d::BuiltinCommHookType::FP16_COMPRESS);
      return;
    case CommHook::Kind::Bf16Compress:
      s.logger->set_comm_hook("bf16_compress_hook");
      s.reducer->register_comm_hook(std::make_unique<Bf16CompressHook>(s.group));
      return;
    case CommHook::Kind::User: {
      auto made = hook.factory()(s.group);
      if (!made) {
        throw Error(s.name + ": the communication hook \"" + hook.name() +
                    "\"'s factory returned no hook");
      }
      s.logger->set_comm_hook(hook.name());
      s.reducer->register_comm_hook(std::move(made));
      return;
    }
  }
}

/// Refuses a saved bucket layout that is not `count` parameters each once.
void check_bucket_order(const detail::DdpState& s,
                        const std::vector<std::vector<std::size_t>>& buckets, std::size_t count) {
  std::vector<bool> seen(count, false);
  std::size_t total = 0;
  for (const auto& bucket : buckets) {
    for (std::size_t i : bucket) {
      if (i >= count || seen[i]) {
        throw Error(s.name + "::load_state_dict: the checkpoint's bucket_order names parameter " +
                    std::to_string(i) + (i >= count ? " of " : " twice among ") +
                    std::to_string(count) +
                    " (it was saved for another model; every rank must build the same one)");
      }
      seen[i] = true;
      ++total;
    }
  }
  if (total != count) {
    throw Error(s.name + "::load_state_dict: the checkpoint's bucket_order holds " +
                std::to_string(total) + " parameters, this model's reducer " +
                std::to_string(count) + " (it was saved for another model)");
  }
}

/// The reducer, as Python builds it: one bucket for the first iteration unless unused
/// parameters are searched for (without a static graph), then rebuilt in gradient-ready
/// order; its Logger with it; a static graph set on both (Python's _set_static_graph).
void build_reducer(detail::DdpState& s, ReducedParameters reduced) {
  const std::int64_t cap =
      s.options.bucket_cap_mb
          ? static_cast<std::int64_t>(*s.options.bucket_cap_mb * static_cast<double>(1 << 20))
          : std::int64_t{c10d::kDefaultBucketBytesCap};
  const std::int64_t first_cap =
      s.options.bucket_cap_mb ? cap : std::int64_t{c10d::kDefaultFirstBucketBytes};
  std::vector<std::size_t> limits =
      searches_unused(s.options) ? std::vector<std::size_t>{static_cast<std::size_t>(first_cap),
                                                            static_cast<std::size_t>(cap)}
                                 : std::vector<std::size_t>{static_cast<std::size_t>(
                                       std::numeric_limits<std::int64_t>::max())};
  std::vector<bool> sparse(reduced.params.size(), false);
  auto buckets =
      std::get<0>(c10d::compute_bucket_assignment_by_size(reduced.params, limits, sparse));
  std::reverse(buckets.begin(), buckets.end());
  s.reduced_params = reduced.params;
  s.reducer = std::make_shared<c10d::Reducer>(
      reduced.params, std::move(buckets), s.group, std::move(sparse), cap,
      s.options.find_unused_parameters, s.options.gradient_as_bucket_view, std::move(reduced.names),
      first_cap,
      /*skip_all_reduce_unused_params=*/false, /*use_python_reducer=*/false,
      std::vector<std::int64_t>{});
  // Always a logger: the reducer dereferences it when the set of unused parameters changes.
  s.logger = std::make_shared<c10d::Logger>(s.reducer);
  s.reducer->set_logger(s.logger);
  if (s.options.static_graph) {
    s.reducer->set_static_graph();
    s.logger->set_static_graph();
  }
  register_comm_hook(s);
  if (!s.loaded_buckets.empty()) {
    check_bucket_order(s, s.loaded_buckets, s.reduced_params.size());
    s.reducer->initialize_buckets(std::exchange(s.loaded_buckets, {}));
  }
}

}  // namespace

void Ddp::fail(std::string_view what, std::exception_ptr error) {
  throw_failure(*state_, what, error);
}

void Ddp::setup(torch::nn::Module& module, c10::Device device, std::string_view backend) {
  auto& s = *state_;
  choose_backend(s, device, backend);
  ReducedParameters reduced = collect_reduced_parameters(module, s.name);
  s.module = &module;
  if (s.env.single_process) return;  // one process: nothing to connect or reduce
  ignore_default_sigpipe();
  s.store = connect_store(s);
  connect_process_group(s, s.store, device);
  try {
    detail::announce_host(*s.store, s.env.rank, s.env.master_addr);
  } catch (...) {
    throw_failure(s, "writing this rank's address to the store", std::current_exception());
  }
  check_same_parameters_on_every_rank(s, reduced.params);
  broadcast_module_state(s, module, 0);
  if (s.reduce_gradients) build_reducer(s, std::move(reduced));
}

namespace {

/// A one-element tensor on the group's device.
at::Tensor flag(const detail::DdpState& s, double value, at::ScalarType dtype = at::kFloat) {
  return at::full({1}, value, at::TensorOptions().dtype(dtype).device(s.device));
}

/// A sum all-reduce of `t`, waited for unless `wait` is false (then c10d keeps the work).
void sum_all_reduce(detail::DdpState& s, at::Tensor& t, bool wait = true) {
  std::vector<at::Tensor> tensors{t};
  auto work = s.group->allreduce(tensors);
  if (wait) work->wait();
}

/// Python's _find_common_rank: the largest rank for which `candidate` holds.
int find_common_rank(detail::DdpState& s, bool candidate) {
  at::Tensor rank = flag(s, candidate ? s.env.rank : -1, at::kLong);
  std::vector<at::Tensor> tensors{rank};
  c10d::AllreduceOptions o;
  o.reduceOp = c10d::ReduceOp(c10d::ReduceOp::MAX);
  s.group->allreduce(tensors, o)->wait();
  const auto r = rank.cpu().item<std::int64_t>();
  if (r < 0) throw Error("loom::Ddp::join: no rank qualified to hold the authoritative copy");
  return static_cast<int>(r);
}

/// The module's buffers, detached, broadcast from `src` (Python's _sync_module_buffers).
void broadcast_buffers_from(detail::DdpState& s, int src) {
  auto buffers = s.module->buffers(true);
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> detached;
  for (auto& b : buffers) detached.push_back(b.detach());
  c10d::broadcast_coalesced(s.group, detached, broadcast_bucket_bytes, src);
}

/// Python's _check_sync_bufs_pre_fwd.
bool syncs_buffers_before_forward(const detail::DdpState& s) {
  return s.options.broadcast_buffers && s.forward_param_sync && !s.module->buffers(true).empty();
}

}  // namespace

void Ddp::pre_forward() {
  auto& s = *state_;
  if (!s.module) {
    throw Error(s.name +
                ": forward before setup; call rt.setup(model) first (it connects the "
                "process group and broadcasts rank 0's weights)");
  }
  if (s.torn_down) throw Error(s.name + ": forward after teardown(); the group is shut down");
  if (!s.reducer) return;
  bool others_joined = false;
  try {
    // Python's DistributedDataParallel._pre_forward, in its order.
    if (at::GradMode::is_enabled() && s.sync) s.reducer->prepare_for_forward();
    if (s.joining) {
      // Join.notify_join_context: this rank has not joined (the joined ones add zeros).
      std::vector<at::Tensor> ones{flag(s, 1)};
      s.reducer->set_forward_pass_work_handle(s.group->allreduce(ones),
                                              s.join_options.divide_by_initial_world_size);
      if (s.join_options.throw_on_early_termination) {
        at::Tensor joined = flag(s, 0);
        sum_all_reduce(s, joined);
        others_joined = joined.cpu().item<float>() != 0;
      }
    }
    if (!others_joined) {
      if (at::GradMode::is_enabled()) s.reducer->rebuild_buckets();  // once, in iteration 2
      if (syncs_buffers_before_forward(s)) {
        // Under join, rank 0 may have joined with stale buffers: the largest rank still in.
        broadcast_buffers_from(s, s.joining ? find_common_rank(s, true) : 0);
      }
      if (s.joining) {
        // Tells the joined ranks whether this iteration's backward synchronizes.
        at::Tensor sync = flag(s, s.sync ? 1 : 0);
        sum_all_reduce(s, sync, /*wait=*/false);
      }
    }
  } catch (...) {
    fail("the reducer's work before forward", std::current_exception());
  }
  if (others_joined) {
    throw Error(s.name + "::join: rank " + std::to_string(s.env.rank) +
                " found that another rank has run out of inputs "
                "(JoinOptions::throw_on_early_termination)");
  }
}

JoinGuard::JoinGuard(Ddp* ddp) : ddp_(ddp), exceptions_(std::uncaught_exceptions()) {}

JoinGuard::~JoinGuard() noexcept(false) {
  if (!ddp_) return;
  auto& s = *ddp_->state_;
  if (std::uncaught_exceptions() != exceptions_ || s.failed) {
    s.joining = false;
    return;
  }
  ddp_->finish_join();
}

JoinGuard Ddp::join(JoinOptions options) {
  auto& s = *state_;
  if (!s.module) {
    throw Error(s.name + "::join: call rt.setup(model) first; join needs the reducer it builds");
  }
  if (s.joining) throw Error(s.name + "::join: already inside a join scope");
  if (!s.reducer) return JoinGuard(nullptr);  // one process: nobody to wait for
  s.joining = true;
  s.join_options = options;
  s.logger->set_uneven_input_join();
  return JoinGuard(this);
}

void Ddp::join_main_hook() {
  auto& s = *state_;
  s.reducer->rebuild_buckets();
  if (syncs_buffers_before_forward(s)) broadcast_buffers_from(s, find_common_rank(s, false));
  at::Tensor sync = flag(s, 0);
  sum_all_reduce(s, sync);
  const bool should_sync = sync.cpu().item<float>() != 0;
  s.forward_param_sync = should_sync;
  if (!should_sync) return;
  // One all-reduce per bucket, of zeros, in the reducer's bucket order and through its hook.
  auto buckets = s.reducer->get_grad_buckets(/*return_zero_tensors=*/true);
  std::vector<c10::intrusive_ptr<c10::ivalue::Future>> pending;
  for (auto& bucket : buckets) pending.push_back(s.reducer->run_comm_hook(bucket));
  for (auto& f : pending) {
    f->wait();
    if (f->hasError()) f->value();  // rethrows the hook's error
  }
  if (s.options.find_unused_parameters) {
    std::vector<at::Tensor> used{s.reducer->get_local_used_map_on_device()};
    s.group->allreduce(used)->wait();
  }
  s.reducer->push_rebuilt_params_for_all_indices();
}

void Ddp::finish_join() {
  auto& s = *state_;
  try {
    bool last = true;
    for (;;) {
      // Python's Join.__exit__: shadow the notification all-reduce of the ranks still in.
      at::Tensor still_in = flag(s, 0);
      sum_all_reduce(s, still_in);
      if (still_in.cpu().item<float>() == 0) break;
      if (s.join_options.throw_on_early_termination) {
        at::Tensor ones = flag(s, 1);
        sum_all_reduce(s, ones);
        s.joining = false;
        throw Error(s.name + "::join: rank " + std::to_string(s.env.rank) +
                    " has run out of inputs before the others "
                    "(JoinOptions::throw_on_early_termination)");
      }
      join_main_hook();
      last = false;
    }
    // The post-hook: the parameters (and buffers) of the rank that joined last, everywhere.
    broadcast_module_state(s, *s.module, find_common_rank(s, last));
  } catch (const Error&) {
    s.joining = false;
    throw;
  } catch (...) {
    s.joining = false;
    fail("joining the ranks with uneven inputs", std::current_exception());
  }
  s.joining = false;
}

void Ddp::prepare_backward(const at::Tensor& loss) {
  auto& s = *state_;
  if (!s.reducer || !at::GradMode::is_enabled()) return;
  detail::record_backward(s, s.sync);
  if (!s.sync) {
    s.forward_param_sync = false;
    return;
  }
  s.forward_param_sync = true;
  try {
    s.reducer->prepare_for_backward(searches_unused(s.options) ? std::vector<at::Tensor>{loss}
                                                               : std::vector<at::Tensor>{});
    // A static graph's first backward: the reducer only records which gradients arrive, and
    // all-reduces every bucket once the whole pass is done (Python's _DDPSink queues the same
    // callback from the backward of the forward's outputs; here from the loss's gradient).
    if (s.options.static_graph && !s.delay_all_reduce_queued && loss.requires_grad()) {
      detail::DdpState* state = &s;
      loss.register_hook([state](const at::Tensor&) {
        if (state->delay_all_reduce_queued || !state->reducer) return;
        state->delay_all_reduce_queued = true;
        std::weak_ptr<c10d::Reducer> reducer = state->reducer;
        torch::autograd::Engine::get_default_engine().queue_callback([reducer] {
          if (auto r = reducer.lock()) r->delay_all_reduce();
        });
      });
    }
  } catch (...) {
    fail("preparing the backward pass", std::current_exception());
  }
}

NoSyncGuard Ddp::no_sync() { return NoSyncGuard(state_.get()); }

void Ddp::check_step_synchronized() { detail::check_step_synchronized(*state_); }

void detail::check_step_synchronized(DdpState& s) {
  const int backwards = std::exchange(s.backwards_since_step, 0);
  const bool synced = std::exchange(s.synced_since_step, false);
  if (!s.group || s.env.world_size <= 1 || backwards == 0 || synced) return;
  throw Error(s.name + "::optimizer_step: none of the " + std::to_string(backwards) +
              " backward pass(es) since the last step reduced the gradients (each ran under "
              "rt.no_backward_sync), so every rank would step on its own gradients and the "
              "replicas would drift apart. Let the last micro-batch's backward run outside "
              "the scope: rt.no_backward_sync(model, /*enabled=*/i + 1 < micro_batches)");
}

namespace {
void require_group(const detail::DdpState& s, std::string_view what) {
  if (!s.group && !s.env.single_process) {
    throw Error(s.name + "::" + std::string(what) +
                ": call rt.setup(model) first; it connects the process group for the device's "
                "backend");
  }
  if (s.failed) throw CollectiveError(s.name + ": a collective failed earlier; the group is gone");
}
}  // namespace

void Ddp::barrier() { barrier_named("a barrier"); }

void Ddp::barrier(std::string_view name) {
  barrier_named("the barrier \"" + std::string(name) + "\"");
}

void Ddp::barrier_named(std::string_view what) {
  auto& s = *state_;
  require_group(s, "barrier");
  if (!s.group) return;
  try {
    c10d::BarrierOptions o;
    if (s.device_type == c10::kCUDA && s.backend == "nccl") {
      o.device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(s.env.local_rank));
    }
    s.group->barrier(o)->wait();
  } catch (...) {
    fail(what, std::current_exception());
  }
}

void Ddp::all_reduce(at::Tensor& t, ReduceOp op) {
  auto& s = *state_;
  require_group(s, "all_reduce");
  if (op == ReduceOp::Mean && !at::isFloatingType(t.scalar_type())) {
    throw Error(s.name + "::all_reduce: ReduceOp::Mean needs a floating tensor, not " +
                std::string(c10::toString(t.scalar_type())));
  }
  if (!s.group) return;
  if (!t.is_contiguous()) {
    throw Error(s.name +
                "::all_reduce: the tensor must be contiguous (reduce into a "
                ".contiguous() copy)");
  }
  try {
    std::vector<at::Tensor> tensors{t};
    c10d::AllreduceOptions o;
    o.reduceOp = to_c10d(op);
    s.group->allreduce(tensors, o)->wait();
  } catch (...) {
    fail("all_reduce", std::current_exception());
  }
  if (op == ReduceOp::Mean) t.div_(s.env.world_size);
}

void Ddp::broadcast(at::Tensor& t, int src) {
  auto& s = *state_;
  require_group(s, "broadcast");
  if (src < 0 || src >= s.env.world_size) {
    throw Error(s.name + "::broadcast: source rank " + std::to_string(src) + " is not in [0, " +
                std::to_string(s.env.world_size - 1) + "]");
  }
  if (!s.group) return;
  if (!t.is_contiguous()) throw Error(s.name + "::broadcast: the tensor must be contiguous");
  try {
    std::vector<at::Tensor> tensors{t};
    c10d::BroadcastOptions o;
    o.rootRank = src;
    s.group->broadcast(tensors, o)->wait();
  } catch (...) {
    fail("broadcast", std::current_exception());
  }
}

std::vector<at::Tensor> Ddp::all_gather(const at::Tensor& t) {
  auto& s = *state_;
  require_group(s, "all_gather");
  if (!s.group) return {t.clone()};
  auto input = t.contiguous();
  std::vector<std::vector<at::Tensor>> out(1);
  for (int i = 0; i < s.env.world_size; ++i) out[0].push_back(at::empty_like(input));
  try {
    std::vector<at::Tensor> in{input};
    s.group->allgather(out, in)->wait();
  } catch (...) {
    fail("all_gather", std::current_exception());
  }
  return out[0];
}

c10::IValue Ddp::broadcast_ivalue(const c10::IValue& value, int src) {
  auto& s = *state_;
  require_group(s, "broadcast_object");
  if (src < 0 || src >= s.env.world_size) {
    throw Error(s.name + "::broadcast_object: source rank " + std::to_string(src) +
                " is not in [0, " + std::to_string(s.env.world_size - 1) + "]");
  }
  if (!s.group) return value;
  std::vector<char> bytes;
  if (s.env.rank == src) bytes = torch::jit::pickle_save(value);
  const auto on_device = at::TensorOptions().device(s.device);
  at::Tensor size =
      at::full({1}, static_cast<std::int64_t>(bytes.size()), on_device.dtype(at::kLong));
  broadcast(size, src);
  const auto n = size.cpu().item<std::int64_t>();
  at::Tensor data = at::empty({n}, at::TensorOptions().dtype(at::kByte));
  if (s.env.rank == src) std::memcpy(data.data_ptr(), bytes.data(), bytes.size());
  data = data.to(s.device);
  broadcast(data, src);
  if (s.env.rank == src) return value;
  data = data.cpu();
  const auto* first = static_cast<const char*>(data.data_ptr());
  return torch::jit::pickle_load(std::vector<char>(first, first + n));
}

std::string Ddp::broadcast_object(const std::string& value, int src) {
  return broadcast_ivalue(c10::IValue(value), src).toStringRef();
}

StateDict Ddp::broadcast_object(const StateDict& value, int src) {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  for (const auto& [key, v] : value) dict.insert(key, v);
  auto got = broadcast_ivalue(c10::IValue(dict), src).toGenericDict();
  StateDict out;
  for (const auto& item : got) out.emplace(item.key().toStringRef(), item.value());
  return out;
}

void Ddp::save_checkpoint(const std::filesystem::path& path, const c10::IValue& value,
                          const checkpoint::CheckpointIO& io) {
  auto& s = *state_;
  require_group(s, "save_checkpoint");
  std::string failure;
  if (rank() == 0) {
    try {
      io.save(path, value);
    } catch (const std::exception& ex) {
      failure = *ex.what() ? ex.what() : "an error with no message";
    }
  }
  // Every rank learns whether rank 0 wrote the file, and why not: the same error on all.
  if (s.group) {
    loom::detail::agree_on_failure(*this, s.device, failure,
                                   "loom::save: writing " + path.string());
  } else if (!failure.empty()) {
    throw Error(failure);
  }
}

c10::IValue Ddp::load_checkpoint(const std::filesystem::path& path,
                                 const checkpoint::CheckpointIO& io, c10::Device device) {
  return checkpoint::merge_shards(path, io.load(path, device), io, device);
}

StateDict Ddp::state_dict() const {
  const auto& s = *state_;
  if (!s.reducer) return {};
  std::unordered_map<const void*, std::int64_t> index;
  for (std::size_t i = 0; i < s.reduced_params.size(); ++i) {
    index.emplace(s.reduced_params[i].unsafeGetTensorImpl(), static_cast<std::int64_t>(i));
  }
  c10::impl::GenericList buckets(c10::ListType::ofInts());
  // The buckets' own gradient tensors (no copies): only their parameters are read.
  for (const auto& bucket : s.reducer->get_grad_buckets(/*return_zero_tensors=*/false)) {
    c10::List<std::int64_t> ids;
    for (const auto& p : bucket.getParameters()) ids.push_back(index.at(p.unsafeGetTensorImpl()));
    buckets.push_back(std::move(ids));
  }
  return {{"bucket_order", buckets}};
}

void Ddp::load_state_dict(const StateDict& state) {
  auto& s = *state_;
  StateDict rest = state;
  const auto found = rest.find("bucket_order");
  if (found == rest.end()) return loom::detail::refuse_state(strategy(), "strategy", rest);
  const c10::IValue order = found->second;
  rest.erase(found);
  loom::detail::refuse_state(strategy(), "strategy", rest);
  const std::string bad = s.name +
                          "::load_state_dict: bucket_order is not a list of lists of "
                          "parameter indices";
  if (!order.isList()) throw Error(bad);
  std::vector<std::vector<std::size_t>> buckets;
  for (const c10::IValue& bucket : order.toListRef()) {
    if (!bucket.isList()) throw Error(bad);
    auto& ids = buckets.emplace_back();
    for (const c10::IValue& i : bucket.toListRef()) {
      if (!i.isInt() || i.toInt() < 0) throw Error(bad);
      ids.push_back(static_cast<std::size_t>(i.toInt()));
    }
  }
  if (!s.reducer) {  // before setup, or one process: setup applies it (or has nothing to)
    s.loaded_buckets = std::move(buckets);
    return;
  }
  check_bucket_order(s, buckets, s.reduced_params.size());
  s.reducer->initialize_buckets(std::move(buckets));
}

void Ddp::teardown() {
  auto& s = *state_;
  if (s.torn_down || s.failed) return;
  if (s.group) {
    barrier();  // no rank leaves while another still reads from it
    try {
      s.group->shutdown();
    } catch (...) {
      fail("shutting the process group down", std::current_exception());
    }
  }
  s.torn_down = true;
  s.release();
}

}  // namespace loom::dist
