#pragma once
// loom::optim::FusedOptimizer: the base of loom's fused optimizers (SGD, Adam, AdamW).
//
// Each is a torch::optim::Optimizer whose step() makes one fused ATen call per (device, dtype)
// group of every param group (at::_fused_sgd_, at::_fused_adam_, at::_fused_adamw_), with the
// semantics of Python's `torch.optim.X(..., fused=True)`. Under 16-mixed the precision hands
// the optimizer the loss scale and the device-side inf flag (set_amp), as Python's GradScaler
// does: the kernel unscales the gradients itself and does nothing where the flag is set, so
// the step needs no host sync (docs/optim.md).
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/full.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <torch/optim/optimizer.h>

#include <loom/detail/tensor_groups.hpp>
#include <loom/error.hpp>

namespace loom::optim {

/// The base of loom's fused optimizers: param groups, the AMP hand-over and the grouping of
/// parameters by (device, dtype) that every fused kernel call needs.
class FusedOptimizer : public torch::optim::Optimizer {
 public:
  /// The param groups in order (each with its own options, or the defaults'), and defaults.
  FusedOptimizer(const std::vector<torch::optim::OptimizerParamGroup>& groups,
                 std::unique_ptr<torch::optim::OptimizerOptions> defaults)
      : torch::optim::Optimizer(std::vector<torch::optim::OptimizerParamGroup>{},
                                std::move(defaults)) {
    for (const auto& g : groups) add_group(g);
  }

  /// The next step() divides the gradients by `grad_scale` inside the kernel (none: they are
  /// already unscaled) and leaves every parameter, state and gradient alone where `found_inf`
  /// is nonzero (none: never skipped). Both f32 0-dim tensors; moved to each parameter's
  /// device without a sync. step() consumes them. This is what 16-mixed calls.
  void set_amp(std::optional<at::Tensor> grad_scale, std::optional<at::Tensor> found_inf) {
    for (const auto* t : {&grad_scale, &found_inf}) {
      if (t->has_value() &&
          (!(*t)->defined() || (*t)->scalar_type() != c10::kFloat || (*t)->numel() != 1)) {
        throw Error("loom::optim: set_amp takes defined f32 one-element tensors");
      }
    }
    grad_scale_ = loom::detail::DeviceReplicas(grad_scale.value_or(at::Tensor()));
    found_inf_ = loom::detail::DeviceReplicas(found_inf.value_or(at::Tensor()));
  }

  /// Adds a param group; its options, when it has them, are used whole (as given), and
  /// otherwise the defaults'. LibTorch 2.15's add_param_group would replace the options of a
  /// type it does not know by the defaults.
  void add_group(const torch::optim::OptimizerParamGroup& group) {
    add_param_group(group);
    if (group.has_options()) param_groups_.back().set_options(group.options().clone());
  }

  /// Python's optimizer.zero_grad(set_to_none): each gradient dropped (`p.grad = None`; the
  /// zero_grad of LibTorch's Optimizer, hidden here, first detaches it in place: one operator
  /// more per parameter and step), or, with set_to_none false, detached from its graph and
  /// zeroed.
  void zero_grad(bool set_to_none = true) {
    for (auto& group : param_groups_) {
      for (auto& p : group.params()) {
        at::Tensor& g = p.mutable_grad();
        if (!g.defined()) continue;
        if (set_to_none) {
          g.reset();
          continue;
        }
        if (g.grad_fn()) {
          g.detach_();
        } else {
          g.requires_grad_(false);
        }
        g.zero_();
      }
    }
  }

  /// Whether set_amp has given the next step a found_inf flag.
  bool has_found_inf() const noexcept { return found_inf_.master().defined(); }

  /// Python's `capturable` learning rate (`torch.optim.AdamW(..., lr=torch.tensor(...))`):
  /// with `on`, every step hands each param group's lr to the fused kernel as a one-element
  /// tensor on the parameters' device (the kernels' `tensor_lr` overloads) instead of a host
  /// double, so a step captured in a CUDA graph reads the lr at replay instead of freezing
  /// the one it was captured with. The lr still lives in the group's options (get_lr/set_lr,
  /// every scheduler, state_dict); update_lr_tensors() copies it into the tensors. f64 on the
  /// CPU (the CPU kernels read it as a double: bitwise the double path); f32 on CUDA (the CUDA
  /// kernels read a float, as Python's: the lr is rounded to f32 there).
  void set_tensor_lr(bool on) {
    tensor_lr_ = on;
    lr_tensors_.clear();
  }
  bool tensor_lr() const noexcept { return tensor_lr_; }

  /// Writes each param group's lr into its tensors where it changed since the last write (an
  /// in-place fill on the device: no host sync). step() calls it first; a captured step,
  /// replayed without running step(), needs it before each replay (loom::cuda::GraphedStep
  /// calls it), outside the graph: a schedule writes the group's lr, this writes the tensor.
  void update_lr_tensors() {
    at::NoGradGuard no_grad;
    for (auto& t : lr_tensors_) {
      const double lr = param_groups_.at(t.group).options().get_lr();
      if (lr != t.written) {
        t.value.fill_(lr);
        t.written = lr;
      }
    }
  }

  /// Makes the lr tensor of every param group on every device its parameters are on (before a
  /// CUDA graph capture: a tensor made during one would be filled once, at capture).
  void prepare_lr_tensors() {
    for (std::size_t g = 0; g < param_groups_.size(); ++g) {
      for (const auto& p : param_groups_[g].params()) (void)lr_tensor(g, p.device());
    }
  }

