#pragma once
// Composer's monitors as callbacks: NaNMonitor (non-finite losses and gradients, read once an
// interval), LRMonitor (the learning rates), OptimizerMonitor (the L2 norms of gradients,
// parameters and updates), all logged through the runtime.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/_foreach_sub.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/stack.h>
#include <c10/core/GradMode.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <loom/callbacks/with_callbacks.hpp>
#include <loom/error.hpp>
#include <loom/step_result.hpp>

namespace loom {

namespace callbacks {

/// NaNMonitor's settings.
struct NaNMonitorOptions {
  /// The checks are read every `interval` backwards (one host sync each time), and before
  /// every checkpoint.
  int64_t interval = 100;
};

/// Composer's NaNMonitor without a host sync per step: after each backward it computes on the
/// device one vector of flags, whether the loss and each parameter's gradient are finite (the
/// gradients' inf-norms by one _foreach_norm, so a nan or an inf anywhere shows), and keeps it
/// with the step. Every `interval` backwards, and before every checkpoint (on_save_checkpoint:
/// none is written after an unnoticed non-finite value), it reads them all at once and throws
/// loom::Error naming the step (rt.global_step() at that backward) and the first non-finite
/// thing, the loss first, then the parameters in the module's order:
///
///   loom::NaNMonitor: step 17: the loss is nan
///   loom::NaNMonitor: step 17: the gradient of 'fc2.weight' is not finite
///
/// Under 16-mixed only the loss is checked: a gradient overflow there is the GradScaler's to
/// find, and its step is skipped. Under loom::Zero and loom::Fsdp each rank checks what its
/// own parameters hold (its shards where they are sharded); with more than one rank each read
/// also agrees over the ranks (one all-reduce), so every rank throws, the ones that found
/// nothing saying another rank did. check(rt) reads now (at the end of a run, say).
class NaNMonitor {
 public:
  static constexpr std::string_view kind = "NaNMonitor";

  explicit NaNMonitor(NaNMonitorOptions options = {}) : o_(options) {
    if (o_.interval < 1) throw Error("loom::NaNMonitor: interval must be at least 1");
  }

  template <class R>
  void on(Event<"on_after_backward">, R& rt, torch::nn::Module& module, const at::Tensor& loss) {
    at::NoGradGuard no_grad;
    Pending p{rt.global_step(), {}, loss, {}};  // rt.backward's loss: detached already
    // The inf-norm (max |x|) of the loss and of each gradient: not finite exactly when an
    // element is nan or inf. Three operators whatever the model: one _foreach_norm, one stack
    // (promoting mixed dtypes), one isfinite.
    std::vector<at::Tensor> norms_of{loss};
    if constexpr (R::precision_name() != "16-mixed") {
      if (module_ != &module) {
        module_ = &module;
        params_ = module.named_parameters(/*recurse=*/true).pairs();
      }
      norms_of.reserve(1 + params_.size());
      for (std::size_t i = 0; i < params_.size(); ++i) {
        const at::Tensor& g = params_[i].second.grad();
        // An empty gradient has no inf-norm (and nothing to be non-finite).
        if (!g.defined() || g.numel() == 0) continue;
        norms_of.push_back(g);
        p.index.push_back(static_cast<uint32_t>(i));
      }
    } else {
      (void)module;
    }
    const auto norms = at::_foreach_norm(norms_of, std::numeric_limits<double>::infinity());
    p.flags = at::isfinite(at::stack(norms));  // (1 + gradients,) bool
    pending_.push_back(std::move(p));
    if (++backwards_ % o_.interval == 0) check(rt);
  }

  template <class R>
  void on(Event<"on_save_checkpoint">, R& rt, const std::filesystem::path&) {
    check(rt);
  }

  /// Reads every check kept (one host sync; none kept: nothing) and throws on the first
  /// non-finite value.
  template <class R>
  void check(R& rt) {
    std::string failure = first_failure();
    if (detail::any_rank(rt, !failure.empty())) {
      if (failure.empty()) {
        failure = "loom::NaNMonitor: another rank found a non-finite value (its error names it)";
      }
      throw Error(failure);
    }
  }

