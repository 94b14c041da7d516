#pragma once
// Ddp's state beside its process group (group_state.hpp): the reducer, its logger and the
// passes' flags. Shared by ddp.cpp, join.cpp and comm_hooks.cpp.
#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include <torch/csrc/distributed/c10d/logger.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include <loom/dist/ddp.hpp>

#include "group_state.hpp"

namespace loom::dist {

namespace detail {

struct DdpState {
  DdpState(GroupState& group, DdpOptions o) : g(group), options(std::move(o)) {}
  DdpState(const DdpState&) = delete;
  DdpState& operator=(const DdpState&) = delete;

  /// The Ddp's process group's state: the environment, the store, the c10d group.
  GroupState& g;
  DdpOptions options;
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
  /// Backward passes since the last optimizer step, and whether one of them reduced the
  /// gradients (ran outside no_sync): optimizer_step refuses a step on local gradients.
  int backwards_since_step = 0;
  bool synced_since_step = false;
  /// Build the reducer in setup (loom::Zero's stage 2 reduces the gradients itself).
  bool reduce_gradients = true;

  /// Drops the reducer and its logger without destroying them (they hold the group, which a
  /// failed collective leaves waiting for work that never completes); GroupState::abandon
  /// calls it.
  void abandon() {
    if (logger) new std::shared_ptr<c10d::Logger>(std::move(logger));
    if (reducer) new std::shared_ptr<c10d::Reducer>(std::move(reducer));
  }

  /// In order: the Logger holds the Reducer.
  void release() {
    logger.reset();
    reducer.reset();
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

}  // namespace detail

}  // namespace loom::dist
