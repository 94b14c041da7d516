#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <typeinfo>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/optimizer.h>

#include <loom/amp/autocast.hpp>
#include <loom/error.hpp>
#include <loom/fp8/delayed.hpp>
#include <loom/fp8/linear.hpp>
#include <loom/fp8/module.hpp>
#include <loom/precision/cast.hpp>
#include <loom/precision/mixed.hpp>
#include <loom/state/reader.hpp>
#include <loom/state/state_dict.hpp>

namespace loom::precision {

/// The forward scope of fp8-mixed: bf16 autocast, and an fp8 scope for the fp8 layers.
class [[nodiscard]] Fp8Guard {
 public:
  explicit Fp8Guard(c10::DeviceType device) : autocast_(device, c10::kBFloat16) {}

 private:
  amp::AutocastGuard autocast_;
  fp8::Scope fp8_;
};

/// "fp8-mixed": bf16-mixed, with the linear layers' three products in fp8 (docs/fp8.md).
///
/// Weights and optimizer state stay fp32 (master weights). convert_module enables every
/// loom::fp8::Linear of the model and swaps the torch::nn::Linear layers of every
/// torch::nn::Sequential for loom::fp8::Linear layers holding the same parameters (so an
/// optimizer built earlier keeps working); a layer whose dimensions are not both multiples
/// of 16, or a torch::nn::Linear held as a C++ member (which no library can swap), stays in
/// bf16, and one warning names them all. Inside forward_context the rest of the forward runs
/// under bf16 autocast. The recipe says how operands are scaled: dynamically per tensor (the
/// default) or per row, or delayed (amax histories: the policy's state, updated after each
/// optimizer step, all-reduced across ranks under Ddp, saved in checkpoints).
/// The products are at::_scaled_mm calls: cuBLASLt on CUDA devices of compute capability 8.9
/// and newer (a Runtime on an older GPU refuses the policy at construction); on the CPU an
/// emulated kernel that is exact enough to test with and slow.
struct Fp8Mixed : Mixed<Fp8Mixed, c10::kBFloat16> {
  static constexpr std::string_view precision() { return "fp8-mixed"; }

  Fp8Mixed() = default;
  explicit Fp8Mixed(const fp8::LinearRecipe& recipe) : recipe_(recipe) {
    fp8::max_value(recipe.grad_dtype);  // an fp8 format, or loom::Error naming it
    if (recipe.scaling == fp8::Scaling::Delayed && recipe.delayed.history_len < 1) {
      throw Error("loom::Fp8Mixed: the delayed recipe's history_len must be at least 1");
    }
  }

  /// bf16 autocast on `device`, and fp8 for the converted layers.
  Fp8Guard forward_context(c10::DeviceType device) const { return Fp8Guard(device); }

  /// Called by Runtime with its device when it is built: refuses a CUDA device that cannot
  /// run fp8 products, and keeps delayed-scaling state on the device.
  void bind_device(c10::Device device) {
    if (device.is_cuda()) probe_cuda(device);
    device_ = device;
  }

  /// Enables the model's fp8 layers (see above); warns once naming the layers left in bf16.
  void convert_module(torch::nn::Module& root) {
    std::vector<std::string> kept;
    // 1. torch::nn::Linear layers of Sequentials become loom::fp8::Linear layers.
    if (auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(&root)) swap_linears(*seq);
    for (const auto& item : root.named_modules("", /*include_self=*/false)) {
      if (auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(item.value().get())) {
        swap_linears(*seq);
      }
    }
    // 2. Every eligible loom::fp8::Linear is enabled; the others are reported.
    std::vector<std::pair<std::string, fp8::LinearImpl*>> layers;
    auto visit = [&](const std::string& name, torch::nn::Module& m) {
      const std::string shown = name.empty() ? "(the model)" : "'" + name + "'";
      if (auto* l = dynamic_cast<fp8::LinearImpl*>(&m)) {
        if (l->eligible()) {
          layers.emplace_back(name, l);
        } else {
          l->disable();
          kept.push_back(shown + " (" + fp8::dims(l->options) + "): not multiples of 16");
        }
      } else if (typeid(m) == typeid(torch::nn::LinearImpl)) {
        const auto& options = static_cast<torch::nn::LinearImpl&>(m).options;
        kept.push_back(shown + " (" + fp8::dims(options) + ")" +
                       (fp8::eligible(options) ? ": a torch::nn::Linear member, which cannot be "
                                                 "swapped; declare it as loom::fp8::Linear"
                                               : ": not multiples of 16"));
      }
    };
    visit("", root);
    for (const auto& item : root.named_modules("", /*include_self=*/false)) {
      visit(item.key(), *item.value());
    }
    names_.clear();
    block_.reset();
    if (recipe_.scaling == fp8::Scaling::Delayed) {
      block_ = std::make_shared<fp8::DelayedBlock>(
          fp8::DelayedBlock::make(static_cast<int64_t>(layers.size()), recipe_.delayed, device_));
    }
    for (std::size_t i = 0; i < layers.size(); ++i) {
      layers[i].second->enable({recipe_, {block_, static_cast<int64_t>(i)}});
      names_.push_back(layers[i].first);
    }
    if (!kept.empty()) {
      std::string list;
      for (const auto& k : kept) list += (list.empty() ? "" : "; ") + k;
      TORCH_WARN("loom: fp8-mixed keeps ", kept.size(), " linear layer(s) in bf16: ", list);
    }
  }

  /// The optimizer's step, then (delayed scaling) every layer's scales from its history.
  bool optimizer_step(torch::optim::Optimizer& optimizer) {
    optimizer.step();
    if (block_) block_->update(recipe_.delayed, recipe_.grad_dtype);
    return true;
  }

