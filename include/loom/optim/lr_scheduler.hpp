#pragma once
// loom::optim learning-rate schedulers: StepLR, MultiStepLR, LinearLR, CosineAnnealingLR,
// WarmupCosineLR (linear warm-up, then cosine annealing) and OneCycleLR.
//
// Each gives the learning rates of Python's torch.optim.lr_scheduler class of the same name
// step for step (the same double arithmetic, in the same order), has a state_dict in Python's
// layout, and takes the runtime's StepResult: step(result) advances only when the optimizer
// step was applied, without forcing a host sync (docs/optim.md, "Learning-rate schedulers").
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <numbers>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <loom/error.hpp>
#include <loom/optim/adam.hpp>
#include <loom/optim/sgd.hpp>
#include <loom/step_result.hpp>

namespace loom::optim {

/// A scheduler's state as Python's `scheduler.state_dict()`: the same keys, with the same
/// kinds of values (int, float, bool, str, lists, nested dicts). Save it with
/// `torch::pickle_save`; `load_state_dict` also takes the dict of a Python checkpoint.
using SchedulerState = c10::impl::GenericDict;

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

/// Which of Python's momentum hyper-parameters an optimizer's options have: `momentum` (SGD,
/// RMSprop) or `betas[0]` (Adam, AdamW), for loom's and LibTorch's optimizers.
enum class MomentumKind { none, momentum, beta1 };

template <class... Options>
inline const torch::optim::OptimizerOptions* first_of(const torch::optim::OptimizerOptions& o) {
  const torch::optim::OptimizerOptions* hit = nullptr;
  ((hit = hit ? hit : dynamic_cast<const Options*>(&o)), ...);
  return hit;
}

inline MomentumKind momentum_kind(const torch::optim::OptimizerOptions& o) {
  if (first_of<SGDOptions, torch::optim::SGDOptions, torch::optim::RMSpropOptions>(o)) {
    return MomentumKind::momentum;
  }
  if (first_of<AdamOptions, AdamWOptions, torch::optim::AdamOptions, torch::optim::AdamWOptions>(
          o)) {
    return MomentumKind::beta1;
  }
  return MomentumKind::none;
}

/// Reads (`value` null) or writes a group's momentum or beta1; false if it has neither.
template <class O>
bool access_momentum(torch::optim::OptimizerOptions& o, double* out, const double* in) {
  auto* t = dynamic_cast<O*>(&o);
  if (t == nullptr) return false;
  if constexpr (requires { t->betas(); }) {
    auto betas = t->betas();
    if (out) *out = std::get<0>(betas);
    if (in) t->betas(std::make_tuple(*in, std::get<1>(betas)));
  } else {
    if (out) *out = t->momentum();
    if (in) t->momentum(*in);
  }
  return true;
}

inline bool access_momentum(torch::optim::OptimizerOptions& o, double* out, const double* in) {
  return access_momentum<SGDOptions>(o, out, in) ||
         access_momentum<torch::optim::SGDOptions>(o, out, in) ||
         access_momentum<torch::optim::RMSpropOptions>(o, out, in) ||
         access_momentum<AdamOptions>(o, out, in) || access_momentum<AdamWOptions>(o, out, in) ||
         access_momentum<torch::optim::AdamOptions>(o, out, in) ||
         access_momentum<torch::optim::AdamWOptions>(o, out, in);
}

/// Every group's lr and momentum (NaN where it has none): what a scheduler step may change.
struct GroupHypers {
  std::vector<double> lr, momentum;

