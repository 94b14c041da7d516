#pragma once
// LibTorch's optimizers in loom's optimizer table: optimizer_traits for torch::optim::SGD,
// Adam and AdamW (Python's layout: torch.optim's non-fused state_dict, `step` a float32 CPU
// tensor, `fused` None), and for RMSprop, Adagrad and LBFGS (moved to a device; RMSprop's
// momentum cycled; LBFGS refused under AMP; no Python layout). optim/optimizer_table.hpp
// registers them all before its first lookup.
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <ATen/ops/scalar_tensor.h>
#include <c10/core/Device.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <loom/optim/optimizer_traits.hpp>

namespace loom::optim {

namespace detail {

/// Moves a state member to `device` in place: a tensor (undefined ones stay undefined), an
/// optional, or a container of them (LBFGS's histories, whose container differs between
/// LibTorch versions).
template <class T>
void move_tensors(T& x, const c10::Device& device) {
  if constexpr (std::is_same_v<T, at::Tensor>) {
    if (x.defined()) x = x.to(device);
  } else if constexpr (requires {
                         x.has_value();
                         *x;
                       }) {
    if (x.has_value()) move_tensors(*x, device);
  } else {
    for (auto& e : x) move_tensors(e, device);
  }
}

/// SGD's group keys in Python's order; `fused` is None for LibTorch's, True for loom's.
template <class Options>
void save_sgd_options(const Options& o, bool maximize, bool fused, c10::impl::GenericDict& g) {
  g.insert("lr", o.lr());
  g.insert("momentum", o.momentum());
  g.insert("dampening", o.dampening());
  g.insert("weight_decay", o.weight_decay());
  g.insert("nesterov", o.nesterov());
  g.insert("maximize", maximize);
  g.insert("foreach", c10::IValue());
  g.insert("differentiable", false);
  g.insert("fused", fused ? c10::IValue(true) : c10::IValue());
}

/// SGD's options from a group: every field but maximize (the caller's).
template <class Options>
void load_sgd_options(Options& o, const PythonReader& r) {
  if (r.has("betas")) r.fail("", "holds Adam's options (betas), the optimizer is SGD");
  o.lr(r.number("lr"));
  o.weight_decay(r.number("weight_decay"));
  o.momentum(r.number("momentum"));
  o.dampening(r.number_or("dampening", 0.0));
  o.nesterov(r.boolean_or("nesterov", false));
}

/// Adam's and AdamW's group keys in Python's order.
template <class Options>
void save_adam_options(const Options& o, bool maximize, bool fused, bool decoupled,
                       c10::impl::GenericDict& g) {
  const auto [b1, b2] = o.betas();
  g.insert("lr", o.lr());
  g.insert("betas", c10::ivalue::Tuple::create({c10::IValue(b1), c10::IValue(b2)}));
  g.insert("eps", o.eps());
  g.insert("weight_decay", o.weight_decay());
  g.insert("amsgrad", o.amsgrad());
  g.insert("maximize", maximize);
  g.insert("foreach", c10::IValue());
  g.insert("capturable", false);
  g.insert("differentiable", false);
  g.insert("fused", fused ? c10::IValue(true) : c10::IValue());
  g.insert("decoupled_weight_decay", decoupled);
}

/// Adam's or AdamW's options from a group (Python 2.x writes decoupled_weight_decay, which
/// tells the two apart): every field but maximize (the caller's).
template <class Options>
void load_adam_options(Options& o, bool decoupled, const PythonReader& r) {
  if (!r.has("betas")) r.fail("", "holds SGD's options (no betas), the optimizer is Adam");
  o.lr(r.number("lr"));
  o.weight_decay(r.number("weight_decay"));
  const auto betas = r.numbers("betas");
  if (betas.size() != 2) r.fail("betas", "expected two numbers");
  o.betas(std::make_tuple(betas[0], betas[1]));
  o.eps(r.number("eps"));
  o.amsgrad(r.boolean_or("amsgrad", false));
  if (r.has("decoupled_weight_decay") && r.boolean("decoupled_weight_decay") != decoupled) {
    r.fail("decoupled_weight_decay",
           decoupled ? "is False: the checkpoint holds Adam's state, the optimizer is AdamW"
                     : "is True: the checkpoint holds AdamW's state, the optimizer is Adam");
  }
}

/// LibTorch's optimizers have no maximize: a group that asks for it is refused.
inline void refuse_maximize(const PythonReader& r) {
  if (r.boolean_or("maximize", false)) {
    r.fail("maximize", "is True; LibTorch's optimizers have no maximize (use loom::optim's)");
  }
}

/// LibTorch's Adam or AdamW (their options and states are distinct types with equal members).
template <class Options, class State, bool Decoupled>
struct TorchAdamTraits : TraitsDefaults {
  using options = Options;
  using param_state = State;
  static constexpr MomentumKind momentum = MomentumKind::Beta1;

