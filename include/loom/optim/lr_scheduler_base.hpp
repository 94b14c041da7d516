#pragma once
// The base of loom::optim's learning-rate schedulers: LRScheduler (CRTP: the skipped-step
// logic, state_dict), detail::PythonScheduler (the state and step of Python's LRScheduler),
// SchedulerState (state::Dict). Their load_state_dict reads with state::Reader. Each scheduler has
// its own header; lr_scheduler.hpp includes them all.
//
// Each gives the learning rates of Python's torch.optim.lr_scheduler class of the same name
// step for step (the same double arithmetic, in the same order), has a state_dict in Python's
// layout, and takes the runtime's StepResult: step(result) advances only when the optimizer
// step was applied, without forcing a host sync (docs/optim.md, "Learning-rate schedulers").
// A group's momentum (rolled back with its lr, cycled by OneCycleLR) is found through loom's
// optimizer table, so a scheduler works on any optimizer the table knows.
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/optim/optimizer.h>

#include <loom/error.hpp>
#include <loom/optim/optimizer_table.hpp>
#include <loom/state_dict.hpp>
#include <loom/state_reader.hpp>
#include <loom/step_result.hpp>

namespace loom::optim {

/// A scheduler's state as Python's `scheduler.state_dict()`: the same keys, with the same
/// kinds of values (int, float, bool, str, lists, nested dicts). Save it with
/// `torch::pickle_save`; `load_state_dict` also takes the dict of a Python checkpoint.
using SchedulerState = state::Dict;

namespace detail {

/// An empty SchedulerState (a dict of str to any value).
inline SchedulerState new_state() {
  return SchedulerState(c10::StringType::get(), c10::AnyType::get());
}

/// Python's `a % b` for b > 0 (the result has b's sign; C++'s has a's).
constexpr int64_t py_mod(int64_t a, int64_t b) noexcept {
  const int64_t r = a % b;
  return r < 0 ? r + b : r;
}

inline std::vector<double> group_lrs(const torch::optim::Optimizer& opt) {
  std::vector<double> out;
  for (const auto& g : opt.param_groups()) out.push_back(g.options().get_lr());
  return out;
}

inline void set_group_lrs(torch::optim::Optimizer& opt, const std::vector<double>& lrs) {
  auto& groups = opt.param_groups();
  for (std::size_t i = 0; i < groups.size(); ++i) groups[i].options().set_lr(lrs[i]);
}

/// A group's momentum option (SGD's momentum, Adam's beta1) as loom's optimizer table gives
/// it, or null where the optimizer has none.
inline double* group_momentum(const OptimizerInfo* info, torch::optim::OptimizerOptions& o) {
  return info == nullptr || info->momentum_of == nullptr ? nullptr : info->momentum_of(o);
}

/// Every group's lr and momentum (NaN where it has none): what a scheduler step may change.
struct GroupHypers {
  std::vector<double> lr, momentum;

  static GroupHypers of(torch::optim::Optimizer& opt) {
    GroupHypers h;
    const OptimizerInfo* info = find_optimizer(opt);
    for (auto& g : opt.param_groups()) {
      const double* m = group_momentum(info, g.options());
      h.lr.push_back(g.options().get_lr());
      h.momentum.push_back(m == nullptr ? std::nan("") : *m);
    }
    return h;
  }
  void restore(torch::optim::Optimizer& opt) const {
    const OptimizerInfo* info = find_optimizer(opt);
    auto& groups = opt.param_groups();
    for (std::size_t i = 0; i < groups.size() && i < lr.size(); ++i) {
      groups[i].options().set_lr(lr[i]);
      double* m = group_momentum(info, groups[i].options());
      if (m != nullptr && !std::isnan(momentum[i])) *m = momentum[i];
    }
  }
};

/// The lrs (or other per-group numbers) at `key`, one per param group of `n`.
inline std::vector<double> group_numbers(state::Reader& r, std::string_view key, std::size_t n) {
  auto out = r.numbers(key);
  if (out.size() != n) {
    r.fail(key, "holds " + std::to_string(out.size()) + " values for " + std::to_string(n) +
                    " param groups");
  }
  return out;
}

inline c10::List<double> double_list(const std::vector<double>& v) {
  c10::List<double> out;
  for (double x : v) out.push_back(x);
  return out;
}

}  // namespace detail

/// What every loom scheduler offers (CRTP: `Derived` supplies the schedule).
///
/// `step()` is Python's `scheduler.step()`. `step(result)` takes what `optimizer_step`
/// returned and advances only when that step was applied. A result known on the host, or a
/// CPU tensor flag, is decided at once (reading a CPU flag is not a sync). A flag still on a
/// CUDA device is decided one step later: the scheduler assumes the step was applied, starts
/// a non-blocking copy of the flag to pinned host memory and records an event; the next
/// step()/state_dict()/settle() waits for that event only (the previous step's work, not the
/// work queued since) and, if the step was in fact skipped, rolls the schedule and the
/// groups' lr and momentum back. So on CUDA the step right after a skipped one may run one
/// schedule position ahead; the count of positions is always the count of applied steps.
template <class Derived>
class LRScheduler {
 public:
  /// Python's step(): one schedule position, whatever the optimizer step did.
  void step() {
    settle();
    self().advance();
  }

