#pragma once
// loom::optim::OneCycleLR: Python's torch.optim.lr_scheduler.OneCycleLR, momentum cycled through
// loom's optimizer table (optim/lr_scheduler_base.hpp).
#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>
#include <utility>
#include <vector>

#include <torch/optim/optimizer.h>

#include <loom/error.hpp>
#include <loom/optim/lr_scheduler_base.hpp>
#include <loom/optim/optimizer_table.hpp>
#include <loom/optim/optimizer_traits.hpp>
#include <loom/state_reader.hpp>

namespace loom::optim {

/// OneCycleLR's settings, with Python's names and defaults. `max_lr` has one value for every
/// param group, or one for all; so do the momenta.
struct OneCycleOptions {
  std::vector<double> max_lr;
  int64_t total_steps = 0;
  double pct_start = 0.3;
  std::string anneal_strategy = "cos";  // or "linear"
  bool cycle_momentum = true;
  std::vector<double> base_momentum = {0.85};
  std::vector<double> max_momentum = {0.95};
  double div_factor = 25.0;
  double final_div_factor = 1e4;
  bool three_phase = false;
};

/// The 1cycle policy, as `torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr, total_steps,
/// ...)`: lr from max_lr/div_factor up to max_lr and down to initial/final_div_factor, with
/// momentum (SGD's momentum, Adam's beta1) cycled the other way. Python keeps initial_lr,
/// max_lr, min_lr, max_momentum and base_momentum in the optimizer's param groups; loom keeps
/// them here, computed from the options (as Python's constructor does).
class OneCycleLR : public detail::PythonScheduler<OneCycleLR> {
 public:
  static constexpr const char* python_name = "OneCycleLR";

  OneCycleLR(torch::optim::Optimizer& opt, const OneCycleOptions& o)
      : PythonScheduler(opt, initial_lrs(opt, o)), total_(o.total_steps) {
    const auto n = opt.param_groups().size();
    if (o.pct_start < 0 || o.pct_start > 1) {
      throw Error("loom::optim::OneCycleLR: Expected float between 0 and 1 pct_start, but got " +
                  std::to_string(o.pct_start));
    }
    if (o.anneal_strategy != "cos" && o.anneal_strategy != "linear") {
      throw Error(
          "loom::optim::OneCycleLR: anneal_strategy must be one of 'cos' or 'linear', "
          "instead got " +
          o.anneal_strategy);
    }
    const double total = static_cast<double>(total_);
    if (o.three_phase) {
      phases_ = {
          {o.pct_start * total - 1, false, "initial_lr", "max_lr", "max_momentum", "base_momentum"},
          {2 * o.pct_start * total - 2, false, "max_lr", "initial_lr", "base_momentum",
           "max_momentum"},
          {total - 1, true, "initial_lr", "min_lr", "max_momentum", "max_momentum"}};
    } else {
      phases_ = {
          {o.pct_start * total - 1, false, "initial_lr", "max_lr", "max_momentum", "base_momentum"},
          {total - 1, true, "max_lr", "min_lr", "base_momentum", "max_momentum"}};
    }
    cos_ = o.anneal_strategy == "cos";
    const auto max_lrs = per_group("max_lr", o.max_lr, n);
    for (std::size_t i = 0; i < n; ++i) {
      groups_.push_back({base_lrs()[i], max_lrs[i], base_lrs()[i] / o.final_div_factor, 0, 0});
    }
    cycle_momentum_ = o.cycle_momentum;
    if (cycle_momentum_) {
      const auto kind = momentum_kind(opt);
      if (kind == MomentumKind::None) {
        throw Error(
            "loom::optim::OneCycleLR: optimizer must support momentum or beta1 with "
            "`cycle_momentum` option enabled");
      }
      use_beta1_ = kind == MomentumKind::Beta1;
      const auto maxm = per_group("max_momentum", o.max_momentum, n);
      const auto basem = per_group("base_momentum", o.base_momentum, n);
      for (std::size_t i = 0; i < n; ++i) {
        groups_[i].max_momentum = maxm[i];
        groups_[i].base_momentum = basem[i];
        set_momentum(opt.param_groups()[i].options(), maxm[i]);
      }
    }
    initial_step();
  }