  static void save_options(const options& o, c10::impl::GenericDict& g) {
    save_adam_options(o, false, false, Decoupled, g);
  }
  static void load_options(options& o, const PythonReader& r) {
    load_adam_options(o, Decoupled, r);
    refuse_maximize(r);
  }
  /// `step` is an integer here, a float32 CPU tensor in Python's non-fused layout.
  static void save_state(const param_state& s, c10::impl::GenericDict& d) {
    d.insert("step", at::scalar_tensor(static_cast<double>(s.step()), at::kFloat));
    d.insert("exp_avg", s.exp_avg().detach());
    d.insert("exp_avg_sq", s.exp_avg_sq().detach());
    if (s.max_exp_avg_sq().defined()) d.insert("max_exp_avg_sq", s.max_exp_avg_sq().detach());
  }
  static std::unique_ptr<param_state> load_state(const PythonReader& r, const options& group) {
    auto s = std::make_unique<param_state>();
    s->step(static_cast<int64_t>(r.number("step")));
    s->exp_avg(r.tensor("exp_avg"));
    s->exp_avg_sq(r.tensor("exp_avg_sq"));
    if (group.amsgrad()) s->max_exp_avg_sq(r.tensor("max_exp_avg_sq"));
    return s;
  }
  static void move_state(param_state& s, const c10::Device& device) {
    move_tensors(s.exp_avg(), device);
    move_tensors(s.exp_avg_sq(), device);
    move_tensors(s.max_exp_avg_sq(), device);
  }
  static double& momentum_of(options& o) { return std::get<0>(o.betas()); }
};

/// The rows of an SGD-like optimizer: one optional `momentum_buffer` per parameter (Python's
/// key), the `momentum` option; LibTorch's SGD and loom::optim::SGD share them.
template <class Options, class State>
struct MomentumBufferTraits : TraitsDefaults {
  using options = Options;
  using param_state = State;
  static constexpr MomentumKind momentum = MomentumKind::Momentum;

  static void save_state(const param_state& s, c10::impl::GenericDict& d) {
    if (s.momentum_buffer().defined()) d.insert("momentum_buffer", s.momentum_buffer().detach());
  }
  static std::unique_ptr<param_state> load_state(const PythonReader& r, const options&) {
    auto s = std::make_unique<param_state>();
    if (r.has("momentum_buffer")) s->momentum_buffer(r.tensor("momentum_buffer"));
    return s;
  }
  static void move_state(param_state& s, const c10::Device& device) {
    detail::move_tensors(s.momentum_buffer(), device);
  }
  static double& momentum_of(options& o) { return o.momentum(); }
};

}  // namespace detail

/// LibTorch's SGD: Python's layout (momentum_buffer only where there is momentum).
template <>
struct optimizer_traits<torch::optim::SGD>
    : detail::MomentumBufferTraits<torch::optim::SGDOptions, torch::optim::SGDParamState> {
  static constexpr std::string_view name = "SGD";

  static void save_options(const options& o, c10::impl::GenericDict& g) {
    detail::save_sgd_options(o, false, false, g);
  }
  static void load_options(options& o, const PythonReader& r) {
    detail::load_sgd_options(o, r);
    detail::refuse_maximize(r);
  }
};

/// LibTorch's Adam: Python's non-fused layout.
template <>
struct optimizer_traits<torch::optim::Adam>
    : detail::TorchAdamTraits<torch::optim::AdamOptions, torch::optim::AdamParamState, false> {
  static constexpr std::string_view name = "Adam";
};

/// LibTorch's AdamW: Python's non-fused layout.
template <>
struct optimizer_traits<torch::optim::AdamW>
    : detail::TorchAdamTraits<torch::optim::AdamWOptions, torch::optim::AdamWParamState, true> {
  static constexpr std::string_view name = "AdamW";
};

/// LibTorch's RMSprop: moved, its momentum cycled; not in Python's layout.
template <>
struct optimizer_traits<torch::optim::RMSprop> : TraitsDefaults {
  using options = torch::optim::RMSpropOptions;
  using param_state = torch::optim::RMSpropParamState;
  static constexpr std::string_view name = "RMSprop";
  static constexpr bool python_layout = false;
  static constexpr MomentumKind momentum = MomentumKind::Momentum;

  static void move_state(param_state& s, const c10::Device& device) {
    detail::move_tensors(s.square_avg(), device);
    detail::move_tensors(s.momentum_buffer(), device);
    detail::move_tensors(s.grad_avg(), device);
  }
  static double& momentum_of(options& o) { return o.momentum(); }
};

/// LibTorch's Adagrad: moved; not in Python's layout.
template <>
struct optimizer_traits<torch::optim::Adagrad> : TraitsDefaults {
  using options = torch::optim::AdagradOptions;
  using param_state = torch::optim::AdagradParamState;
  static constexpr std::string_view name = "Adagrad";
  static constexpr bool python_layout = false;

  static void move_state(param_state& s, const c10::Device& device) {
    detail::move_tensors(s.sum(), device);
  }
};

/// LibTorch's LBFGS: moved; refused under AMP (as torch's GradScaler refuses it); not in
/// Python's layout.
template <>
struct optimizer_traits<torch::optim::LBFGS> : TraitsDefaults {
  using options = torch::optim::LBFGSOptions;
  using param_state = torch::optim::LBFGSParamState;
  static constexpr std::string_view name = "LBFGS";
  static constexpr bool python_layout = false;
  static constexpr AmpSupport amp = AmpSupport::Refused;

  static void move_state(param_state& s, const c10::Device& device) {
    detail::move_tensors(s.d(), device);
    detail::move_tensors(s.H_diag(), device);
    detail::move_tensors(s.prev_flat_grad(), device);
    detail::move_tensors(s.old_dirs(), device);
    detail::move_tensors(s.old_stps(), device);
    detail::move_tensors(s.ro(), device);
    detail::move_tensors(s.al(), device);
  }
};

}  // namespace loom::optim
