#pragma once
// loom::optim::CosineAnnealingLR: Python's torch.optim.lr_scheduler.CosineAnnealingLR, by its
// recursive formula (optim/lr_scheduler_base.hpp).
#include <cmath>
#include <cstdint>
#include <numbers>
#include <optional>
#include <utility>
#include <vector>

#include <torch/optim/optimizer.h>

#include <loom/error.hpp>
#include <loom/optim/lr_scheduler_base.hpp>
#include <loom/state_reader.hpp>

namespace loom::optim {

/// Cosine annealing from each group's lr to `eta_min` over `t_max` positions, by Python's
/// recursive formula, as `torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max,
/// eta_min)`.
class CosineAnnealingLR : public detail::PythonScheduler<CosineAnnealingLR> {
 public:
  static constexpr const char* python_name = "CosineAnnealingLR";
  /// Its lrs follow from the groups\' current lrs: it may follow others in a ChainedScheduler.
  static constexpr bool chainable = true;

  CosineAnnealingLR(torch::optim::Optimizer& opt, int64_t t_max, double eta_min = 0.0,
                    std::optional<std::vector<double>> initial_lrs = std::nullopt)
      : PythonScheduler(opt, std::move(initial_lrs)), t_max_(t_max), eta_min_(eta_min) {
    if (t_max <= 0) throw Error("loom::optim::CosineAnnealingLR: T_max must be positive");
    initial_step();
  }

  std::vector<double> get_lr() const {
    constexpr double pi = std::numbers::pi;
    const auto e = last_epoch();
    const auto T = static_cast<double>(t_max_);
    auto lrs = current();
    if (is_initial()) return lrs;
    if (step_count() == 1 && e > 0) {
      for (std::size_t i = 0; i < lrs.size(); ++i) {
        lrs[i] = eta_min_ +
                 (base_lrs()[i] - eta_min_) * (1 + std::cos(static_cast<double>(e) * pi / T)) / 2;
      }
    } else if (detail::py_mod(e - 1 - t_max_, 2 * t_max_) == 0) {
      for (std::size_t i = 0; i < lrs.size(); ++i) {
        lrs[i] = lrs[i] + (base_lrs()[i] - eta_min_) * (1 - std::cos(pi / T)) / 2;
      }
    } else {
      for (auto& lr : lrs) {
        lr = (1 + std::cos(pi * static_cast<double>(e) / T)) /
                 (1 + std::cos(pi * static_cast<double>(e - 1) / T)) * (lr - eta_min_) +
             eta_min_;
      }
    }
    return lrs;
  }
  std::vector<double> closed_form_lr() const {
    constexpr double pi = std::numbers::pi;
    std::vector<double> out;
    for (double b : base_lrs()) {
      out.push_back(eta_min_ + (b - eta_min_) *
                                   (1 + std::cos(pi * static_cast<double>(last_epoch()) /
                                                 static_cast<double>(t_max_))) /
                                   2);
    }
    return out;
  }
  void save_own(SchedulerState& s) const {
    s.insert("T_max", t_max_);
    s.insert("eta_min", eta_min_);
  }
  void load_own(state::Reader& r) {
    t_max_ = r.integer("T_max");
    eta_min_ = r.number("eta_min");
  }

 private:
  int64_t t_max_;
  double eta_min_;
};

}  // namespace loom::optim