  std::vector<double> get_lr() const {
    const auto step_num = last_epoch();
    if (step_num > total_) {
      throw Error("loom::optim::OneCycleLR: Tried to step " + std::to_string(step_num) +
                  " times. The specified number of total steps is " + std::to_string(total_));
    }
    std::vector<double> lrs;
    auto& groups = optimizer().param_groups();
    for (std::size_t g = 0; g < groups.size(); ++g) {
      double start_step = 0.0, lr = 0.0, momentum = 0.0;
      for (std::size_t i = 0; i < phases_.size(); ++i) {
        const auto& ph = phases_[i];
        if (static_cast<double>(step_num) <= ph.end_step || i + 1 == phases_.size()) {
          const double pct =
              (static_cast<double>(step_num) - start_step) / (ph.end_step - start_step);
          lr = anneal(value(g, ph.start_lr), value(g, ph.end_lr), pct);
          if (cycle_momentum_) {
            momentum = anneal(value(g, ph.start_momentum), value(g, ph.end_momentum), pct);
          }
          break;
        }
        start_step = ph.end_step;
      }
      lrs.push_back(lr);
      if (cycle_momentum_) set_momentum(groups[g].options(), momentum);
    }
    return lrs;
  }
  void save_own(SchedulerState& s) const {
    s.insert("total_steps", total_);
    c10::impl::GenericList phases(c10::AnyType::get());
    for (const auto& ph : phases_) {
      SchedulerState d = detail::new_state();
      if (ph.end_is_int) {
        d.insert("end_step", static_cast<int64_t>(ph.end_step));
      } else {
        d.insert("end_step", ph.end_step);
      }
      d.insert("start_lr", ph.start_lr);
      d.insert("end_lr", ph.end_lr);
      d.insert("start_momentum", ph.start_momentum);
      d.insert("end_momentum", ph.end_momentum);
      phases.push_back(d);
    }
    s.insert("_schedule_phases", phases);
    s.insert("_anneal_func_type", std::string(cos_ ? "cos" : "linear"));
    s.insert("cycle_momentum", cycle_momentum_);
    if (cycle_momentum_) s.insert("use_beta1", use_beta1_);
  }
  void load_own(state::Reader& r) {
    std::vector<Phase> phases;
    for (auto& p : r.children("_schedule_phases")) {
      Phase ph{p.number("end_step"), p.value("end_step").isInt(), p.string("start_lr"),
               p.string("end_lr"),   p.string("start_momentum"),  p.string("end_momentum")};
      for (const auto& [key, name] :
           {std::pair<const char*, const std::string*>{"start_lr", &ph.start_lr},
            {"end_lr", &ph.end_lr},
            {"start_momentum", &ph.start_momentum},
            {"end_momentum", &ph.end_momentum}}) {
        if (!known(*name)) p.fail(key, "unknown schedule value \"" + *name + "\"");
      }
      phases.push_back(std::move(ph));
    }
    if (phases.empty()) r.fail("_schedule_phases", "expected at least one phase, got none");
    const auto anneal = r.string("_anneal_func_type");
    if (anneal != "cos" && anneal != "linear") {
      r.fail("_anneal_func_type", "expected \"cos\" or \"linear\", got \"" + anneal + "\"");
    }
    const bool cycle = r.boolean("cycle_momentum");
    if (cycle && !cycle_momentum_) {
      r.fail("cycle_momentum",
             "the state cycles momentum; this scheduler was made without cycle_momentum, so it "
             "has no momentum values");
    }
    total_ = r.integer("total_steps");
    phases_ = std::move(phases);
    cos_ = anneal == "cos";
    cycle_momentum_ = cycle;
    if (cycle) use_beta1_ = r.boolean("use_beta1");
  }

 private:
  struct Phase {
    double end_step;
    bool end_is_int;  // Python writes the last phase's end_step as an int
    std::string start_lr, end_lr, start_momentum, end_momentum;
  };
  struct GroupValues {
    double initial_lr, max_lr, min_lr, max_momentum, base_momentum;
  };

  // Writes a group's momentum option (SGD's momentum, Adam's beta1; loom's optimizer table
  // knows which).
  void set_momentum(torch::optim::OptimizerOptions& o, double value) const {
    if (double* m = detail::group_momentum(find_optimizer(optimizer()), o)) *m = value;
  }

  static std::vector<double> per_group(const char* name, const std::vector<double>& v,
                                       std::size_t n) {
    if (v.size() == 1) return std::vector<double>(n, v[0]);
    if (v.size() != n) {
      throw Error(std::string("loom::optim::OneCycleLR: expected ") + std::to_string(n) +
                  " values for " + name + ", got " + std::to_string(v.size()));
    }
    return v;
  }
  static std::vector<double> initial_lrs(torch::optim::Optimizer& opt, const OneCycleOptions& o) {
    if (o.total_steps <= 0) {
      throw Error("loom::optim::OneCycleLR: Expected positive integer total_steps, but got " +
                  std::to_string(o.total_steps));
    }
    auto max_lrs = per_group("max_lr", o.max_lr, opt.param_groups().size());
    for (auto& m : max_lrs) m /= o.div_factor;
    return max_lrs;
  }
  static bool known(const std::string& name) {
    for (const char* k : {"initial_lr", "max_lr", "min_lr", "max_momentum", "base_momentum"}) {
      if (name == k) return true;
    }
    return false;
  }
  double value(std::size_t g, const std::string& name) const {
    const auto& v = groups_[g];
    if (name == "initial_lr") return v.initial_lr;
    if (name == "max_lr") return v.max_lr;
    if (name == "min_lr") return v.min_lr;
    if (name == "max_momentum") return v.max_momentum;
    return v.base_momentum;
  }
  double anneal(double start, double end, double pct) const {
    if (cos_) {
      const double cos_out = std::cos(std::numbers::pi * pct) + 1;
      return end + (start - end) / 2.0 * cos_out;
    }
    return (end - start) * pct + start;
  }

  int64_t total_;
  std::vector<Phase> phases_;
  std::vector<GroupValues> groups_;
  bool cos_ = true, cycle_momentum_ = true, use_beta1_ = false;
};

}  // namespace loom::optim
