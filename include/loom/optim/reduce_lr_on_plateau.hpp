#pragma once
// loom::optim::ReduceLROnPlateau: Python's torch.optim.lr_scheduler.ReduceLROnPlateau, stepped
// with a metric (optim/lr_scheduler_base.hpp).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/List.h>
#include <ATen/core/ivalue.h>
#include <torch/optim/optimizer.h>

#include <loom/error.hpp>
#include <loom/optim/lr_scheduler_base.hpp>
#include <loom/state_reader.hpp>

namespace loom::optim {

/// ReduceLROnPlateau's settings, Python's keyword arguments. Python's `min_lr` is one number
/// or one per group: here `min_lr` (one for every group) or `min_lrs` (one per group); with
/// neither, every group's floor is Python's default 0.
struct ReduceLROnPlateauOptions {
  std::string mode = "min";            ///< "min" or "max": whether the metric should fall or rise
  double factor = 0.1;                 ///< new lr = lr * factor (< 1)
  int64_t patience = 10;               ///< steps without improvement before the lr falls
  double threshold = 1e-4;             ///< what counts as an improvement...
  std::string threshold_mode = "rel";  ///< ...relative ("rel") or absolute ("abs")
  int64_t cooldown = 0;                ///< steps after a reduction that count no bad epochs
  std::optional<double> min_lr = std::nullopt;
  std::vector<double> min_lrs = {};
  double eps = 1e-8;  ///< a reduction smaller than this is not made
};

/// Lowers each group's lr by `factor` when a metric has stopped improving for `patience`
/// steps, as `torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode, factor, patience,
/// threshold, threshold_mode, cooldown, min_lr, eps)`: the same decisions and lrs, and
/// Python's state_dict (every attribute but the optimizer, with Python's types).
///
/// It steps on a metric, once per evaluation (`sched.step(val_loss)`), not on optimizer
/// steps, so it takes no step result. A metric given as a tensor is read to the host (one
/// sync, as Python's `float(metrics)`).
class ReduceLROnPlateau {
 public:
  static constexpr const char* python_name = "ReduceLROnPlateau";

  explicit ReduceLROnPlateau(torch::optim::Optimizer& opt, ReduceLROnPlateauOptions o = {})
      : opt_(&opt),
        factor_(o.factor),
        patience_(o.patience),
        cooldown_(o.cooldown),
        eps_(o.eps),
        threshold_(o.threshold),
        mode_(std::move(o.mode)),
        threshold_mode_(std::move(o.threshold_mode)) {
    if (factor_ >= 1.0) fail("Factor should be < 1.0.");
    const auto n = opt.param_groups().size();
    if (n == 0) fail("the optimizer has no param groups");
    if (!o.min_lrs.empty()) {
      if (o.min_lr) fail("give min_lr (one for every group) or min_lrs (one per group), not both");
      if (o.min_lrs.size() != n) {
        fail("expected " + std::to_string(n) + " min_lrs, got " + std::to_string(o.min_lrs.size()));
      }
      default_min_lr_ = c10::IValue();
      min_lrs_ = std::move(o.min_lrs);
    } else {
      default_min_lr_ = o.min_lr ? c10::IValue(*o.min_lr) : c10::IValue(int64_t{0});
      min_lrs_.assign(n, o.min_lr.value_or(0.0));
      min_lrs_int_ = !o.min_lr;
    }
    last_lr_ = detail::group_lrs(opt);
    check_modes();
    best_ = mode_worse();
  }

  /// One evaluation's metric (Python's step(metrics)).
  void step(double metric) {
    ++last_epoch_;
    if (is_better(metric, best_)) {
      best_ = metric;
      num_bad_epochs_ = 0;
    } else {
      ++num_bad_epochs_;
    }
    if (cooldown_counter_ > 0) {
      --cooldown_counter_;
      num_bad_epochs_ = 0;  // bad epochs in cooldown are ignored
    }
    if (num_bad_epochs_ > patience_) {
      reduce_lr();
      cooldown_counter_ = cooldown_;
      num_bad_epochs_ = 0;
    }
    last_lr_ = detail::group_lrs(*opt_);
  }
  /// A metric held by a one-element tensor (read to the host: one sync).
  void step(const at::Tensor& metric) {
    if (metric.numel() != 1) {
      fail("a metric tensor must hold one element, got " + std::to_string(metric.numel()));
    }
    step(metric.item<double>());
  }

  torch::optim::Optimizer& optimizer() const noexcept { return *opt_; }
  /// The lrs after the last step, one per group (Python's get_last_lr()).
  const std::vector<double>& get_last_lr() const noexcept { return last_lr_; }
  int64_t last_epoch() const noexcept { return last_epoch_; }
  double best() const noexcept { return best_; }
  int64_t num_bad_epochs() const noexcept { return num_bad_epochs_; }
  bool in_cooldown() const noexcept { return cooldown_counter_ > 0; }

