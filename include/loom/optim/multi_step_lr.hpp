#pragma once
// loom::optim::MultiStepLR: Python's torch.optim.lr_scheduler.MultiStepLR
// (optim/lr_scheduler_base.hpp).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <torch/optim/optimizer.h>

#include <loom/error.hpp>
#include <loom/optim/lr_scheduler_base.hpp>
#include <loom/state_reader.hpp>

namespace loom::optim {

/// Multiplies each group's lr by `gamma` at every milestone (a milestone given n times: by
/// gamma^n), as `torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones, gamma)`.
class MultiStepLR : public detail::PythonScheduler<MultiStepLR> {
 public:
  static constexpr const char* python_name = "MultiStepLR";
  /// Its lrs follow from the groups\' current lrs: it may follow others in a ChainedScheduler.
  static constexpr bool chainable = true;

  MultiStepLR(torch::optim::Optimizer& opt, const std::vector<int64_t>& milestones,
              double gamma = 0.1)
      : PythonScheduler(opt), gamma_(gamma) {
    for (auto m : milestones) {
      auto it =
          std::find_if(counts_.begin(), counts_.end(), [m](const auto& c) { return c.first == m; });
      if (it == counts_.end()) {
        counts_.emplace_back(m, 1);
      } else {
        ++it->second;
      }
    }
    initial_step();
  }

  std::vector<double> get_lr() const {
    auto lrs = current();
    for (const auto& [m, n] : counts_) {
      if (m != last_epoch()) continue;
      for (auto& lr : lrs) lr *= std::pow(gamma_, static_cast<double>(n));
    }
    return lrs;
  }
  std::vector<double> closed_form_lr() const {
    int64_t passed = 0;  // bisect_right over the sorted milestones, with repeats
    for (const auto& [m, n] : counts_) {
      if (m <= last_epoch()) passed += n;
    }
    std::vector<double> out;
    for (double b : base_lrs()) out.push_back(b * std::pow(gamma_, static_cast<double>(passed)));
    return out;
  }
  /// Python keeps the milestones as a Counter (milestone -> how often); here a dict.
  void save_own(SchedulerState& s) const {
    c10::Dict<int64_t, int64_t> m;
    for (const auto& [k, n] : counts_) m.insert(k, n);
    s.insert("milestones", m);
    s.insert("gamma", gamma_);
  }
  void load_own(state::Reader& r) {
    const std::string path = r.path("milestones");
    std::vector<std::pair<int64_t, int64_t>> counts;
    for (const auto& e : r.dict("milestones")) {
      const int64_t milestone = state::integer_of(e.key(), r.owner(), path);
      counts.emplace_back(
          milestone,
          state::integer_of(e.value(), r.owner(), state::join(path, std::to_string(milestone))));
    }
    counts_ = std::move(counts);
    gamma_ = r.number("gamma");
  }

 private:
  std::vector<std::pair<int64_t, int64_t>> counts_;  // insertion order, as Python's Counter
  double gamma_;
};

}  // namespace loom::optim
