#pragma once
// loom::optim::LambdaLR: Python's torch.optim.lr_scheduler.LambdaLR with C++ callables
// (optim/lr_scheduler_base.hpp).
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/List.h>
#include <ATen/core/ivalue.h>
#include <torch/optim/optimizer.h>

#include <loom/error.hpp>
#include <loom/optim/lr_scheduler_base.hpp>
#include <loom/state_reader.hpp>

namespace loom::optim {

/// Each group's lr is its initial lr times `lambda(position)`, as
/// `torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)`: one callable for every group,
/// or one per group. The callables are code, not state: the state_dict holds `None` for each,
/// as Python's does for a plain function, and loading it keeps the callables given here.
class LambdaLR : public detail::PythonScheduler<LambdaLR> {
 public:
  static constexpr const char* python_name = "LambdaLR";
  using Lambda = std::function<double(int64_t)>;

  LambdaLR(torch::optim::Optimizer& opt, Lambda lr_lambda)
      : LambdaLR(opt, std::vector<Lambda>(opt.param_groups().size(), std::move(lr_lambda))) {}
  LambdaLR(torch::optim::Optimizer& opt, std::vector<Lambda> lr_lambdas)
      : PythonScheduler(opt), lambdas_(std::move(lr_lambdas)) {
    if (lambdas_.size() != opt.param_groups().size()) {
      throw Error("loom::optim::LambdaLR: Expected " + std::to_string(opt.param_groups().size()) +
                  " lr_lambdas, but got " + std::to_string(lambdas_.size()));
    }
    for (const auto& f : lambdas_) {
      if (!f) throw Error("loom::optim::LambdaLR: an lr_lambda is empty");
    }
    initial_step();
  }

  std::vector<double> get_lr() const {
    std::vector<double> out;
    for (std::size_t i = 0; i < lambdas_.size(); ++i) {
      out.push_back(base_lrs()[i] * lambdas_[i](last_epoch()));
    }
    return out;
  }
  /// Python's state_dict(): the base's keys, then "lr_lambdas" last (None per callable).
  SchedulerState save_state() const {
    SchedulerState s = PythonScheduler::save_state();
    c10::impl::GenericList nones(c10::AnyType::get());
    for (std::size_t i = 0; i < lambdas_.size(); ++i) nones.push_back(c10::IValue());
    s.insert("lr_lambdas", nones);
    return s;
  }
  void save_own(SchedulerState&) const {}
  void load_own(state::Reader&) {}

 private:
  std::vector<Lambda> lambdas_;
};

}  // namespace loom::optim
