// loom::Ddp's process group: the store, the group on it (gloo or NCCL, wrapped under
// TORCH_DISTRIBUTED_DEBUG=DETAIL), the collectives loom issues on it, what a failed one
// becomes, and the teardown.
#include <loom/dist/ddp.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/debug.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <loom/detail/message_of.hpp>
#include <loom/error.hpp>

#include "backends.hpp"
#include "common.hpp"
#include "roll_call.hpp"

namespace loom::dist {

namespace {

std::string seconds(std::chrono::milliseconds t) {
  auto ms = t.count();
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + " s";
  return std::to_string(ms) + " ms";
}

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

}  // namespace

namespace detail {

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

/// What Ddp::fail does (common.hpp): a misuse the reducer diagnosed becomes loom::Error with
/// a hint; a failed collective abandons the group first, holds the roll call and names what
/// to check.
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

void require_group(const detail::DdpState& s, std::string_view what) {
  if (!s.group && !s.env.single_process) {
    throw Error(s.name + "::" + std::string(what) +
                ": call rt.setup(model) first; it connects the process group for the device's "
                "backend");
  }
  if (s.failed) throw CollectiveError(s.name + ": a collective failed earlier; the group is gone");
}

/// A one-element tensor on the group's device.
at::Tensor flag(const detail::DdpState& s, double value, at::ScalarType dtype) {
  return at::full({1}, value, at::TensorOptions().dtype(dtype).device(s.device));
}

/// A sum all-reduce of `t`, waited for unless `wait` is false (then c10d keeps the work).
void sum_all_reduce(detail::DdpState& s, at::Tensor& t, bool wait) {
  std::vector<at::Tensor> tensors{t};
  auto work = s.group->allreduce(tensors);
  if (wait) work->wait();
}

}  // namespace detail

void Ddp::fail(std::string_view what, std::exception_ptr error) {
  throw_failure(*state_, what, error);
}

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
