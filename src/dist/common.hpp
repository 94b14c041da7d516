#pragma once
// What the loom::dist library's translation units call in one another (each function is defined
// in the file named above it): environment.cpp, comm_hooks.cpp, process_group.cpp,
// rendezvous.cpp, ddp.cpp and join.cpp, split as c10d splits its own (default_comm_hooks.cpp,
// ProcessGroup*.cpp, TCPStore.cpp, reducer.cpp).
// Internal to the loom::dist library.
#include <chrono>
#include <exception>
#include <string>
#include <string_view>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "ddp_state.hpp"
#include "group_state.hpp"

namespace torch::nn {
class Module;
}

namespace loom::dist::detail {

// environment.cpp

/// Under torchrun's agent: the kernel kills this process when its parent (the agent) dies;
/// loom::Error when the parent is already gone.
void die_with_parent();

/// Sets SIGPIPE to ignored when it is at its default, as Python does at start-up: a write to a
/// dead peer's socket then fails with an error instead of ending the process silently.
void ignore_default_sigpipe();

// comm_hooks.cpp

/// DdpOptions::comm_hook on the reducer, named in the logger as Python names it.
void register_comm_hook(DdpState& s);

// process_group.cpp

/// "5 s", or "1500 ms" when not whole seconds.
std::string seconds(std::chrono::milliseconds t);

/// Whether `error` came from communication (a peer, the network, a timeout), not from a misuse
/// the reducer diagnosed.
bool is_communication_error(std::exception_ptr error);

/// What ProcessGroup::fail does: a misuse becomes loom::Error with a hint; a failed collective
/// abandons the group, holds the roll call (roll_call.hpp) and throws loom::CollectiveError.
[[noreturn]] void throw_failure(GroupState& s, std::string_view what, std::exception_ptr error);

/// loom::Error before setup, loom::CollectiveError after a failed collective.
void require_group(const GroupState& s, std::string_view what);

/// A one-element tensor on the group's device.
at::Tensor flag(const GroupState& s, double value, at::ScalarType dtype = at::kFloat);

// rendezvous.cpp

/// Refuses a second connect, a failed group and a backend loom cannot connect; records the
/// backend and the device.
void choose_backend(GroupState& s, c10::Device device, std::string_view backend);

/// The rendezvous store (a TCPStore, or in memory without MASTER_ADDR).
c10::intrusive_ptr<c10d::Store> connect_store(const GroupState& s);

/// The process group on `store`, as Python's init_process_group builds it; `name` is the
/// group's name and store prefix ("0": the default group's; side_group's are others).
void connect_process_group(GroupState& s, const c10::intrusive_ptr<c10d::Store>& store,
                           c10::Device device, const std::string& name = "0");

// ddp.cpp

/// Rank `src`'s parameters and (DdpOptions::broadcast_buffers) buffers, on every rank.
void broadcast_module_state(DdpState& s, torch::nn::Module& module, int src);

/// Python's _find_common_rank: the largest rank for which `candidate` holds.
int find_common_rank(DdpState& s, bool candidate);

/// The module's buffers, broadcast from `src` (Python's _sync_module_buffers).
void broadcast_buffers_from(DdpState& s, int src);

/// Python's _check_sync_bufs_pre_fwd.
bool syncs_buffers_before_forward(const DdpState& s);

}  // namespace loom::dist::detail