  /// One position if `result` says the optimizer step was applied (see the class comment).
  void step(const StepResult& result) {
    settle();
    if (result.known()) {
      if (result.applied()) self().advance();
      return;
    }
    const auto& flag = result.found_inf();
    if (flag.device().is_cpu()) {
      if (read_cpu_flag(flag) == 0.0f) self().advance();
      return;
    }
    if (flag.device().is_cuda()) {
      Pending p{self().save_state(), detail::GroupHypers::of(self().optimizer()),
                at::empty({1}, at::TensorOptions(at::kFloat).pinned_memory(true)),
                c10::Event(flag.device().type())};
      p.host.copy_(flag.reshape({1}), /*non_blocking=*/true);
      auto impl = c10::impl::getDeviceGuardImpl(flag.device().type());
      p.event.record(impl->getStream(flag.device()));
      self().advance();
      pending_.emplace(std::move(p));
      return;
    }
    if (result.applied()) self().advance();  // other devices: read now (one sync)
  }

  /// Decides a pending CUDA result now (waits for its event), rolling back if it was skipped.
  void settle() {
    if (!pending_) return;
    auto p = std::move(*pending_);
    pending_.reset();
    p.event.synchronize();
    if (static_cast<const float*>(p.host.const_data_ptr())[0] != 0.0f) {
      self().load_state(p.state);
      p.hypers.restore(self().optimizer());
    }
  }

  /// Whether a CUDA result still waits to be decided.
  bool pending() const noexcept { return pending_.has_value(); }

  /// The lrs of the last position, one per param group (Python's get_last_lr()).
  const std::vector<double>& get_last_lr() const noexcept { return self().last_lr(); }

  /// Python's state_dict() (a pending result is decided first, so the state is exact).
  SchedulerState state_dict() {
    settle();
    return self().save_state();
  }

  /// Python's load_state_dict(): takes loom's or Python's dict. As in Python, the groups'
  /// lrs are not touched: they come back with the optimizer's own state.
  void load_state_dict(const c10::IValue& state) {
    pending_.reset();
    self().load_state(state);
  }

 private:
  struct Pending {
    SchedulerState state;
    detail::GroupHypers hypers;
    at::Tensor host;
    c10::Event event;
  };

  static float read_cpu_flag(const at::Tensor& flag) {
    if (flag.scalar_type() != at::kFloat || flag.numel() != 1) {
      throw Error("loom::optim: a step result's found_inf must be one f32 element");
    }
    return *flag.const_data_ptr<float>();
  }

  Derived& self() noexcept { return static_cast<Derived&>(*this); }
  const Derived& self() const noexcept { return static_cast<const Derived&>(*this); }

  std::optional<Pending> pending_;
};

namespace detail {

/// The state and the step of Python's LRScheduler base class, for a schedule `Derived` that
/// supplies get_lr() (and closed_form_lr() where Python has _get_closed_form_lr), plus
/// save_own/load_own for its own keys.
template <class Derived>
class PythonScheduler : public LRScheduler<Derived> {
 public:
  torch::optim::Optimizer& optimizer() const noexcept { return *opt_; }
  int64_t last_epoch() const noexcept { return last_epoch_; }
  const std::vector<double>& base_lrs() const noexcept { return base_lrs_; }
  const std::vector<double>& last_lr() const noexcept { return last_lr_; }