  /// Python's state_dict(): its __dict__ without the optimizer, in Python's order and types.
  SchedulerState state_dict() const {
    SchedulerState s = detail::new_state();
    s.insert("factor", factor_);
    s.insert("default_min_lr", default_min_lr_);
    if (min_lrs_int_) {
      c10::List<int64_t> ints;
      for (double m : min_lrs_) ints.push_back(static_cast<int64_t>(m));
      s.insert("min_lrs", ints);
    } else {
      s.insert("min_lrs", detail::double_list(min_lrs_));
    }
    s.insert("patience", patience_);
    s.insert("cooldown", cooldown_);
    s.insert("eps", eps_);
    s.insert("last_epoch", last_epoch_);
    s.insert("_last_lr", detail::double_list(last_lr_));
    s.insert("mode_worse", mode_worse());
    s.insert("mode", mode_);
    s.insert("threshold", threshold_);
    s.insert("threshold_mode", threshold_mode_);
    s.insert("best", best_);
    s.insert("cooldown_counter", cooldown_counter_);
    s.insert("num_bad_epochs", num_bad_epochs_);
    return s;
  }

  /// Python's load_state_dict(): takes loom's or Python's dict (the settings come with it;
  /// the groups' lrs come back with the optimizer's own state).
  void load_state_dict(const c10::IValue& state) {
    state::Reader r("loom::optim::ReduceLROnPlateau::load_state_dict", state);
    const auto n = opt_->param_groups().size();
    ReduceLROnPlateau next(*this);
    next.factor_ = r.number("factor");
    const c10::IValue& d = r.value("default_min_lr");
    if (!d.isNone() && !d.isInt() && !d.isDouble()) {
      r.fail("default_min_lr", "expected None or a number, got " + state::kind_of(d));
    }
    next.default_min_lr_ = d;
    const auto mins = r.list("min_lrs");
    next.min_lrs_ = r.numbers("min_lrs");
    next.min_lrs_int_ = std::all_of(mins.begin(), mins.end(), [](auto& v) { return v.isInt(); });
    if (next.min_lrs_.size() != n && d.isNone()) {
      r.fail("min_lrs", "holds " + std::to_string(next.min_lrs_.size()) + " values for " +
                            std::to_string(n) + " param groups");
    }
    next.patience_ = r.integer("patience");
    next.cooldown_ = r.integer("cooldown");
    next.eps_ = r.number("eps");
    next.last_epoch_ = r.integer("last_epoch");
    next.last_lr_ = detail::group_numbers(r, "_last_lr", n);
    r.ignore("mode_worse");  // follows from the mode, as Python recomputes it
    next.mode_ = r.string("mode");
    next.threshold_ = r.number("threshold");
    next.threshold_mode_ = r.string("threshold_mode");
    next.best_ = r.number("best");
    next.cooldown_counter_ = r.integer("cooldown_counter");
    next.num_bad_epochs_ = r.integer("num_bad_epochs");
    next.check_modes();
    *this = std::move(next);
  }

 private:
  [[noreturn]] static void fail(const std::string& what) {
    throw Error("loom::optim::ReduceLROnPlateau: " + what);
  }
  void check_modes() const {
    if (mode_ != "min" && mode_ != "max") fail("mode " + mode_ + " is unknown!");
    if (threshold_mode_ != "rel" && threshold_mode_ != "abs") {
      fail("threshold mode " + threshold_mode_ + " is unknown!");
    }
  }
  double mode_worse() const noexcept {
    return mode_ == "min" ? std::numeric_limits<double>::infinity()
                          : -std::numeric_limits<double>::infinity();
  }
  bool is_better(double a, double best) const noexcept {
    const bool rel = threshold_mode_ == "rel";
    if (mode_ == "min") return rel ? a < best * (1.0 - threshold_) : a < best - threshold_;
    return rel ? a > best * (threshold_ + 1.0) : a > best + threshold_;
  }
  /// Python's _reduce_lr: a new group count takes the default floor, where there is one.
  void reduce_lr() {
    auto& groups = opt_->param_groups();
    if (groups.size() != min_lrs_.size()) {
      if (default_min_lr_.isNone()) {
        fail("The number of param groups in the `optimizer` (" + std::to_string(groups.size()) +
             ") differs from when `ReduceLROnPlateau` was initialized (" +
             std::to_string(min_lrs_.size()) +
             "), usually due to a new param group being "
             "added to the optimizer. Please modify the `min_lrs` field to match the length "
             "of the `optimizer` param groups.");
      }
      min_lrs_.assign(groups.size(), default_min_lr_.isInt()
                                         ? static_cast<double>(default_min_lr_.toInt())
                                         : default_min_lr_.toDouble());
      min_lrs_int_ = default_min_lr_.isInt();
    }
    for (std::size_t i = 0; i < groups.size(); ++i) {
      const double old_lr = groups[i].options().get_lr();
      const double scaled = old_lr * factor_;
      const double new_lr = min_lrs_[i] > scaled ? min_lrs_[i] : scaled;  // Python's max()
      if (old_lr - new_lr > eps_) groups[i].options().set_lr(new_lr);
    }
  }

  torch::optim::Optimizer* opt_;
  double factor_;
  c10::IValue default_min_lr_;
  std::vector<double> min_lrs_;
  bool min_lrs_int_ = false;
  int64_t patience_, cooldown_;
  double eps_;
  int64_t last_epoch_ = 0;
  std::vector<double> last_lr_;
  double threshold_;
  std::string mode_, threshold_mode_;
  double best_ = 0.0;
  int64_t cooldown_counter_ = 0, num_bad_epochs_ = 0;
};

}  // namespace loom::optim
