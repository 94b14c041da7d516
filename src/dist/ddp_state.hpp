#pragma once
// Ddp's state, shared by src/dist/ddp.cpp and src/dist/zero.cpp (loom::Zero builds on a Ddp).
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <c10/core/Device.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/logger.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include <loom/dist/ddp.hpp>

namespace loom::dist {

namespace detail {

struct DdpState {
  /// The strategy errors name: "loom::Ddp", or "loom::Zero" for the Ddp a Zero builds on.
  std::string name = "loom::Ddp";
  DdpOptions options;
  Environment env;
  std::string backend;
  c10::DeviceType device_type = c10::kCPU;
  c10::Device device{c10::kCPU};  // setup's device: where collectives of loom's own tensors run
  c10::intrusive_ptr<c10d::Store> store;  // the rendezvous store (the roll call after a failure)
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  std::shared_ptr<c10d::Reducer> reducer;
  std::vector<at::Tensor> reduced_params;  // the reducer's parameters, by its indices
  /// A bucket layout load_state_dict took before setup built the reducer.
  std::vector<std::vector<std::size_t>> loaded_buckets;
  std::shared_ptr<c10d::Logger> logger;
  torch::nn::Module* module = nullptr;
  bool sync = true;                      // false while a NoSyncGuard lives
  bool delay_all_reduce_queued = false;  // static_graph: the first backward's all-reduce
  bool forward_param_sync = true;        // Python's require_forward_param_sync
  bool joining = false;                  // inside a JoinGuard's scope
  JoinOptions join_options;
  bool failed = false;
  /// Backward passes since the last optimizer step, and whether one of them reduced the
  /// gradients (ran outside no_sync): optimizer_step refuses a step on local gradients.
  int backwards_since_step = 0;
  bool synced_since_step = false;
  /// Build the reducer in setup (loom::Zero's stage 2 reduces the gradients itself).
  bool reduce_gradients = true;
  bool torn_down = false;

  /// Drops the group and the reducer without destroying them: after a failed collective,
  /// ~ProcessGroupGloo would wait for work that never completes.
  void abandon() {
    if (group) {
      try {
        group->abort();
      } catch (...) {
      }
      (void)group.release();
    }
    if (logger) new std::shared_ptr<c10d::Logger>(std::move(logger));
    if (reducer) new std::shared_ptr<c10d::Reducer>(std::move(reducer));
  }

  /// In order: the Logger holds the Reducer, the Reducer the group.
  void release() {
    logger.reset();
    reducer.reset();
    group.reset();
    store.reset();
  }
};

}  // namespace detail

namespace detail {

/// A backward pass ran, `synced` when it reduced the gradients.
inline void record_backward(DdpState& s, bool synced) {
  ++s.backwards_since_step;
  s.synced_since_step = s.synced_since_step || synced;
}

/// Before an optimizer step: throws loom::Error when backward passes ran since the last step
/// and none of them reduced the gradients (every one under no_sync); then starts counting anew.
void check_step_synchronized(DdpState& s);

/// loom::Zero's view of the Ddp it builds on.
struct DdpAccess {
  static DdpState& state(Ddp& ddp) { return *ddp.state_; }
  static const DdpState& state(const Ddp& ddp) { return *ddp.state_; }
  [[noreturn]] static void fail(Ddp& ddp, std::string_view what, std::exception_ptr error) {
    ddp.fail(what, error);
  }
};

}  // namespace detail

}  // namespace loom::dist
