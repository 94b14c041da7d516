// dist::ProcessGroup::connect: the backend chosen, the rendezvous store (a TCPStore with
// Python's prefixes, or one in memory), the c10d process group on it (gloo or NCCL, wrapped
// under TORCH_DISTRIBUTED_DEBUG=DETAIL), and this rank's address for the roll call.
#include <loom/dist/process_group.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <torch/csrc/distributed/c10d/debug.h>
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

namespace detail {

/// Refuses a second connect and a failed group, then records the backend (GroupOptions::backend,
/// else `backend`) and the device, refusing a backend loom cannot connect.
void choose_backend(detail::GroupState& s, c10::Device device, std::string_view backend) {
  if (s.connect_called) {
    throw Error(s.name + ": the process group's connect() was called a second time");
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
c10::intrusive_ptr<c10d::Store> connect_store(const detail::GroupState& s) {
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
/// ("0" for the default group), then the device type for the backend.
void connect_process_group(detail::GroupState& s, const c10::intrusive_ptr<c10d::Store>& store,
                           c10::Device device, const std::string& name) {
  const auto timeout = s.options.timeout;
  try {
    auto group_store = c10::make_intrusive<c10d::PrefixStore>(
        name + "/", c10::make_intrusive<c10d::PrefixStore>("default_pg", store));
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
    s.group->setGroupName(name);
  } catch (const loom::Error&) {
    throw;
  } catch (...) {
    throw_failure(s, "connecting the " + s.backend + " process group", std::current_exception());
  }
}

std::shared_ptr<ProcessGroup> side_group(ProcessGroup& main, std::string_view purpose) {
  auto& m = main.state();
  GroupOptions options = m.options;
  options.backend = "gloo";
  options.exit_with_agent = false;  // the main group asked already
  auto out = std::make_shared<ProcessGroup>(m.name + " (" + std::string(purpose) + ")", options);
  auto& s = out->state();
  choose_backend(s, c10::Device(c10::kCPU), "gloo");
  s.connect_called = true;
  if (!main.connected()) return out;
  s.store = m.store;
  connect_process_group(s, m.store, s.device, "loom_side_" + std::to_string(m.side_groups++));
  return out;
}

}  // namespace detail

void ProcessGroup::connect(c10::Device device, std::string_view backend) {
  auto& s = *state_;
  detail::choose_backend(s, device, backend);
  s.connect_called = true;
  if (s.env.single_process) return;  // one process: nothing to connect
  detail::ignore_default_sigpipe();
  s.store = detail::connect_store(s);
  detail::connect_process_group(s, s.store, device);
  try {
    detail::announce_host(*s.store, s.env.rank, s.env.master_addr);
  } catch (...) {
    detail::throw_failure(s, "writing this rank's address to the store", std::current_exception());
  }
}

}  // namespace loom::dist
