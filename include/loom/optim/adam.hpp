#pragma once
// loom::optim::Adam and AdamW: Python's torch.optim.Adam / AdamW(..., fused=True), one
// at::_fused_adam_ / at::_fused_adamw_ call per (device, dtype) group, and their rows of loom's
// optimizer table. docs/optim.md
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_sub.h>
#include <ATen/ops/_fused_adam.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/serialize.h>
#include <torch/serialize/archive.h>

#include <loom/error.hpp>
#include <loom/optim/fused.hpp>
#include <loom/optim/libtorch_traits.hpp>
#include <loom/optim/optimizer_table.hpp>
#include <loom/optim/optimizer_traits.hpp>

namespace loom::optim {

namespace detail {

/// The options of Adam (Decoupled = false: weight_decay is L2, added to the gradient, default
/// 0) and AdamW (true: decoupled weight decay, default 1e-2), with Python's names and defaults.
template <bool Decoupled>
struct AdamOptionsFor : torch::optim::OptimizerCloneableOptions<AdamOptionsFor<Decoupled>> {
  using Betas = std::tuple<double, double>;
  AdamOptionsFor(double lr = 1e-3) : lr_(lr) {}  // NOLINT: implicit, as torch's options
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
  void serialize(torch::serialize::OutputArchive& archive) const override {
    _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
    _TORCH_OPTIM_SERIALIZE_TORCH_ARG(betas);
    _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
    _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
    _TORCH_OPTIM_SERIALIZE_TORCH_ARG(amsgrad);
    _TORCH_OPTIM_SERIALIZE_TORCH_ARG(maximize);
  }
  void serialize(torch::serialize::InputArchive& archive) override {
    _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
    _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(Betas, betas);
    _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
    _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
    _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, amsgrad);
    _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, maximize);
  }

  TORCH_ARG(double, lr);
  TORCH_ARG(Betas, betas) = std::make_tuple(0.9, 0.999);
  TORCH_ARG(double, eps) = 1e-8;
  TORCH_ARG(double, weight_decay) = Decoupled ? 1e-2 : 0.0;
  TORCH_ARG(bool, amsgrad) = false;
  TORCH_ARG(bool, maximize) = false;
};

}  // namespace detail

/// Adam's options (torch.optim.Adam's names and defaults).
using AdamOptions = detail::AdamOptionsFor<false>;
/// AdamW's options (torch.optim.AdamW's names and defaults: weight_decay 1e-2).
using AdamWOptions = detail::AdamOptionsFor<true>;

/// One parameter's Adam/AdamW state, as Python's fused state: `step` (f32 0-dim on the
/// parameter's device), `exp_avg`, `exp_avg_sq`, and `max_exp_avg_sq` with amsgrad.
struct AdamParamState : torch::optim::OptimizerCloneableParamState<AdamParamState> {
  void serialize(torch::serialize::OutputArchive& archive) const override {
    _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step);
    _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg);
    _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_sq);
    _TORCH_OPTIM_SERIALIZE_TORCH_ARG(max_exp_avg_sq);
  }
  void serialize(torch::serialize::InputArchive& archive) override {
    _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, step);
    _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, exp_avg);
    _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, exp_avg_sq);
    _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, max_exp_avg_sq);
  }
  TORCH_ARG(at::Tensor, step);
  TORCH_ARG(at::Tensor, exp_avg);
  TORCH_ARG(at::Tensor, exp_avg_sq);
  TORCH_ARG(at::Tensor, max_exp_avg_sq);
};

