#pragma once
// loom::optim::ChainedScheduler: Python's torch.optim.lr_scheduler.ChainedScheduler, the steps
// of several schedulers of one optimizer in one (optim/lr_scheduler_base.hpp).
#include <cstddef>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/core/List.h>
#include <ATen/core/ivalue.h>
#include <torch/optim/optimizer.h>

#include <loom/error.hpp>
#include <loom/optim/lr_scheduler_base.hpp>
#include <loom/state_reader.hpp>

namespace loom::optim {

namespace detail {
/// Whether scheduler S declares `static constexpr bool chainable = true`.
template <class S>
inline constexpr bool chainable = requires {
  requires S::chainable;
};
}  // namespace detail

/// Steps every scheduler it holds, in order, at each of its own steps, as
/// `torch.optim.lr_scheduler.ChainedScheduler([s1, s2, ...])`: each changes the lrs the one
/// before it left. It holds references: the schedulers must outlive it, all of one optimizer,
/// made in the chain's order. Every scheduler after the first must be chainable (its lrs follow
/// from the groups' current lrs: StepLR, MultiStepLR, LinearLR, ExponentialLR, PolynomialLR,
/// CosineAnnealingLR). As in Python, where the first scheduler made on an optimizer sets each
/// group's "initial_lr" and later ones take it as their base_lrs, the chain gives the first
/// one's base_lrs to the others. Skipped steps are handled once, here (`step(result)`): give
/// the held schedulers no steps of their own. Its state_dict is Python's (`_last_lr`, then
/// `_schedulers` with each state).
///
///   loom::optim::LinearLR warm(opt, 0.1, 1.0, 10);
///   loom::optim::ExponentialLR decay(opt, 0.99);
///   loom::optim::ChainedScheduler sched(warm, decay);
///   sched.step(rt.optimizer_step(opt));
template <class First, class... Rest>
class ChainedScheduler : public LRScheduler<ChainedScheduler<First, Rest...>> {
  static_assert(
      requires(First & f) { f.base_lrs(); },
      "loom::optim::ChainedScheduler: the first scheduler must have base_lrs() (a "
      "scheduler of Python's LRScheduler family)");
  static_assert((detail::chainable<Rest> && ...),
                "loom::optim::ChainedScheduler: a scheduler after the first must be chainable "
                "(StepLR, MultiStepLR, LinearLR, ExponentialLR, PolynomialLR, CosineAnnealingLR)");

 public:
  static constexpr const char* python_name = "ChainedScheduler";

  explicit ChainedScheduler(First& first, Rest&... rest)
      : schedulers_(first, rest...), opt_(&first.optimizer()) {
    std::size_t index = 0;
    auto check = [&](auto& s) {
      if (&s.optimizer() != opt_) {
        throw Error(std::string("loom::optim::ChainedScheduler expects all schedulers to belong "
                                "to the same optimizer, but got scheduler ") +
                    std::decay_t<decltype(s)>::python_name + " at index " + std::to_string(index) +
                    " with another optimizer");
      }
      ++index;
    };
    std::apply([&](auto&... s) { (check(s), ...); }, schedulers_);
    (rest.adopt_base_lrs(first.base_lrs()), ...);
    last_lr_ = detail::group_lrs(*opt_);
  }

  torch::optim::Optimizer& optimizer() const noexcept { return *opt_; }
  const std::vector<double>& last_lr() const noexcept { return last_lr_; }

  /// One position of every held scheduler, in order (Python's step()).
  void advance() {
    std::apply([](auto&... s) { (s.advance(), ...); }, schedulers_);
    last_lr_ = detail::group_lrs(*opt_);
  }

  SchedulerState save_state() const {
    SchedulerState s = detail::new_state();
    s.insert("_last_lr", detail::double_list(last_lr_));
    c10::impl::GenericList states(c10::AnyType::get());
    std::apply([&](const auto&... each) { (states.push_back(each.save_state()), ...); },
               schedulers_);
    s.insert("_schedulers", states);
    return s;
  }
  void load_state(const c10::IValue& state) {
    state::Reader r("loom::optim::ChainedScheduler::load_state_dict", state);
    auto last = detail::group_numbers(r, "_last_lr", opt_->param_groups().size());
    const auto states = r.list("_schedulers");
    if (states.size() != count) {
      r.fail("_schedulers", "holds " + std::to_string(states.size()) + " states for " +
                                std::to_string(count) + " schedulers");
    }
    std::size_t i = 0;
    std::apply([&](auto&... s) { (s.load_state(states[i++]), ...); }, schedulers_);
    last_lr_ = std::move(last);
  }

 private:
  static constexpr std::size_t count = 1 + sizeof...(Rest);

  std::tuple<First&, Rest&...> schedulers_;
  torch::optim::Optimizer* opt_;
  std::vector<double> last_lr_;
};

}  // namespace loom::optim
