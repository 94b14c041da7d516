#pragma once
// What a dist::ProcessGroup holds (the store, the c10d group, the device) and the collectives
// the loom::dist library's strategies start on it without waiting: the c10d side of
// include/loom/dist/process_group.hpp. A strategy wraps their exceptions with
// ProcessGroup::fail(what). Internal to the loom::dist library.
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <loom/dist/process_group.hpp>

namespace loom::dist::detail {

struct GroupState {
  /// The strategy errors name: "loom::Ddp", "loom::Zero", a user's.
  std::string name;
  GroupOptions options;
  Environment env;
  std::string backend;
  c10::DeviceType device_type = c10::kCPU;
  c10::Device device{c10::kCPU};  // connect's device: where collectives of loom's own tensors run
  c10::intrusive_ptr<c10d::Store> store;  // the rendezvous store (the roll call after a failure)
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  bool connect_called = false;
  bool failed = false;
  bool torn_down = false;
  /// The side groups made from this one (side_group): each store prefix is new.
  int side_groups = 0;
  /// What else holds the group and must be dropped with it, not destroyed, after a failure
  /// (Ddp: its reducer and the reducer's logger).
  std::function<void()> on_abandon;

  /// Drops the group (and on_abandon's) without destroying them: after a failed collective,
  /// ~ProcessGroupGloo would wait for work that never completes.
  void abandon() {
    if (on_abandon) std::exchange(on_abandon, nullptr)();
    if (group) {
      try {
        group->abort();
      } catch (...) {
      }
      (void)group.release();
    }
  }
  void release() {
    group.reset();
    store.reset();
  }
};

/// A second group of `main`'s ranks on `main`'s store, gloo on the CPU, for collectives that a
/// thread of its own runs while the main group's go on (Python's new_group(backend="gloo") for
/// dcp.async_save): the ranks make it together, as a collective. Errors name `main`'s
/// strategy and `purpose`. Unconnected when `main` is (one process: its collectives do
/// nothing).
std::shared_ptr<ProcessGroup> side_group(ProcessGroup& main, std::string_view purpose);

/// A collective in flight.
class Work {
 public:
  Work() = default;
  explicit Work(c10::intrusive_ptr<c10d::Work> work) : work_(std::move(work)) {}
  /// Waits for it (throws what the backend throws), within the group's timeout or `timeout`.
  void wait() { work_->wait(); }
  void wait(std::chrono::milliseconds timeout) { work_->wait(timeout); }
  bool completed() const { return work_->isCompleted(); }
  void reset() { work_.reset(); }
  const c10::intrusive_ptr<c10d::Work>& get() const { return work_; }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
};

/// `t` reduced with `op` on every rank (Sum, Max, Min; Mean is the caller's division), within
/// the group's timeout.
Work all_reduce(GroupState& s, at::Tensor& t, ReduceOp op);
/// Every rank's `input` into `output`, rank after rank.
Work all_gather_into(GroupState& s, at::Tensor& output, at::Tensor& input);
/// `input`'s parts reduced with `op` (Sum, Max, Min; Mean is the caller's division), this
/// rank's into `output`.
Work reduce_scatter(GroupState& s, at::Tensor& output, at::Tensor& input, ReduceOp op);
/// Row r of `input` (world_size rows) to rank r, every rank's row for this one into row r of
/// `output`, row after row (c10d's alltoall_base with equal splits).
Work all_to_all(GroupState& s, at::Tensor& output, at::Tensor& input);
/// Whether the group's backend moves an all-to-all's bytes much faster than the same bytes as
/// an all-gather or a reduce-scatter: gloo, whose all-gather runs 3-4x and whose reduce-scatter
/// (an all-reduce, its part kept) 2x slower than its all-to-all of the same bytes on two ranks.
bool prefers_all_to_all(const GroupState& s);
/// `t` summed on rank `root`.
Work reduce(GroupState& s, at::Tensor& t, int root);
/// Rank `src`'s `t` on every rank.
Work broadcast(GroupState& s, at::Tensor& t, int src);
/// Rank `src`'s tensors on every rank, coalesced into buckets of `bucket_bytes` (c10d's
/// broadcast_coalesced); waits.
void broadcast_coalesced(GroupState& s, std::vector<at::Tensor>& tensors, std::size_t bucket_bytes,
                         int src);
/// Point to point: `t` to rank `dst`, or from rank `src`, with `tag`.
Work send(GroupState& s, at::Tensor& t, int dst, int tag);
Work recv(GroupState& s, at::Tensor& t, int src, int tag);

}  // namespace loom::dist::detail
