#pragma once
// loom::optim::SGD: Python's torch.optim.SGD(..., fused=True), one at::_fused_sgd_ call per
// (device, dtype) group, and its row of loom's optimizer table. docs/optim.md
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/_fused_sgd.h>
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

/// SGD's options, with Python's names and defaults.
struct SGDOptions : torch::optim::OptimizerCloneableOptions<SGDOptions> {
  SGDOptions(double lr = 1e-3) : lr_(lr) {}  // NOLINT: implicit, as torch::optim::SGDOptions
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
  void serialize(torch::serialize::OutputArchive& archive) const override {
    _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
    _TORCH_OPTIM_SERIALIZE_TORCH_ARG(momentum);
    _TORCH_OPTIM_SERIALIZE_TORCH_ARG(dampening);
    _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
    _TORCH_OPTIM_SERIALIZE_TORCH_ARG(nesterov);
    _TORCH_OPTIM_SERIALIZE_TORCH_ARG(maximize);
  }
  void serialize(torch::serialize::InputArchive& archive) override {
    _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
    _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, momentum);
    _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, dampening);
    _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
    _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, nesterov);
    _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, maximize);
  }

  TORCH_ARG(double, lr);
  TORCH_ARG(double, momentum) = 0;
  TORCH_ARG(double, dampening) = 0;
  TORCH_ARG(double, weight_decay) = 0;
  TORCH_ARG(bool, nesterov) = false;
  TORCH_ARG(bool, maximize) = false;
};

/// One parameter's SGD state: Python's `momentum_buffer` (only when momentum != 0).
struct SGDParamState : torch::optim::OptimizerCloneableParamState<SGDParamState> {
  void serialize(torch::serialize::OutputArchive& archive) const override {
    _TORCH_OPTIM_SERIALIZE_TORCH_ARG(momentum_buffer);
  }
  void serialize(torch::serialize::InputArchive& archive) override {
    _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(at::Tensor, momentum_buffer);
  }
  TORCH_ARG(at::Tensor, momentum_buffer);
};

/// Stochastic gradient descent with momentum, as `torch.optim.SGD(params, lr, momentum,
/// dampening, weight_decay, nesterov, maximize=..., fused=True)`.
///
/// One difference, on purpose: Python's fused SGD leaves the momentum buffers uninitialised
/// when its first step is skipped by a GradScaler (inf/nan gradients), and uses that memory on
/// the next step. loom starts the buffers at zero (exact when dampening is 0: the first step
/// is then buf = grad); with dampening != 0 and a found_inf flag, the first step reads the
/// flag once (one host sync, once) to know whether the buffers were filled.
class SGD : public FusedOptimizer {
 public:
  /// Enters SGD in loom's optimizer table (the first time).
  SGD(const std::vector<torch::optim::OptimizerParamGroup>& groups, SGDOptions defaults);
  SGD(std::vector<at::Tensor> params, SGDOptions defaults)
      : SGD({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

  /// torch::save / torch::load of the optimizer: options of every group and each
  /// parameter's state, in LibTorch's optimizer archive layout.
  void save(torch::serialize::OutputArchive& archive) const override {
    torch::optim::serialize<SGDParamState, SGDOptions>(archive, *this);
  }
  void load(torch::serialize::InputArchive& archive) override {
    torch::optim::serialize<SGDParamState, SGDOptions>(archive, *this);
  }

  using torch::optim::Optimizer::step;
  at::Tensor step(LossClosure closure = nullptr) override {
    check_options<SGDOptions>(check);  // options may have changed since construction
    return run_step<SGDOptions>(
        closure, "SGD",
        [this](const SGDOptions& o, Bucket& b, const at::Tensor* lr) { step_bucket(o, b, lr); });
  }

 private:
  static void check(const SGDOptions& o) {
    if (o.lr() < 0)
      throw Error("loom::optim::SGD: Invalid learning rate: " + std::to_string(o.lr()));
    if (o.momentum() < 0) {
      throw Error("loom::optim::SGD: Invalid momentum value: " + std::to_string(o.momentum()));
    }
    if (o.weight_decay() < 0) {
      throw Error("loom::optim::SGD: Invalid weight_decay value: " +
                  std::to_string(o.weight_decay()));
    }
    if (o.nesterov() && (o.momentum() <= 0 || o.dampening() != 0)) {
      throw Error("loom::optim::SGD: Nesterov momentum requires a momentum and zero dampening");
    }
  }

  void step_bucket(const SGDOptions& o, Bucket& b, const at::Tensor* lr) {
    auto amp = amp_on(b.device);
    std::vector<at::Tensor> bufs;
    bool first = false;
    if (o.momentum() != 0) {
      bufs.reserve(b.params.size());
      bool none = true;
      for (auto& p : b.params) {
        auto* s = find_state<SGDParamState>(p);
        if (s != nullptr && s->momentum_buffer().defined()) none = false;
      }
      for (std::size_t i = 0; i < b.params.size(); ++i) {
        auto& s =
            state_for<SGDParamState>(b.params[i], [] { return std::make_unique<SGDParamState>(); });
        if (!s.momentum_buffer().defined()) s.momentum_buffer(at::zeros_like(b.grads[i]));
        bufs.push_back(s.momentum_buffer());
      }
      // Zero buffers make buf = momentum * 0 + (1 - dampening) * grad: the first step's
      // buf = grad exactly when dampening is 0; otherwise the kernel's first-step path.
      first = none && o.dampening() != 0;
    }
    if (lr != nullptr) {
      at::_fused_sgd_(b.params, b.grads, bufs, o.weight_decay(), o.momentum(), *lr, o.dampening(),
                      o.nesterov(), o.maximize(), first, amp.grad_scale, amp.found_inf);
    } else {
      at::_fused_sgd_(b.params, b.grads, bufs, o.weight_decay(), o.momentum(), o.lr(),
                      o.dampening(), o.nesterov(), o.maximize(), first, amp.grad_scale,
                      amp.found_inf);
    }
    if (first && amp.found_inf && amp.found_inf->item<float>() != 0) {  // once: see the class
      for (auto& p : b.params) state_.erase(p.unsafeGetTensorImpl());
    }
  }
};

/// loom::optim::SGD in loom's optimizer table: Python's fused layout (`fused` True), the fused
/// AMP hand-over.
template <>
struct optimizer_traits<SGD> : detail::MomentumBufferTraits<SGDOptions, SGDParamState> {
  static constexpr std::string_view name = "loom::optim::SGD";
  static constexpr AmpSupport amp = AmpSupport::Fused;

  static void save_options(const options& o, c10::impl::GenericDict& g) {
    detail::save_sgd_options(o, o.maximize(), true, g);
  }
  static void load_options(options& o, const PythonReader& r) {
    detail::load_sgd_options(o, r);
    o.maximize(r.boolean_or("maximize", false));
  }
  static void set_amp(SGD& o, std::optional<at::Tensor> grad_scale,
                      std::optional<at::Tensor> found_inf) {
    o.set_amp(std::move(grad_scale), std::move(found_inf));
  }
};

inline SGD::SGD(const std::vector<torch::optim::OptimizerParamGroup>& groups, SGDOptions defaults)
    : FusedOptimizer(groups, std::make_unique<SGDOptions>(defaults)) {
  register_optimizer<SGD>();
  check_options<SGDOptions>(check);
}

}  // namespace loom::optim
