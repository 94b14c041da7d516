#pragma once
// loom::Zero's state beside the Ddp it builds on: the partition, stage 2's buckets and the
// hooks that launch them. Shared by zero.cpp and zero_checkpoint.cpp; internal to the
// loom::dist library.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>

#include <loom/dist/zero.hpp>

#include "group_state.hpp"

namespace loom::dist {

namespace detail {

/// One bucket of stage 2's reduction: some of one owner's parameters.
struct GradBucket {
  int owner = 0;
  std::vector<std::size_t> params;  // indices into ZeroState::params
  std::int64_t numel = 0;
  std::size_t pending = 0;  // gradients not yet accumulated in this backward
  bool in_place = false;    // one parameter, summed in its own .grad (no copy)
  bool launched = false, finished = false;
  at::Tensor flat;
  Work work;
};

using Accumulator =
    decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

struct ZeroState {
  torch::nn::Module* module = nullptr;
  std::vector<at::Tensor> params;  // the module's parameters that require a gradient
  std::vector<int> owners;         // each one's owner
  std::unordered_map<const void*, int> owner_of;
  std::vector<std::vector<at::Tensor>> shards;  // each rank's, largest first (Python's order)

  // Stage 2, more than one rank: the buckets in launch order, each parameter's bucket, and the
  // hooks on the gradient accumulators that launch a bucket's reduce once its gradients are in.
  std::vector<GradBucket> buckets;
  std::vector<std::size_t> bucket_of;
  std::vector<std::pair<Accumulator, std::uintptr_t>> hooks;
  GroupState* group = nullptr;  // the Ddp's process group
  int rank = 0;
  double share = 1.0;
  bool all_reduce = false;  // the buckets' collective: allreduce, or reduce to the owner
  std::size_t next_launch = 0, next_finish = 0;
  bool armed = false;  // a synchronized forward ran: this backward reduces

  ZeroState() = default;
  ZeroState(const ZeroState&) = delete;
  ZeroState& operator=(const ZeroState&) = delete;
  ~ZeroState() { remove_hooks(); }

  void remove_hooks() {
    for (auto& [accumulator, key] : hooks) accumulator->del_post_hook(key);
    hooks.clear();
  }

  /// Copies a bucket's gradients (zeros where a parameter has none) times 1 / world size (the
  /// reducer's average; one pass: the product is written into the bucket), and starts their
  /// sum on the owner.
  void launch(GradBucket& b) {
    const at::Tensor& first = params[b.params.front()];
    b.in_place = b.params.size() == 1 && first.grad().defined() && first.grad().is_contiguous() &&
                 first.grad().layout() == at::kStrided;
    if (b.in_place) {
      // A bucket of one parameter: its gradient is the buffer, scaled and summed in place.
      b.flat = first.grad();
      b.flat.mul_(share);
      start(b);
      return;
    }
    b.flat = at::empty({b.numel}, first.options().requires_grad(false));
    std::int64_t offset = 0;
    for (std::size_t i : b.params) {
      const at::Tensor& p = params[i];
      at::Tensor view = b.flat.narrow(0, offset, p.numel()).view(p.sizes());
      if (p.grad().defined()) {
        at::mul_out(view, p.grad(), share);
      } else {
        view.zero_();
      }
      offset += p.numel();
    }
    start(b);
  }

  /// Starts a bucket's collective on its buffer.
  void start(GradBucket& b) {
    b.work = all_reduce ? detail::all_reduce(*group, b.flat, ReduceOp::Sum)
                        : detail::reduce(*group, b.flat, b.owner);
    b.launched = true;
  }

  /// Waits for a bucket: the owner's gradients become the sums, the others' are dropped.
  void finish(GradBucket& b) {
    b.work.wait();
    if (b.in_place) {  // the owner's .grad holds the sum; the others drop theirs
      if (b.owner != rank) params[b.params.front()].mutable_grad() = at::Tensor();
      b.flat = at::Tensor();
      b.work.reset();
      b.finished = true;
      return;
    }
    std::int64_t offset = 0;
    for (std::size_t i : b.params) {
      at::Tensor& p = params[i];
      if (b.owner == rank) {
        at::Tensor view = b.flat.narrow(0, offset, p.numel()).view(p.sizes());
        if (p.grad().defined()) {
          p.mutable_grad().copy_(view);
        } else {
          p.mutable_grad() = view.clone();
        }
      } else {
        p.mutable_grad() = at::Tensor();
      }
      offset += p.numel();
    }
    b.flat = at::Tensor();
    b.work.reset();
    b.finished = true;
  }

  /// Launches the buckets that are ready, in order (every rank launches the same sequence),
  /// and finishes, in order, those whose reduce has completed.
  void advance() {
    while (next_launch < buckets.size() && buckets[next_launch].pending == 0) {
      launch(buckets[next_launch++]);
    }
    while (next_finish < next_launch && buckets[next_finish].work.completed()) {
      finish(buckets[next_finish++]);
    }
  }

  /// A gradient accumulator's hook: parameter `i`'s gradient is in.
  void ready(std::size_t i) {
    if (!armed) return;
    GradBucket& b = buckets[bucket_of[i]];
    if (b.pending > 0 && --b.pending == 0) advance();
  }

  /// Before a synchronized forward: every bucket waits for all its gradients again (reduces
  /// a backward outside rt.backward started are waited for first).
  void arm() {
    for (; next_finish < next_launch; ++next_finish) finish(buckets[next_finish]);
    for (auto& b : buckets) {
      b.pending = b.params.size();
      b.launched = b.finished = false;
    }
    next_launch = next_finish = 0;
    armed = true;
  }

  /// After the backward: the buckets not launched yet (a parameter without a gradient) go in
  /// order, and every bucket is finished.
  void complete() {
    armed = false;
    for (; next_launch < buckets.size(); ++next_launch) launch(buckets[next_launch]);
    for (; next_finish < buckets.size(); ++next_finish) finish(buckets[next_finish]);
  }
};

}  // namespace detail

}  // namespace loom::dist