  // --- used by LRScheduler and by schedulers built of others (WarmupCosineLR) ---
  void advance() {
    ++step_count_;
    update_lr(std::nullopt);
  }
  /// Python's _update_lr(epoch): the next position, or `epoch` by the closed form.
  void update_lr(std::optional<int64_t> epoch) {
    std::vector<double> values;
    if (!epoch) {
      ++last_epoch_;
      values = self().get_lr();
    } else {
      last_epoch_ = *epoch;
      if constexpr (requires(const Derived& d) { d.closed_form_lr(); }) {
        values = self().closed_form_lr();
      } else {
        values = self().get_lr();
      }
    }
    set_group_lrs(*opt_, values);
    last_lr_ = group_lrs(*opt_);
  }
  /// Python's _initial_step().
  void initial_step() {
    step_count_ = 0;
    is_initial_ = true;
    advance();
    is_initial_ = false;
  }
  void undo_epoch() noexcept { --last_epoch_; }
  /// Takes `base` as base_lrs: Python's group["initial_lr"], which the first scheduler made on
  /// an optimizer sets and every later one reads (ChainedScheduler gives the first one's to
  /// the others).
  void adopt_base_lrs(const std::vector<double>& base) { base_lrs_ = base; }

  SchedulerState save_state() const {
    SchedulerState s = detail::new_state();
    self().save_own(s);
    s.insert("base_lrs", double_list(base_lrs_));
    s.insert("last_epoch", last_epoch_);
    s.insert("_step_count", step_count_);
    s.insert("_is_initial", false);
    s.insert("_get_lr_called_within_step", false);
    s.insert("_last_lr", double_list(last_lr_));
    return s;
  }
  /// The owner of this scheduler's load errors ("loom::optim::StepLR::load_state_dict").
  static std::string load_owner() {
    return std::string("loom::optim::") + Derived::python_name + "::load_state_dict";
  }
  void load_state(const c10::IValue& state) {
    state::Reader r(load_owner(), state);
    load_from(r);
  }
  /// Reads this scheduler's keys of `r` (no finish(): a Python state holds the scheduler's
  /// whole __dict__, attributes loom keeps elsewhere or not at all, and they vary by version).
  void load_from(state::Reader& r) {
    const auto n = opt_->param_groups().size();
    auto base = group_numbers(r, "base_lrs", n);
    auto last = group_numbers(r, "_last_lr", n);
    const auto epoch = r.integer("last_epoch");
    const auto count = r.integer("_step_count");
    self().load_own(r);
    base_lrs_ = std::move(base);
    last_lr_ = std::move(last);
    last_epoch_ = epoch;
    step_count_ = count;
  }

 protected:
  /// Python's __init__ with last_epoch=-1: base_lrs are `initial` (Python's
  /// group["initial_lr"]) or else the groups' lrs now. Derived constructors call
  /// initial_step() once their own members are set.
  explicit PythonScheduler(torch::optim::Optimizer& opt,
                           std::optional<std::vector<double>> initial = std::nullopt)
      : opt_(&opt), base_lrs_(initial ? std::move(*initial) : group_lrs(opt)) {
    if (opt.param_groups().empty()) {
      throw Error(std::string("loom::optim::") + Derived::python_name +
                  ": the optimizer has no param groups");
    }
  }

  std::vector<double> current() const { return group_lrs(*opt_); }
  int64_t step_count() const noexcept { return step_count_; }
  bool is_initial() const noexcept { return is_initial_; }

 private:
  Derived& self() noexcept { return static_cast<Derived&>(*this); }
  const Derived& self() const noexcept { return static_cast<const Derived&>(*this); }

  torch::optim::Optimizer* opt_;
  std::vector<double> base_lrs_, last_lr_;
  int64_t last_epoch_ = -1, step_count_ = 0;
  bool is_initial_ = false;
};

}  // namespace detail

}  // namespace loom::optim
