#pragma once
// LocalSgd: a strategy written against loom's public seam only (dist::GroupDefaults over a
// dist::ProcessGroup, the StrategyPolicy rows), to show what a new strategy costs: this file.
// tests/checkpoint/resume.cpp trains it on 2 ranks (strategy=local_sgd), with rt.save, rt.load
// and loom::Checkpoints as they are (tests/checkpoint/resume_matrix.py seam).
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include <ATen/core/grad_mode.h>
#include <torch/nn/module.h>

#include <loom/dist/process_group.hpp>
#include <loom/error.hpp>
#include <loom/state/state_dict.hpp>
#include <loom/step_result.hpp>

namespace loom_test {

/// Local SGD (torch.distributed.algorithms' PostLocalSGDOptimizer, without its warm-up):
/// every rank steps on its own gradients, and every `period` optimizer steps the ranks
/// average their parameters. setup gives every rank rank 0's parameters and buffers. The count
/// of steps is the strategy's state, so a resumed run averages where the straight one did.
class LocalSgd : public loom::dist::GroupDefaults<LocalSgd> {
 public:
  static constexpr std::string_view strategy() { return "local_sgd"; }

  explicit LocalSgd(std::int64_t period = 3, loom::dist::GroupOptions options = {})
      : group_("LocalSgd", std::move(options)), period_(period) {
    if (period_ < 1) throw loom::Error("LocalSgd: the period must be at least 1");
  }

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

  /// The precision's step on this rank's gradients; every `period` steps, the average.
  template <class Unscale, class Step>
  auto optimizer_step(loom::Optimizers, Unscale&&, Step&& step) {
    auto result = std::forward<Step>(step)();
    if (++steps_ % period_ == 0) average();
    return result;
  }

  std::int64_t steps() const { return steps_; }

  loom::StateDict state_dict() const { return {{"steps", c10::IValue(steps_)}}; }
  void load_state_dict(const loom::StateDict& state) {
    const auto found = state.find("steps");
    if (state.size() != 1 || found == state.end() || !found->second.isInt()) {
      throw loom::Error("LocalSgd::load_state_dict: want {\"steps\": int}");
    }
    steps_ = found->second.toInt();
  }

 private:
  void average() {
    if (module_ == nullptr) throw loom::Error("LocalSgd: optimizer_step before setup");
    at::NoGradGuard no_grad;
    for (auto& p : module_->parameters()) {
      at::Tensor t = p.detach();
      group_.all_reduce(t, loom::dist::ReduceOp::Mean);
    }
  }

  loom::dist::ProcessGroup group_;
  std::int64_t period_;
  std::int64_t steps_ = 0;
  torch::nn::Module* module_ = nullptr;
};

static_assert(loom::StrategyPolicy<LocalSgd>);

}  // namespace loom_test