namespace detail {

/// Adam (Decoupled = false) or AdamW (true) on the fused kernels.
template <class Options, bool Decoupled>
class AdamLike : public FusedOptimizer {
 public:
  /// Enters the optimizer in loom's optimizer table (the first time).
  AdamLike(const std::vector<torch::optim::OptimizerParamGroup>& groups, Options defaults)
      : FusedOptimizer(groups, std::make_unique<Options>(defaults)) {
    register_optimizer<AdamLike>();
    this->template check_options<Options>(check);
  }
  AdamLike(std::vector<at::Tensor> params, Options defaults)
      : AdamLike({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

  /// torch::save / torch::load of the optimizer: options of every group and each
  /// parameter's state, in LibTorch's optimizer archive layout.
  void save(torch::serialize::OutputArchive& archive) const override {
    torch::optim::serialize<AdamParamState, Options>(archive, *this);
  }
  void load(torch::serialize::InputArchive& archive) override {
    torch::optim::serialize<AdamParamState, Options>(archive, *this);
  }

  using torch::optim::Optimizer::step;
  at::Tensor step(LossClosure closure = nullptr) override {
    check_options<Options>(check);  // options may have changed since construction
    return run_step<Options>(
        closure, name(),
        [this](const Options& o, Bucket& b, const at::Tensor* lr) { step_bucket(o, b, lr); });
  }

 private:
  static constexpr const char* name() { return Decoupled ? "AdamW" : "Adam"; }

  static void check(const Options& o) {
    auto fail = [](const std::string& what) {
      throw Error(std::string("loom::optim::") + name() + ": " + what);
    };
    const auto [beta1, beta2] = o.betas();
    if (o.lr() < 0) fail("Invalid learning rate: " + std::to_string(o.lr()));
    if (o.eps() < 0) fail("Invalid epsilon value: " + std::to_string(o.eps()));
    if (beta1 < 0 || beta1 >= 1)
      fail("Invalid beta parameter at index 0: " + std::to_string(beta1));
    if (beta2 < 0 || beta2 >= 1)
      fail("Invalid beta parameter at index 1: " + std::to_string(beta2));
    if (o.weight_decay() < 0)
      fail("Invalid weight_decay value: " + std::to_string(o.weight_decay()));
  }

  void step_bucket(const Options& o, Bucket& b, const at::Tensor* lr) {
    auto amp = amp_on(b.device);
    const std::size_t n = b.params.size();
    std::vector<at::Tensor> exp_avgs, exp_avg_sqs, max_sqs, steps;
    exp_avgs.reserve(n);
    exp_avg_sqs.reserve(n);
    steps.reserve(n);
    for (auto& p : b.params) {
      auto& s = state_for<AdamParamState>(p, [&] {
        auto st = std::make_unique<AdamParamState>();
        st->step(at::zeros({}, p.options().dtype(c10::kFloat)));
        st->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        st->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        return st;
      });
      if (o.amsgrad() && !s.max_exp_avg_sq().defined()) {
        s.max_exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
      }
      steps.push_back(s.step());
      exp_avgs.push_back(s.exp_avg());
      exp_avg_sqs.push_back(s.exp_avg_sq());
      if (o.amsgrad()) max_sqs.push_back(s.max_exp_avg_sq());
    }
    const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
    at::_foreach_add_(steps, 1);
    auto fused = [&](const auto& rate) {  // a host double, or the group's lr tensor
      if constexpr (Decoupled) {
        at::_fused_adamw_(b.params, b.grads, exp_avgs, exp_avg_sqs, max_sqs, steps, rate, beta1,
                          beta2, o.weight_decay(), o.eps(), o.amsgrad(), o.maximize(),
                          amp.grad_scale, amp.found_inf);
      } else {
        at::_fused_adam_(b.params, b.grads, exp_avgs, exp_avg_sqs, max_sqs, steps, rate, beta1,
                         beta2, o.weight_decay(), o.eps(), o.amsgrad(), o.maximize(),
                         amp.grad_scale, amp.found_inf);
      }
    };
    if (lr != nullptr) {
      fused(*lr);
    } else {
      fused(o.lr());
    }
    if (amp.found_inf) {  // a skipped step does not count (on the device: no sync)
      at::_foreach_sub_(steps, std::vector<at::Tensor>(n, *amp.found_inf));
    }
  }
};

}  // namespace detail

/// Adam, as `torch.optim.Adam(params, lr, betas, eps, weight_decay, amsgrad, maximize=...,
/// fused=True)`.
using Adam = detail::AdamLike<AdamOptions, false>;
/// AdamW, as `torch.optim.AdamW(params, lr, betas, eps, weight_decay, amsgrad, maximize=...,
/// fused=True)`.
using AdamW = detail::AdamLike<AdamWOptions, true>;

/// loom::optim::Adam and AdamW in loom's optimizer table: Python's fused layout (`step` an f32
/// tensor on the parameter's device, `fused` True), beta1 as momentum, the fused AMP hand-over.
template <class Options, bool Decoupled>
struct optimizer_traits<detail::AdamLike<Options, Decoupled>> : TraitsDefaults {
  using options = Options;
  using param_state = AdamParamState;
  static constexpr std::string_view name = Decoupled ? "loom::optim::AdamW" : "loom::optim::Adam";
  static constexpr MomentumKind momentum = MomentumKind::Beta1;
  static constexpr AmpSupport amp = AmpSupport::Fused;

  static void save_options(const options& o, c10::impl::GenericDict& g) {
    detail::save_adam_options(o, o.maximize(), true, Decoupled, g);
  }
  static void load_options(options& o, const PythonReader& r) {
    detail::load_adam_options(o, Decoupled, r);
    o.maximize(r.boolean_or("maximize", false));
  }
  static void save_state(const param_state& s, c10::impl::GenericDict& d) {
    d.insert("step", s.step().detach());
    d.insert("exp_avg", s.exp_avg().detach());
    d.insert("exp_avg_sq", s.exp_avg_sq().detach());
    if (s.max_exp_avg_sq().defined()) d.insert("max_exp_avg_sq", s.max_exp_avg_sq().detach());
  }
  /// `step` goes to the parameter's device as f32, Python's fused rule.
  static std::unique_ptr<param_state> load_state(const PythonReader& r, const options& group) {
    auto s = std::make_unique<param_state>();
    s->step(at::full({}, r.number("step"), r.param().options().dtype(at::kFloat)));
    s->exp_avg(r.tensor("exp_avg"));
    s->exp_avg_sq(r.tensor("exp_avg_sq"));
    if (group.amsgrad()) s->max_exp_avg_sq(r.tensor("max_exp_avg_sq"));
    return s;
  }
  static void move_state(param_state& s, const c10::Device& device) {
    detail::move_tensors(s.step(), device);
    detail::move_tensors(s.exp_avg(), device);
    detail::move_tensors(s.exp_avg_sq(), device);
    detail::move_tensors(s.max_exp_avg_sq(), device);
  }
  static double& momentum_of(options& o) { return std::get<0>(o.betas()); }
  static void set_amp(detail::AdamLike<Options, Decoupled>& o, std::optional<at::Tensor> grad_scale,
                      std::optional<at::Tensor> found_inf) {
    o.set_amp(std::move(grad_scale), std::move(found_inf));
  }
};

}  // namespace loom::optim
