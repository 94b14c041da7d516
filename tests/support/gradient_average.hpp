#pragma once
// GradientAverage: a strategy written against loom's public seam only (dist::GroupDefaults over
// a dist::ProcessGroup, the StrategyPolicy rows), to show what a new strategy costs: this file.
// tests/checkpoint/resume.cpp trains it on 2 ranks (strategy=gradient_average), with rt.save,
// rt.load and loom::Checkpoints as they are (tests/checkpoint/resume_matrix.py seam).
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include <ATen/core/grad_mode.h>
#include <torch/nn/module.h>

#include <loom/dist/process_group.hpp>
#include <loom/error.hpp>
#include <loom/guards.hpp>
#include <loom/state_dict.hpp>

namespace loom_test {

/// Data parallelism at its plainest: after each backward every parameter's gradient is
/// averaged over the ranks, one all-reduce per parameter, in the module's order (no buckets,
/// no overlap with the backward: loom::Ddp's reducer does both). setup gives every rank rank
/// 0's parameters and buffers, so the replicas stay equal and rank 0's checkpoint holds the
/// run. Its state is the count of averaged backward passes, restored by rt.load.
class GradientAverage : public loom::dist::GroupDefaults<GradientAverage> {
 public:
  static constexpr std::string_view strategy() { return "gradient_average"; }

  explicit GradientAverage(loom::dist::GroupOptions options = {})
      : group_("GradientAverage", std::move(options)) {}

  loom::dist::ProcessGroup& process_group() { return group_; }
  const loom::dist::ProcessGroup& process_group() const { return group_; }

  void setup(torch::nn::Module& module, c10::Device device, std::string_view backend) {
    group_.connect(device, backend);
    module_ = &module;
    at::NoGradGuard no_grad;
    for (auto& p : module.parameters()) {
      at::Tensor t = p.detach();
      group_.broadcast(t, 0);
    }
    for (auto& b : module.buffers()) {
      at::Tensor t = b.detach();
      group_.broadcast(t, 0);
    }
  }

  /// The precision's backward, then every gradient averaged (a parameter without one counts
  /// as zeros, as in Ddp's buckets).
  template <class Step>
  void backward(const at::Tensor&, Step&& step) {
    std::forward<Step>(step)();
    if (module_ == nullptr) throw loom::Error("GradientAverage: backward before setup");
    at::NoGradGuard no_grad;
    for (auto& p : module_->parameters()) {
      if (!p.requires_grad()) continue;
      if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
      group_.all_reduce(p.mutable_grad(), loom::dist::ReduceOp::Mean);
    }
    ++averaged_;
  }

  std::int64_t averaged() const { return averaged_; }

  loom::StateDict state_dict() const { return {{"averaged", c10::IValue(averaged_)}}; }
  void load_state_dict(const loom::StateDict& state) {
    const auto found = state.find("averaged");
    if (state.size() != 1 || found == state.end() || !found->second.isInt()) {
      throw loom::Error("GradientAverage::load_state_dict: want {\"averaged\": int}");
    }
    averaged_ = found->second.toInt();
  }

 private:
  loom::dist::ProcessGroup group_;
  std::int64_t averaged_ = 0;
  torch::nn::Module* module_ = nullptr;
};

static_assert(loom::StrategyPolicy<GradientAverage>);

}  // namespace loom_test
