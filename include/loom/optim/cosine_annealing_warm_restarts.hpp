#pragma once
// loom::optim::CosineAnnealingWarmRestarts: Python's
// torch.optim.lr_scheduler.CosineAnnealingWarmRestarts (SGDR; optim/lr_scheduler_base.hpp).
#include <cmath>
#include <cstdint>
#include <numbers>
#include <vector>

#include <torch/optim/optimizer.h>

#include <loom/error.hpp>
#include <loom/optim/lr_scheduler_base.hpp>
#include <loom/state_reader.hpp>

namespace loom::optim {

/// Cosine annealing from each group's lr to `eta_min` over `t_0` positions, then again from
/// the top over `t_0 * t_mult`, `t_0 * t_mult^2`, ... positions, as
/// `torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(optimizer, T_0, T_mult, eta_min)`
/// stepped without an epoch. Like Python's, its step leaves `_step_count` at 0.
class CosineAnnealingWarmRestarts : public detail::PythonScheduler<CosineAnnealingWarmRestarts> {
 public:
  static constexpr const char* python_name = "CosineAnnealingWarmRestarts";

  CosineAnnealingWarmRestarts(torch::optim::Optimizer& opt, int64_t t_0, int64_t t_mult = 1,
                              double eta_min = 0.0)
      : PythonScheduler(opt), t_0_(t_0), t_i_(t_0), t_mult_(t_mult), eta_min_(eta_min) {
    if (t_0 <= 0) {
      throw Error(
          "loom::optim::CosineAnnealingWarmRestarts: Expected positive integer T_0, but "
          "got " +
          std::to_string(t_0));
    }
    if (t_mult < 1) {
      throw Error(
          "loom::optim::CosineAnnealingWarmRestarts: Expected integer T_mult >= 1, but "
          "got " +
          std::to_string(t_mult));
    }
    advance();  // Python's _initial_step: its step() at last_epoch -1 goes to position 0
  }

  /// Python's step() without an epoch.
  void advance() {
    int64_t epoch = 0;
    if (last_epoch() < 0) {
      t_i_ = t_0_;  // Python's epoch-0 branch (epoch < T_0)
      t_cur_ = 0;
    } else {
      epoch = last_epoch() + 1;
      t_cur_ += 1;
      if (t_cur_ >= t_i_) {
        t_cur_ = t_cur_ % t_i_;
        t_i_ = t_i_ * t_mult_;
      }
    }
    update_lr(epoch);
  }

  std::vector<double> get_lr() const {
    constexpr double pi = std::numbers::pi;
    std::vector<double> out;
    for (double b : base_lrs()) {
      out.push_back(
          eta_min_ +
          (b - eta_min_) *
              (1 + std::cos(pi * static_cast<double>(t_cur_) / static_cast<double>(t_i_))) / 2);
    }
    return out;
  }
  void save_own(SchedulerState& s) const {
    s.insert("T_0", t_0_);
    s.insert("T_i", t_i_);
    s.insert("T_mult", t_mult_);
    s.insert("eta_min", eta_min_);
    s.insert("T_cur", t_cur_);
  }
  void load_own(state::Reader& r) {
    t_0_ = r.integer("T_0");
    t_i_ = r.integer("T_i");
    t_mult_ = r.integer("T_mult");
    eta_min_ = r.number("eta_min");
    t_cur_ = r.integer("T_cur");
    if (t_0_ <= 0 || t_i_ <= 0 || t_mult_ < 1) {
      throw Error(load_owner() + ": T_0 and T_i must be positive and T_mult at least 1");
    }
  }

 private:
  int64_t t_0_, t_i_, t_mult_;
  double eta_min_;
  int64_t t_cur_ = -1;
};

}  // namespace loom::optim