  /// What Runtime all-reduces (Max) across ranks before each optimizer step, so every rank
  /// keeps the same scales: the current step's amaxes of every layer under delayed scaling; an
  /// undefined tensor otherwise.
  at::Tensor max_reduced_before_step() const { return block_ ? block_->current() : at::Tensor(); }

  /// Delayed scaling: "fp8.<layer>.amax_history" (history_len, 3) and "fp8.<layer>.scale" (3)
  /// for every converted layer (columns: input, weight, output gradient). Else empty.
  StateDict state_dict() const {
    StateDict state;
    if (!block_) return state;
    for (std::size_t i = 0; i < names_.size(); ++i) {
      const auto l = static_cast<int64_t>(i);
      state[key(names_[i], "amax_history")] = block_->amax_history.select(1, l).clone();
      state[key(names_[i], "scale")] = block_->scale.select(0, l).clone();
    }
    return state;
  }

  /// Restores state_dict()'s value after convert_module (setup) has run; a missing,
  /// unexpected or misshapen key is a loom::Error naming it.
  void load_state_dict(const StateDict& state) {
    if (recipe_.scaling != fp8::Scaling::Delayed) {
      Mixed::load_state_dict(state);  // no state: refuses any key
      return;
    }
    static constexpr std::string_view owner = "loom::precision::Fp8Mixed::load_state_dict";
    if (!block_) {
      if (state.empty()) return;
      state::fail_key(owner, "",
                      "fp8-mixed state loads after setup(): the layers it belongs to are "
                      "converted there");
    }
    state::Reader r(std::string(owner), state);
    for (std::size_t i = 0; i < names_.size(); ++i) {
      const auto l = static_cast<int64_t>(i);
      load_one(r, key(names_[i], "amax_history"), block_->amax_history.select(1, l));
      load_one(r, key(names_[i], "scale"), block_->scale.select(0, l));
    }
    r.finish();
  }

  /// The recipe the layers are converted with.
  const fp8::LinearRecipe& recipe() const noexcept { return recipe_; }
  /// The names of the layers convert_module enabled, in order ("" for the model itself).
  const std::vector<std::string>& fp8_layers() const noexcept { return names_; }
  /// The delayed-scaling state (null unless the recipe is delayed and setup has run).
  std::shared_ptr<const fp8::DelayedBlock> delayed_state() const noexcept { return block_; }

 private:
  static std::string key(const std::string& layer, const char* what) {
    std::string k = "fp8.";
    if (!layer.empty()) k += layer + ".";
    k += what;
    return k;
  }

  // Rebuilds `seq` in place with its eligible torch::nn::Linear layers as loom::fp8::Linear
  // ones holding the same parameters; the object stays the one its parent holds.
  static void swap_linears(torch::nn::SequentialImpl& seq) {
    const auto children = seq.named_children();
    if (children.size() != seq.size()) return;  // not built by push_back: leave it alone
    bool any = false;
    for (const auto& c : children) {
      const auto& m = *c.value();
      any = any || (typeid(m) == typeid(torch::nn::LinearImpl) &&
                    fp8::eligible(static_cast<const torch::nn::LinearImpl&>(m).options));
    }
    if (!any) return;
    torch::nn::SequentialImpl rebuilt;
    std::size_t i = 0;
    for (const torch::nn::AnyModule& a : seq) {
      const auto& c = children[i++];
      const auto& m = *c.value();
      if (typeid(m) == typeid(torch::nn::LinearImpl) &&
          fp8::eligible(static_cast<const torch::nn::LinearImpl&>(m).options)) {
        rebuilt.push_back(std::string(c.key()), fp8::Linear(std::make_shared<fp8::LinearImpl>(
                                                    static_cast<const torch::nn::LinearImpl&>(m))));
      } else {
        rebuilt.push_back(std::string(c.key()), a);
      }
    }
    if (!seq.is_training()) rebuilt.train(false);
    seq = std::move(rebuilt);
  }

  static void load_one(state::Reader& r, const std::string& k, at::Tensor target) {
    const at::Tensor t = r.tensor(k);
    if (t.sizes() != target.sizes()) {
      r.fail(k, "expected a tensor of shape " + c10::str(target.sizes()) + ", got " +
                    c10::str(t.sizes()) + " (a different history_len, or another model)");
    }
    at::NoGradGuard no_grad;
    target.copy_(t);
  }

  // _scaled_mm runs on compute capability 8.9 and newer: try the smallest product there.
  static void probe_cuda(c10::Device device) {
    try {
      const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
      const at::Tensor a = at::zeros({16, 16}, f32).to(c10::kFloat8_e4m3fn);
      const at::Tensor one = at::ones({}, f32);
      (void)at::_scaled_mm(a, a.t(), one, one, std::nullopt, std::nullopt, c10::kBFloat16, false);
    } catch (const c10::Error& e) {
      std::string what =
          "loom: fp8-mixed needs a CUDA device of compute capability 8.9 or newer (Ada, Hopper, "
          "Blackwell) for its fp8 products; ";
      what += device.str();
      what += " cannot run them: ";
      what += e.what_without_backtrace();
      throw Error(what);
    }
  }

  fp8::LinearRecipe recipe_{};
  c10::Device device_{c10::kCPU};
  std::vector<std::string> names_;
  std::shared_ptr<fp8::DelayedBlock> block_;
};

}  // namespace loom::precision

namespace loom {
using precision::Fp8Mixed;
}  // namespace loom