  /// The lr tensor of param group `group` on `device`: made (and filled) on first use.
  const at::Tensor& lr_tensor(std::size_t group, const c10::Device& device) {
    for (const auto& t : lr_tensors_) {
      if (t.group == group && t.device == device) return t.value;
    }
    const double lr = param_groups_.at(group).options().get_lr();
    const auto dtype = device.is_cpu() ? c10::kDouble : c10::kFloat;
    at::Tensor value = at::full({}, lr, at::TensorOptions().dtype(dtype).device(device));
    lr_tensors_.push_back(LrTensor{group, device, std::move(value), lr});
    return lr_tensors_.back().value;
  }

 protected:
  /// One fused call's tensors: the parameters of one param group on one device with one dtype.
  struct Bucket {
    c10::Device device;
    c10::ScalarType dtype;
    std::vector<at::Tensor> params, grads;
  };

  /// The parameters with a gradient of `params` split by (device, dtype) as Python's
  /// _group_tensors_by_device_and_dtype splits them (detail/tensor_groups.hpp: ATen's map
  /// order, each bucket in the given order). Buckets hold disjoint parameters, so their order
  /// changes no value. `who` names the optimizer in errors: a sparse gradient, or one whose
  /// dtype differs from its parameter's.
  static std::vector<Bucket> buckets(const std::vector<at::Tensor>& params, const char* who) {
    std::vector<at::Tensor> with_grad, grads;
    for (const auto& p : params) {
      const auto& g = p.grad();
      if (!g.defined()) continue;
      if (g.is_sparse()) {
        throw Error(std::string("loom::optim::") + who +
                    ": `fused` does not support sparse "
                    "gradients");
      }
      if (g.scalar_type() != p.scalar_type() || g.device() != p.device()) {
        throw Error(std::string("loom::optim::") + who +
                    ": a gradient's dtype or device "
                    "differs from its parameter's (" +
                    std::string(c10::toString(g.scalar_type())) + " vs " +
                    c10::toString(p.scalar_type()) + ")");
      }
      if (!at::isFloatingType(p.scalar_type())) {
        throw Error(std::string("loom::optim::") + who +
                    ": `fused` supports only floating "
                    "point parameters, got " +
                    c10::toString(p.scalar_type()));
      }
      with_grad.push_back(p);
      grads.push_back(g);
    }
    std::vector<Bucket> out;
    for (auto& g : loom::detail::group_by_device_and_dtype({with_grad, grads})) {
      out.push_back(Bucket{g.device, g.dtype, std::move(g.lists[0]), std::move(g.lists[1])});
    }
    return out;
  }

  /// Calls `check` on the defaults' and every param group's options (as `Options`).
  template <class Options, class Check>
  void check_options(Check&& check) const {
    check(static_cast<const Options&>(defaults()));
    for (const auto& g : param_groups()) check(static_cast<const Options&>(g.options()));
  }

  /// step()'s frame: without grad mode (the closure, if any, with it), `each(options, bucket,
  /// lr)` for every (device, dtype) bucket of every param group, where `lr` is the group's lr
  /// tensor on the bucket's device under set_tensor_lr(true), else nullptr; then the AMP
  /// tensors cleared.
  template <class Options, class Each>
  at::Tensor run_step(const LossClosure& closure, const char* who, Each&& each) {
    at::NoGradGuard no_grad;
    at::Tensor loss;
    if (closure) {
      at::AutoGradMode enable(true);
      loss = closure();
    }
    if (tensor_lr_) update_lr_tensors();
    for (std::size_t g = 0; g < param_groups_.size(); ++g) {
      const auto& o = static_cast<const Options&>(param_groups_[g].options());
      for (auto& b : buckets(param_groups_[g].params(), who)) {
        each(o, b, tensor_lr_ ? &lr_tensor(g, b.device) : nullptr);
      }
    }
    clear_amp();
    return loss;
  }

  /// The AMP tensors of this step on `device` (each moved once per device, without a sync).
  struct Amp {
    std::optional<at::Tensor> grad_scale, found_inf;
  };
  Amp amp_on(const c10::Device& device) {
    auto on = [&](loom::detail::DeviceReplicas& r) -> std::optional<at::Tensor> {
      if (!r.master().defined()) return std::nullopt;
      return r.get(device);
    };
    return {on(grad_scale_), on(found_inf_)};
  }

  /// Forgets the AMP tensors: called at the end of every step().
  void clear_amp() {
    grad_scale_ = {};
    found_inf_ = {};
  }

  /// The state of `p`, created by `make` on first use.
  template <class State, class Make>
  State& state_for(const at::Tensor& p, Make&& make) {
    auto& slot = state_[p.unsafeGetTensorImpl()];
    if (!slot) slot = make();
    auto* s = dynamic_cast<State*>(slot.get());
    if (s == nullptr) throw Error("loom::optim: a parameter's state has another optimizer's type");
    return *s;
  }

  /// The state of `p`, or nullptr.
  template <class State>
  State* find_state(const at::Tensor& p) {
    auto it = state_.find(p.unsafeGetTensorImpl());
    return it == state_.end() ? nullptr : dynamic_cast<State*>(it->second.get());
  }

 private:
  struct LrTensor {
    std::size_t group;
    c10::Device device;
    at::Tensor value;
    double written;  // the lr last filled in
  };

  loom::detail::DeviceReplicas grad_scale_, found_inf_;  // undefined masters: none
  bool tensor_lr_ = false;
  std::vector<LrTensor> lr_tensors_;
};

}  // namespace loom::optim