  /// Backwards seen.
  int64_t backwards() const noexcept { return backwards_; }
  /// Checks kept, not read yet.
  std::size_t pending() const noexcept { return pending_.size(); }

 private:
  struct Pending {
    int64_t step;
    at::Tensor flags;             // (1 + k,) bool: the loss, then k gradients
    at::Tensor loss;              // detached, read only to say what it is
    std::vector<uint32_t> index;  // the gradients' parameters, in params_
  };

  // The message of the first non-finite value kept (empty: none); forgets them all.
  std::string first_failure() {
    if (pending_.empty()) return {};
    std::vector<at::Tensor> all;
    all.reserve(pending_.size());
    for (const Pending& p : pending_) all.push_back(p.flags);
    const at::Tensor flags = at::cat(all).cpu();  // the one sync
    std::vector<Pending> kept = std::move(pending_);
    pending_.clear();
    const bool* ok = flags.const_data_ptr<bool>();
    std::size_t pos = 0;
    for (const Pending& p : kept) {
      const std::string where = "loom::NaNMonitor: step " + std::to_string(p.step) + ": ";
      if (!ok[pos]) {
        if (p.loss.numel() != 1) return where + "the loss is not finite";
        return where + "the loss is " + detail::number_text(p.loss.item<double>());
      }
      for (std::size_t i = 0; i < p.index.size(); ++i) {
        if (!ok[pos + 1 + i]) {
          return where + "the gradient of '" + params_[p.index[i]].first + "' is not finite";
        }
      }
      pos += 1 + p.index.size();
    }
    return {};
  }

  NaNMonitorOptions o_;
  int64_t backwards_ = 0;
  const torch::nn::Module* module_ = nullptr;
  std::vector<std::pair<std::string, at::Tensor>> params_;
  std::vector<Pending> pending_;
};

/// LRMonitor's settings.
struct LRMonitorOptions {
  /// Logs at the steps whose global_step() is a multiple of `interval`.
  int64_t interval = 1;
};

/// Composer's LRMonitor: before each optimizer step (every `interval`), the learning rate of
/// each parameter group under Composer's key `lr-<OptimizerName>/group<i>` (the optimizer's
/// class name: "SGD", "AdamW", loom::optim's "AdamW" as well), logged through
/// rt.log_dict(metrics, rt.global_step()): the loggers, and on_log for the other callbacks.
/// Reads the options' lr: no device work.
class LRMonitor {
 public:
  static constexpr std::string_view kind = "LRMonitor";

  explicit LRMonitor(LRMonitorOptions options = {}) : o_(options) {
    if (o_.interval < 1) throw Error("loom::LRMonitor: interval must be at least 1");
  }

  template <class R>
  void on(Event<"on_before_optimizer_step">, R& rt, torch::optim::Optimizer& optimizer) {
    const int64_t step = rt.global_step();
    if (step % o_.interval != 0) return;
    const std::string prefix = "lr-" + detail::optimizer_class_name(optimizer) + "/group";
    std::vector<std::pair<std::string, MetricValue>> metrics;
    const auto& groups = optimizer.param_groups();
    for (std::size_t i = 0; i < groups.size(); ++i) {
      metrics.emplace_back(prefix + std::to_string(i), MetricValue(groups[i].options().get_lr()));
    }
    rt.log_dict(metrics, step);
  }

 private:
  LRMonitorOptions o_;
};

/// OptimizerMonitor's settings.
struct OptimizerMonitorOptions {
  /// Reports the steps whose global_step() is a multiple of `interval`.
  int64_t interval = 10;
};

/// Composer's OptimizerMonitor: every `interval` steps, L2 norms under Composer's keys,
/// logged through rt.log_dict(metrics, step) at on_after_optimizer_step (step: the index of
/// the step taken, as LRMonitor logs it):
///
///   l2_norm/grad/global       the norm of all the gradients together
///   l2_norm/grad/NAME         each parameter's gradient (before the step; unscaled under
///                             16-mixed)
///   l2_norm/param/NAME        each parameter, after the step
///   l2_norm/update/NAME       what the step changed: the parameter after minus before
///
/// NAME is the parameter's name in the module rt.backward last saw; parameters without a
/// gradient are left out. The norms stay device tensors (one _foreach_norm per kind, no host
/// sync; the loggers read them when they flush), and the parameters are copied for the update
/// only on the steps reported. Under loom::Zero and loom::Fsdp the norms are of what this
/// rank's parameters and gradients hold (its shards where they are sharded), not of the whole
/// model.
class OptimizerMonitor {
 public:
  static constexpr std::string_view kind = "OptimizerMonitor";

