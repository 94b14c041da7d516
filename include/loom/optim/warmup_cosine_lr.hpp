#pragma once
// loom::optim::WarmupCosineLR: linear warm-up then cosine annealing, Python's SequentialLR of
// LinearLR and CosineAnnealingLR (optim/lr_scheduler_base.hpp).
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <torch/optim/optimizer.h>

#include <loom/error.hpp>
#include <loom/optim/cosine_annealing_lr.hpp>
#include <loom/optim/linear_lr.hpp>
#include <loom/optim/lr_scheduler_base.hpp>
#include <loom/state_reader.hpp>

namespace loom::optim {

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
    state::Reader r("loom::optim::WarmupCosineLR::load_state_dict", state);
    auto milestones = r.list("_milestones");
    if (milestones.size() != 1 || !milestones[0].isInt()) {
      r.fail("_milestones", "expected one int (the warm-up length)");
    }
    auto children = r.children("_schedulers");
    if (children.size() != 2) {
      r.fail("_schedulers", "expected two states (LinearLR, CosineAnnealingLR), got " +
                                std::to_string(children.size()));
    }
    auto last = detail::group_numbers(r, "_last_lr", opt_->param_groups().size());
    const auto epoch = r.integer("last_epoch");
    warmup_.load_from(children[0]);
    cosine_.load_from(children[1]);
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

}  // namespace loom::optim
