#pragma once
// loom::optim::ExponentialLR: Python's torch.optim.lr_scheduler.ExponentialLR
// (optim/lr_scheduler_base.hpp).
#include <cmath>
#include <vector>

#include <torch/optim/optimizer.h>

#include <loom/optim/lr_scheduler_base.hpp>
#include <loom/state_reader.hpp>

namespace loom::optim {

/// Multiplies each group's lr by `gamma` at every position, as
/// `torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma)`.
class ExponentialLR : public detail::PythonScheduler<ExponentialLR> {
 public:
  static constexpr const char* python_name = "ExponentialLR";
  /// Its lrs follow from the groups\' current lrs: it may follow others in a ChainedScheduler.
  static constexpr bool chainable = true;

  ExponentialLR(torch::optim::Optimizer& opt, double gamma) : PythonScheduler(opt), gamma_(gamma) {
    initial_step();
  }

  std::vector<double> get_lr() const {
    auto lrs = current();
    if (is_initial()) return lrs;
    for (auto& lr : lrs) lr *= gamma_;
    return lrs;
  }
  std::vector<double> closed_form_lr() const {
    std::vector<double> out;
    for (double b : base_lrs())
      out.push_back(b * std::pow(gamma_, static_cast<double>(last_epoch())));
    return out;
  }
  void save_own(SchedulerState& s) const { s.insert("gamma", gamma_); }
  void load_own(state::Reader& r) { gamma_ = r.number("gamma"); }

 private:
  double gamma_;
};

}  // namespace loom::optim
