#pragma once
// loom::optim::LinearLR: Python's torch.optim.lr_scheduler.LinearLR (optim/lr_scheduler_base.hpp).
#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include <torch/optim/optimizer.h>

#include <loom/error.hpp>
#include <loom/optim/lr_scheduler_base.hpp>
#include <loom/state_reader.hpp>

namespace loom::optim {

/// Scales each group's lr linearly from `start_factor` to `end_factor` over `total_iters`
/// positions, as `torch.optim.lr_scheduler.LinearLR`.
class LinearLR : public detail::PythonScheduler<LinearLR> {
 public:
  static constexpr const char* python_name = "LinearLR";
  /// Its lrs follow from the groups\' current lrs: it may follow others in a ChainedScheduler.
  static constexpr bool chainable = true;

  LinearLR(torch::optim::Optimizer& opt, double start_factor = 1.0 / 3, double end_factor = 1.0,
           int64_t total_iters = 5, std::optional<std::vector<double>> initial_lrs = std::nullopt)
      : PythonScheduler(opt, std::move(initial_lrs)),
        start_(start_factor),
        end_(end_factor),
        total_(total_iters) {
    if (start_factor > 1.0 || start_factor <= 0) {
      throw Error(
          "loom::optim::LinearLR: Starting multiplicative factor expected to be greater than 0 "
          "and less or equal to 1.");
    }
    if (end_factor > 1.0 || end_factor < 0) {
      throw Error(
          "loom::optim::LinearLR: Ending multiplicative factor expected to be between 0 "
          "and 1.");
    }
    if (total_iters <= 0) throw Error("loom::optim::LinearLR: total_iters must be positive");
    initial_step();
  }

  std::vector<double> get_lr() const {
    auto lrs = current();
    if (last_epoch() == 0) {
      for (auto& lr : lrs) lr *= start_;
      return lrs;
    }
    if (is_initial() || last_epoch() > total_) return lrs;
    const double f =
        1.0 + (end_ - start_) / (static_cast<double>(total_) * start_ +
                                 static_cast<double>(last_epoch() - 1) * (end_ - start_));
    for (auto& lr : lrs) lr *= f;
    return lrs;
  }
  std::vector<double> closed_form_lr() const {
    std::vector<double> out;
    const auto t = static_cast<double>(std::min(total_, last_epoch()));
    for (double b : base_lrs()) {
      out.push_back(b * (start_ + (end_ - start_) * t / static_cast<double>(total_)));
    }
    return out;
  }
  void save_own(SchedulerState& s) const {
    s.insert("start_factor", start_);
    s.insert("end_factor", end_);
    s.insert("total_iters", total_);
  }
  void load_own(state::Reader& r) {
    start_ = r.number("start_factor");
    end_ = r.number("end_factor");
    total_ = r.integer("total_iters");
  }

 private:
  double start_, end_;
  int64_t total_;
};

}  // namespace loom::optim