  static GroupHypers of(torch::optim::Optimizer& opt) {
    GroupHypers h;
    for (auto& g : opt.param_groups()) {
      double m = std::nan("");
      access_momentum(g.options(), &m, nullptr);
      h.lr.push_back(g.options().get_lr());
      h.momentum.push_back(m);
    }
    return h;
  }
  void restore(torch::optim::Optimizer& opt) const {
    auto& groups = opt.param_groups();
    for (std::size_t i = 0; i < groups.size() && i < lr.size(); ++i) {
      groups[i].options().set_lr(lr[i]);
      if (!std::isnan(momentum[i])) access_momentum(groups[i].options(), nullptr, &momentum[i]);
    }
  }
};

// Reading a state dict: a Python one (every list generic, ints where Python had ints) or
// loom's own; a missing key or a value of the wrong kind is a loom::Error naming both.
class StateReader {
 public:
  StateReader(const c10::IValue& state, std::string who) : who_(std::move(who)) {
    if (!state.isGenericDict()) throw Error(who_ + ": a scheduler state must be a dict");
    dict_ = state.toGenericDict();
  }
  const c10::IValue& at(const std::string& key) const {
    auto it = dict_.find(c10::IValue(key));
    if (it == dict_.end()) throw Error(who_ + ": the state dict has no '" + key + "'");
    return it->value();
  }
  bool has(const std::string& key) const { return dict_.contains(c10::IValue(key)); }
  double number(const std::string& key) const { return as_number(at(key), key); }
  int64_t integer(const std::string& key) const {
    const auto& v = at(key);
    if (!v.isInt()) throw bad(key, "an int");
    return v.toInt();
  }
  bool boolean(const std::string& key) const {
    const auto& v = at(key);
    if (!v.isBool()) throw bad(key, "a bool");
    return v.toBool();
  }
  std::string string(const std::string& key) const {
    const auto& v = at(key);
    if (!v.isString()) throw bad(key, "a str");
    return v.toStringRef();
  }
  std::vector<double> numbers(const std::string& key, std::size_t n) const {
    std::vector<double> out;
    for (const auto& v : list(key)) out.push_back(as_number(v, key));
    if (out.size() != n) {
      throw Error(who_ + ": '" + key + "' has " + std::to_string(out.size()) + " values for " +
                  std::to_string(n) + " param groups");
    }
    return out;
  }
  std::vector<c10::IValue> list(const std::string& key) const {
    const auto& v = at(key);
    if (!v.isList()) throw bad(key, "a list");
    auto l = v.toListRef();
    return std::vector<c10::IValue>(l.begin(), l.end());
  }
  const std::string& who() const noexcept { return who_; }