  explicit OptimizerMonitor(OptimizerMonitorOptions options = {}) : o_(options) {
    if (o_.interval < 1) throw Error("loom::OptimizerMonitor: interval must be at least 1");
  }

  template <class R>
  void on(Event<"on_after_backward">, R&, torch::nn::Module& module, const at::Tensor&) {
    module_ = &module;
  }

  template <class R>
  void on(Event<"on_before_optimizer_step">, R& rt, torch::optim::Optimizer&) {
    const int64_t step = rt.global_step();
    // One report per step: a step of several optimizers fires this once for each.
    if (step % o_.interval != 0 || step == pending_step_) return;
    if (module_ == nullptr) {
      throw Error(
          "loom::OptimizerMonitor: an optimizer step without a backward through the runtime "
          "first; the parameters' names come from the module rt.backward(loss, module) gets");
    }
    at::NoGradGuard no_grad;
    pending_step_ = step;
    names_.clear();
    params_.clear();
    std::vector<at::Tensor> grads;
    for (const auto& p : module_->named_parameters(/*recurse=*/true)) {
      if (!p.value().grad().defined()) continue;
      names_.push_back(p.key());
      params_.push_back(p.value());
      grads.push_back(p.value().grad());
    }
    metrics_.clear();
    if (grads.empty()) return;
    const auto norms = at::_foreach_norm(grads, 2);
    metrics_.emplace_back("l2_norm/grad/global",
                          MetricValue(at::linalg_vector_norm(at::stack(norms).to(at::kDouble), 2)));
    for (std::size_t i = 0; i < norms.size(); ++i) {
      metrics_.emplace_back("l2_norm/grad/" + names_[i], MetricValue(norms[i]));
    }
    before_.clear();
    before_.reserve(params_.size());
    for (const at::Tensor& p : params_) before_.push_back(p.detach().clone());
  }

  template <class R>
  void on(Event<"on_after_optimizer_step">, R& rt, torch::optim::Optimizer&, const StepResult&) {
    // The step is counted before this event: the one just taken is global_step() - 1.
    if (pending_step_ != rt.global_step() - 1) return;
    const int64_t step = pending_step_;
    pending_step_ = -1;
    if (params_.empty()) return;
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> now;
    now.reserve(params_.size());
    for (const at::Tensor& p : params_) now.push_back(p.detach());
    const auto param_norms = at::_foreach_norm(now, 2);
    const auto update_norms = at::_foreach_norm(at::_foreach_sub(now, before_), 2);
    for (std::size_t i = 0; i < names_.size(); ++i) {
      metrics_.emplace_back("l2_norm/param/" + names_[i], MetricValue(param_norms[i]));
    }
    for (std::size_t i = 0; i < names_.size(); ++i) {
      metrics_.emplace_back("l2_norm/update/" + names_[i], MetricValue(update_norms[i]));
    }
    before_.clear();
    std::vector<std::pair<std::string, MetricValue>> metrics = std::move(metrics_);
    metrics_.clear();
    rt.log_dict(metrics, step);
  }

 private:
  OptimizerMonitorOptions o_;
  torch::nn::Module* module_ = nullptr;
  int64_t pending_step_ = -1;
  std::vector<std::string> names_;
  std::vector<at::Tensor> params_, before_;
  std::vector<std::pair<std::string, MetricValue>> metrics_;
};

}  // namespace callbacks

// The monitors' names in loom::, where users write them.
using callbacks::LRMonitor;
using callbacks::LRMonitorOptions;
using callbacks::NaNMonitor;
using callbacks::NaNMonitorOptions;
using callbacks::OptimizerMonitor;
using callbacks::OptimizerMonitorOptions;

}  // namespace loom
