// dist::ProcessGroup: its environment and lifetime, the collectives loom issues on the group,
// what a failed one becomes, and the teardown. Connecting it: rendezvous.cpp.
#include <loom/dist/process_group.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>

#include <loom/detail/agree_on_failure.hpp>
#include <loom/detail/message_of.hpp>
#include <loom/error.hpp>

#include "common.hpp"
#include "roll_call.hpp"

namespace loom::dist {

namespace {

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

/// What ProcessGroup::fail does (common.hpp): a misuse the reducer diagnosed becomes loom::Error
/// with a hint; a failed collective abandons the group first, holds the roll call and names what to
/// check.
[[noreturn]] void throw_failure(detail::GroupState& s, std::string_view what,
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

void require_group(const detail::GroupState& s, std::string_view what) {
  if (!s.group && !s.env.single_process) {
    throw Error(s.name + "::" + std::string(what) +
                ": call rt.setup(model) first; it connects the process group for the device's "
                "backend");
  }
  if (s.failed) throw CollectiveError(s.name + ": a collective failed earlier; the group is gone");
}

/// A one-element tensor on the group's device.
at::Tensor flag(const detail::GroupState& s, double value, at::ScalarType dtype) {
  return at::full({1}, value, at::TensorOptions().dtype(dtype).device(s.device));
}

/// A sum all-reduce of `t`, waited for unless `wait` is false (then c10d keeps the work).
Work all_reduce(GroupState& s, at::Tensor& t, ReduceOp op) {
  std::vector<at::Tensor> tensors{t};
  c10d::AllreduceOptions o;
  o.reduceOp = to_c10d(op);
  o.timeout = s.options.timeout;
  return Work(s.group->allreduce(tensors, o));
}

// c10d's names for the single-tensor all-gather, reduce-scatter and all-to-all changed (2.15:
// all_gather_single / reduce_scatter_single / all_to_all_single; the old ones stay as
// deprecated aliases, the only names 2.11 has).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
Work all_gather_into(GroupState& s, at::Tensor& output, at::Tensor& input) {
  c10d::AllgatherOptions o;
  o.timeout = s.options.timeout;
  return Work(s.group->_allgather_base(output, input, o));
}

Work reduce_scatter(GroupState& s, at::Tensor& output, at::Tensor& input, ReduceOp op) {
  c10d::ReduceScatterOptions o;
  o.reduceOp = to_c10d(op);
  o.timeout = s.options.timeout;
  return Work(s.group->_reduce_scatter_base(output, input, o));
}

Work all_to_all(GroupState& s, at::Tensor& output, at::Tensor& input) {
  c10d::AllToAllOptions o;
  o.timeout = s.options.timeout;
  std::vector<int64_t> equal;  // no split sizes: equal parts
  return Work(s.group->alltoall_base(output, input, equal, equal, o));
}
#pragma GCC diagnostic pop

bool prefers_all_to_all(const GroupState& s) { return s.backend == "gloo"; }

Work reduce(GroupState& s, at::Tensor& t, int root) {
  std::vector<at::Tensor> tensors{t};
  c10d::ReduceOptions o;
  o.rootRank = root;
  o.reduceOp = c10d::ReduceOp(c10d::ReduceOp::SUM);
  o.timeout = s.options.timeout;
  return Work(s.group->reduce(tensors, o));
}

Work broadcast(GroupState& s, at::Tensor& t, int src) {
  std::vector<at::Tensor> tensors{t};
  c10d::BroadcastOptions o;
  o.rootRank = src;
  o.timeout = s.options.timeout;
  return Work(s.group->broadcast(tensors, o));
}

void broadcast_coalesced(GroupState& s, std::vector<at::Tensor>& tensors, std::size_t bucket_bytes,
                         int src) {
  c10d::broadcast_coalesced(s.group, tensors, bucket_bytes, src);
}

Work send(GroupState& s, at::Tensor& t, int dst, int tag) {
  std::vector<at::Tensor> tensors{t};
  return Work(s.group->send(tensors, dst, tag));
}

Work recv(GroupState& s, at::Tensor& t, int src, int tag) {
  std::vector<at::Tensor> tensors{t};
  return Work(s.group->recv(tensors, src, tag));
}

}  // namespace detail

ProcessGroup::ProcessGroup(std::string name, GroupOptions options)
    : state_(std::make_unique<detail::GroupState>()) {
  auto& s = *state_;
  s.name = std::move(name);
  if (options.timeout.count() <= 0) {
    throw Error(s.name + ": GroupOptions::timeout must be positive");
  }
  s.options = std::move(options);
  s.env = read_environment();
  if (s.options.exit_with_agent && s.env.under_agent) detail::die_with_parent();
}

ProcessGroup::ProcessGroup(ProcessGroup&&) noexcept = default;
ProcessGroup& ProcessGroup::operator=(ProcessGroup&&) noexcept = default;

ProcessGroup::~ProcessGroup() {
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

bool ProcessGroup::connected() const { return static_cast<bool>(state_->group); }
bool ProcessGroup::failed() const { return state_->failed; }
int ProcessGroup::rank() const { return state_->env.rank; }
int ProcessGroup::world_size() const { return state_->env.world_size; }
int ProcessGroup::local_rank() const { return state_->env.local_rank; }
int ProcessGroup::node_rank() const { return state_->env.node_rank; }
const Environment& ProcessGroup::environment() const { return state_->env; }
const GroupOptions& ProcessGroup::options() const { return state_->options; }
const std::string& ProcessGroup::name() const { return state_->name; }
std::string_view ProcessGroup::backend() const { return state_->backend; }
c10::Device ProcessGroup::device() const { return state_->device; }

void ProcessGroup::fail(std::string_view what, std::exception_ptr error) {
  detail::throw_failure(*state_, what, error);
}

void ProcessGroup::require_connected(std::string_view what) const {
  detail::require_group(*state_, what);
}

void ProcessGroup::barrier() { barrier_named("a barrier"); }

void ProcessGroup::barrier(std::string_view name) {
  barrier_named("the barrier \"" + std::string(name) + "\"");
}

void ProcessGroup::barrier_named(std::string_view what) {
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

void ProcessGroup::all_reduce(at::Tensor& t, ReduceOp op) {
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
    detail::all_reduce(s, t, op).wait();
  } catch (...) {
    fail("all_reduce", std::current_exception());
  }
  if (op == ReduceOp::Mean) t.div_(s.env.world_size);
}

void ProcessGroup::broadcast(at::Tensor& t, int src) {
  auto& s = *state_;
  require_group(s, "broadcast");
  if (src < 0 || src >= s.env.world_size) {
    throw Error(s.name + "::broadcast: source rank " + std::to_string(src) + " is not in [0, " +
                std::to_string(s.env.world_size - 1) + "]");
  }
  if (!s.group) return;
  if (!t.is_contiguous()) throw Error(s.name + "::broadcast: the tensor must be contiguous");
  try {
    detail::broadcast(s, t, src).wait();
  } catch (...) {
    fail("broadcast", std::current_exception());
  }
}

std::vector<at::Tensor> ProcessGroup::all_gather(const at::Tensor& t) {
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

namespace {

/// The checks of a collective between one rank's `part` and the world's `whole`, both flat:
/// contiguous, one dtype, `whole` world times `part`'s elements. Returns them flat (gloo checks
/// the first dimensions against the world size).
std::pair<at::Tensor, at::Tensor> flat_parts(const detail::GroupState& s, std::string_view what,
                                             const at::Tensor& part, const at::Tensor& whole) {
  if (whole.numel() != part.numel() * s.env.world_size ||
      whole.scalar_type() != part.scalar_type() || !whole.is_contiguous() ||
      !part.is_contiguous()) {
    throw Error(s.name + "::" + std::string(what) +
                ": both tensors contiguous, of one dtype, the whole one world_size times the "
                "part's elements");
  }
  return {part.view({-1}), whole.view({-1})};
}

}  // namespace

void ProcessGroup::all_gather_into(at::Tensor& output, const at::Tensor& input) {
  auto& s = *state_;
  require_group(s, "all_gather_into");
  auto [in, out] = flat_parts(s, "all_gather_into", input, output);
  if (!s.group) {
    out.copy_(in);
    return;
  }
  try {
    detail::all_gather_into(s, out, in).wait();
  } catch (...) {
    fail("all_gather_into", std::current_exception());
  }
}

void ProcessGroup::reduce_scatter(at::Tensor& output, at::Tensor& input, ReduceOp op) {
  auto& s = *state_;
  require_group(s, "reduce_scatter");
  if (op == ReduceOp::Mean && !at::isFloatingType(input.scalar_type())) {
    throw Error(s.name + "::reduce_scatter: ReduceOp::Mean needs a floating tensor");
  }
  auto [out, in] = flat_parts(s, "reduce_scatter", output, input);
  if (!s.group) {
    out.copy_(in);
    return;
  }
  try {
    detail::reduce_scatter(s, out, in, op).wait();
  } catch (...) {
    fail("reduce_scatter", std::current_exception());
  }
  if (op == ReduceOp::Mean) output.div_(s.env.world_size);
}

c10::IValue ProcessGroup::broadcast_object(const c10::IValue& value, int src) {
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

std::string ProcessGroup::broadcast_object(const std::string& value, int src) {
  return broadcast_object(c10::IValue(value), src).toStringRef();
}

StateDict ProcessGroup::broadcast_object(const StateDict& value, int src) {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  for (const auto& [key, v] : value) dict.insert(key, v);
  auto got = broadcast_object(c10::IValue(dict), src).toGenericDict();
  StateDict out;
  for (const auto& item : got) out.emplace(item.key().toStringRef(), item.value());
  return out;
}

void ProcessGroup::agree(const std::string& failure, const std::string& what) {
  loom::detail::agree_on_failure(*this, state_->device, failure, what);
}

void ProcessGroup::save_on_rank_zero(const std::filesystem::path& path, const c10::IValue& value,
                                     const checkpoint::CheckpointIO& io) {
  require_connected("save_checkpoint");
  if (!connected()) {  // one process: its own error
    const std::string failure = loom::detail::failure_of([&] { io.save(path, value); });
    if (!failure.empty()) throw Error(failure);
    return;
  }
  loom::detail::agree_on(*this, "loom::save: writing " + path.string(), [&] {
    if (rank() == 0) io.save(path, value);
  });
}

void ProcessGroup::teardown() {
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