 private:
  double as_number(const c10::IValue& v, const std::string& key) const {
    if (v.isDouble()) return v.toDouble();
    if (v.isInt()) return static_cast<double>(v.toInt());
    throw bad(key, "a number");
  }
  Error bad(const std::string& key, const char* what) const {
    return Error(who_ + ": the state dict's '" + key + "' is not " + what);
  }
  std::string who_;
  c10::impl::GenericDict dict_{c10::StringType::get(), c10::AnyType::get()};
};

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
  void load_state(const c10::IValue& state) {
    StateReader r(state, std::string("loom::optim::") + Derived::python_name);
    const auto n = opt_->param_groups().size();
    auto base = r.numbers("base_lrs", n);
    auto last = r.numbers("_last_lr", n);
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

/// Multiplies each group's lr by `gamma` every `step_size` positions, as
/// `torch.optim.lr_scheduler.StepLR(optimizer, step_size, gamma)`.
class StepLR : public detail::PythonScheduler<StepLR> {
 public:
  static constexpr const char* python_name = "StepLR";

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
  void load_own(const detail::StateReader& r) {
    step_size_ = r.integer("step_size");
    gamma_ = r.number("gamma");
  }

 private:
  int64_t step_size_;
  double gamma_;
};

/// Multiplies each group's lr by `gamma` at every milestone (a milestone given n times: by
/// gamma^n), as `torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones, gamma)`.
class MultiStepLR : public detail::PythonScheduler<MultiStepLR> {
 public:
  static constexpr const char* python_name = "MultiStepLR";

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
  void load_own(const detail::StateReader& r) {
    const auto& v = r.at("milestones");
    if (!v.isGenericDict()) throw Error(r.who() + ": the state dict's 'milestones' is not a dict");
    std::vector<std::pair<int64_t, int64_t>> counts;
    for (const auto& e : v.toGenericDict()) {
      if (!e.key().isInt() || !e.value().isInt()) {
        throw Error(r.who() + ": 'milestones' must map ints to counts");
      }
      counts.emplace_back(e.key().toInt(), e.value().toInt());
    }
    counts_ = std::move(counts);
    gamma_ = r.number("gamma");
  }

 private:
  std::vector<std::pair<int64_t, int64_t>> counts_;  // insertion order, as Python's Counter
  double gamma_;
};

/// Scales each group's lr linearly from `start_factor` to `end_factor` over `total_iters`
/// positions, as `torch.optim.lr_scheduler.LinearLR`.
class LinearLR : public detail::PythonScheduler<LinearLR> {
 public:
  static constexpr const char* python_name = "LinearLR";

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
  void load_own(const detail::StateReader& r) {
    start_ = r.number("start_factor");
    end_ = r.number("end_factor");
    total_ = r.integer("total_iters");
  }

 private:
  double start_, end_;
  int64_t total_;
};

/// Cosine annealing from each group's lr to `eta_min` over `t_max` positions, by Python's
/// recursive formula, as `torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max,
/// eta_min)`.
class CosineAnnealingLR : public detail::PythonScheduler<CosineAnnealingLR> {
 public:
  static constexpr const char* python_name = "CosineAnnealingLR";

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
  void load_own(const detail::StateReader& r) {
    t_max_ = r.integer("T_max");
    eta_min_ = r.number("eta_min");
  }

 private:
  int64_t t_max_;
  double eta_min_;
};

/// WarmupCosineLR's settings: `warmup_steps` positions of linear warm-up from
/// `warmup_start_factor` × lr to lr, then cosine annealing to `eta_min` until `total_steps`.
struct WarmupCosineOptions {
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;
  double warmup_start_factor = 1.0 / 3;
  double eta_min = 0.0;
};

/// Linear warm-up, then cosine annealing: exactly Python's
///   SequentialLR(opt, [LinearLR(opt, start_factor=warmup_start_factor, end_factor=1.0,
///                               total_iters=warmup_steps),
///                      CosineAnnealingLR(opt, T_max=total_steps - warmup_steps,
///                                        eta_min=eta_min)],
///                milestones=[warmup_steps])
/// values and state_dict (SequentialLR's layout, with both schedulers' states).
class WarmupCosineLR : public LRScheduler<WarmupCosineLR> {
 public:
  static constexpr const char* python_name = "SequentialLR";

  WarmupCosineLR(torch::optim::Optimizer& opt, const WarmupCosineOptions& o)
      : opt_(&opt),
        initial_(detail::group_lrs(opt)),
        warmup_(opt, o.warmup_start_factor, 1.0, checked(o).warmup_steps, initial_),
        cosine_(opt, o.total_steps - o.warmup_steps, o.eta_min, initial_),
        milestone_(o.warmup_steps) {
    // SequentialLR.__init__: back to the initial lrs, undo both initial steps, then the
    // initial step of the scheduler that runs at position 0 (the warm-up).
    detail::set_group_lrs(opt, initial_);
    warmup_.undo_epoch();
    cosine_.undo_epoch();
    warmup_.initial_step();
    last_lr_ = warmup_.last_lr();
  }

  torch::optim::Optimizer& optimizer() const noexcept { return *opt_; }
  int64_t last_epoch() const noexcept { return last_epoch_; }
  const std::vector<double>& last_lr() const noexcept { return last_lr_; }

  void advance() {
    ++last_epoch_;
    if (last_epoch_ < milestone_) {
      warmup_.advance();
      last_lr_ = warmup_.last_lr();
    } else {
      if (last_epoch_ == milestone_) {
        cosine_.update_lr(0);
      } else {
        cosine_.advance();
      }
      last_lr_ = cosine_.last_lr();
    }
  }
  SchedulerState save_state() const {
    SchedulerState s = detail::new_state();
    s.insert("_milestones", c10::List<int64_t>({milestone_}));
    s.insert("last_epoch", last_epoch_);
    s.insert("_last_lr", detail::double_list(last_lr_));
    c10::impl::GenericList children(c10::AnyType::get());
    children.push_back(warmup_.save_state());
    children.push_back(cosine_.save_state());
    s.insert("_schedulers", children);
    return s;
  }
  void load_state(const c10::IValue& state) {
    detail::StateReader r(state, "loom::optim::WarmupCosineLR");
    auto milestones = r.list("_milestones");
    if (milestones.size() != 1 || !milestones[0].isInt()) {
      throw Error(
          "loom::optim::WarmupCosineLR: '_milestones' must hold one int (the warm-up "
          "length)");
    }
    auto children = r.list("_schedulers");
    if (children.size() != 2) {
      throw Error(
          "loom::optim::WarmupCosineLR: '_schedulers' must hold two states (LinearLR, "
          "CosineAnnealingLR), got " +
          std::to_string(children.size()));
    }
    auto last = r.numbers("_last_lr", opt_->param_groups().size());
    const auto epoch = r.integer("last_epoch");
    warmup_.load_state(children[0]);
    cosine_.load_state(children[1]);
    milestone_ = milestones[0].toInt();
    last_lr_ = std::move(last);
    last_epoch_ = epoch;
  }

 private:
  static const WarmupCosineOptions& checked(const WarmupCosineOptions& o) {
    if (o.warmup_steps < 1 || o.total_steps <= o.warmup_steps) {
      throw Error(
          "loom::optim::WarmupCosineLR: needs 1 <= warmup_steps < total_steps, got "
          "warmup_steps " +
          std::to_string(o.warmup_steps) + " and total_steps " + std::to_string(o.total_steps));
    }
    return o;
  }

  torch::optim::Optimizer* opt_;
  std::vector<double> initial_;
  LinearLR warmup_;
  CosineAnnealingLR cosine_;
  int64_t milestone_;
  int64_t last_epoch_ = 0;
  std::vector<double> last_lr_;
};

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
      const auto kind = detail::momentum_kind(opt.defaults());
      if (kind == detail::MomentumKind::none) {
        throw Error(
            "loom::optim::OneCycleLR: optimizer must support momentum or beta1 with "
            "`cycle_momentum` option enabled");
      }
      use_beta1_ = kind == detail::MomentumKind::beta1;
      const auto maxm = per_group("max_momentum", o.max_momentum, n);
      const auto basem = per_group("base_momentum", o.base_momentum, n);
      for (std::size_t i = 0; i < n; ++i) {
        groups_[i].max_momentum = maxm[i];
        groups_[i].base_momentum = basem[i];
        detail::access_momentum(opt.param_groups()[i].options(), nullptr, &maxm[i]);
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
      if (cycle_momentum_) detail::access_momentum(groups[g].options(), nullptr, &momentum);
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
  void load_own(const detail::StateReader& r) {
    std::vector<Phase> phases;
    for (const auto& v : r.list("_schedule_phases")) {
      detail::StateReader p(v, r.who());
      Phase ph{p.number("end_step"), p.at("end_step").isInt(),   p.string("start_lr"),
               p.string("end_lr"),   p.string("start_momentum"), p.string("end_momentum")};
      for (const auto* name : {&ph.start_lr, &ph.end_lr, &ph.start_momentum, &ph.end_momentum}) {
        if (!known(*name)) throw Error(r.who() + ": unknown schedule value '" + *name + "'");
      }
      phases.push_back(std::move(ph));
    }
    if (phases.empty()) throw Error(r.who() + ": '_schedule_phases' is empty");
    const auto anneal = r.string("_anneal_func_type");
    if (anneal != "cos" && anneal != "linear") {
      throw Error(r.who() + ": unknown _anneal_func_type '" + anneal + "'");
    }
    const bool cycle = r.boolean("cycle_momentum");
    if (cycle && !cycle_momentum_) {
      throw Error(r.who() +
                  ": the state cycles momentum; this scheduler was made without "
                  "cycle_momentum, so it has no momentum values");
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
