#pragma once
// loom::optim::PolynomialLR: Python's torch.optim.lr_scheduler.PolynomialLR
// (optim/lr_scheduler_base.hpp).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <torch/optim/optimizer.h>

#include <loom/error.hpp>
#include <loom/optim/lr_scheduler_base.hpp>
#include <loom/state_reader.hpp>

namespace loom::optim {

/// Decays each group's lr to 0 over `total_iters` positions by a polynomial of degree
/// `power`, then holds it, as `torch.optim.lr_scheduler.PolynomialLR(optimizer, total_iters,
/// power)`.
class PolynomialLR : public detail::PythonScheduler<PolynomialLR> {
 public:
  static constexpr const char* python_name = "PolynomialLR";
  /// Its lrs follow from the groups\' current lrs: it may follow others in a ChainedScheduler.
  static constexpr bool chainable = true;

  explicit PolynomialLR(torch::optim::Optimizer& opt, int64_t total_iters = 5, double power = 1.0)
      : PythonScheduler(opt), total_iters_(total_iters), power_(power) {
    if (total_iters <= 0) throw Error("loom::optim::PolynomialLR: total_iters must be positive");
    initial_step();
  }

  std::vector<double> get_lr() const {
    auto lrs = current();
    if (is_initial() || last_epoch() > total_iters_) return lrs;
    const double t = static_cast<double>(total_iters_), e = static_cast<double>(last_epoch());
    const double factor = std::pow((1.0 - e / t) / (1.0 - (e - 1) / t), power_);
    for (auto& lr : lrs) lr *= factor;
    return lrs;
  }
  std::vector<double> closed_form_lr() const {
    const double t = static_cast<double>(total_iters_);
    const double e = static_cast<double>(std::min(total_iters_, last_epoch()));
    std::vector<double> out;
    for (double b : base_lrs()) out.push_back(b * std::pow(1.0 - e / t, power_));
    return out;
  }
  void save_own(SchedulerState& s) const {
    s.insert("total_iters", total_iters_);
    s.insert("power", power_);
  }
  void load_own(state::Reader& r) {
    total_iters_ = r.integer("total_iters");
    power_ = r.number("power");
    if (total_iters_ <= 0) {
      throw Error("loom::optim::PolynomialLR::load_state_dict: total_iters must be positive");
    }
  }

 private:
  int64_t total_iters_;
  double power_;
};

}  // namespace loom::optim
