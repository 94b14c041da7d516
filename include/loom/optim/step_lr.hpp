#pragma once
// loom::optim::StepLR: Python's torch.optim.lr_scheduler.StepLR (optim/lr_scheduler_base.hpp).
#include <cmath>
#include <cstdint>
#include <vector>

#include <torch/optim/optimizer.h>

#include <loom/error.hpp>
#include <loom/optim/lr_scheduler_base.hpp>
#include <loom/state_reader.hpp>

namespace loom::optim {

/// Multiplies each group's lr by `gamma` every `step_size` positions, as
/// `torch.optim.lr_scheduler.StepLR(optimizer, step_size, gamma)`.
class StepLR : public detail::PythonScheduler<StepLR> {
 public:
  static constexpr const char* python_name = "StepLR";
  /// Its lrs follow from the groups\' current lrs: it may follow others in a ChainedScheduler.
  static constexpr bool chainable = true;

  StepLR(torch::optim::Optimizer& opt, int64_t step_size, double gamma = 0.1)
      : PythonScheduler(opt), step_size_(step_size), gamma_(gamma) {
    if (step_size <= 0) throw Error("loom::optim::StepLR: step_size must be positive");
    initial_step();
  }

  std::vector<double> get_lr() const {
    auto lrs = current();
    if (last_epoch() == 0 || last_epoch() % step_size_ != 0) return lrs;
    for (auto& lr : lrs) lr *= gamma_;
    return lrs;
  }
  std::vector<double> closed_form_lr() const {
    std::vector<double> out;
    for (double b : base_lrs()) {
      out.push_back(b * std::pow(gamma_, static_cast<double>(last_epoch() / step_size_)));
    }
    return out;
  }
  void save_own(SchedulerState& s) const {
    s.insert("step_size", step_size_);
    s.insert("gamma", gamma_);
  }
  void load_own(state::Reader& r) {
    step_size_ = r.integer("step_size");
    gamma_ = r.number("gamma");
  }

 private:
  int64_t step_size_;
  double gamma_;
};

}  // namespace loom::optim
