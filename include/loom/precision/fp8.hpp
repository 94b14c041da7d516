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
#include <loom/state_dict.hpp>
#include <loom/state_reader.hpp>
#include <loom/step_result.hpp>

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
  void convert_module(torch::nn::Module& root);

  /// The optimizer's step, then (delayed scaling) every layer's scales from its history.
  bool optimizer_step(torch::optim::Optimizer& optimizer) {
    optimizer.step();
    if (block_) block_->update(recipe_.delayed, recipe_.grad_dtype);
    return true;
  }

  /// Every optimizer's step, then the scales once: one training step's amaxes roll into the
  /// history once, however many optimizers share the step.
  std::vector<StepResult> optimizer_steps(Optimizers optimizers) {
    for (torch::optim::Optimizer& o : optimizers) o.step();
    if (block_) block_->update(recipe_.delayed, recipe_.grad_dtype);
    return std::vector<StepResult>(optimizers.size(), StepResult(true));
  }

  /// What Runtime all-reduces (Max) across ranks before each optimizer step, so every rank
  /// keeps the same scales: the current step's amaxes of every layer under delayed scaling; an
  /// undefined tensor otherwise.
  at::Tensor max_reduced_before_step() const { return block_ ? block_->current() : at::Tensor(); }

  /// Delayed scaling: "fp8.<layer>.amax_history" (history_len, 3) and "fp8.<layer>.scale" (3)
  /// for every converted layer (columns: input, weight, output gradient). Else empty.
  StateDict state_dict() const;

  /// Restores state_dict()'s value after convert_module (setup) has run; a missing,
  /// unexpected or misshapen key is a loom::Error naming it.
  void load_state_dict(const StateDict& state);

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
  static void swap_linears(torch::nn::SequentialImpl& seq);

  static void load_one(state::Reader& r, const std::string& k, at::Tensor target);

  // _scaled_mm runs on compute capability 8.9 and newer: try the smallest product there.
  static void probe_cuda(c10::Device device);

  fp8::LinearRecipe recipe_{};
  c10::Device device_{c10::kCPU};
  std::vector<std::string> names_;
  std::shared_ptr<fp8::DelayedBlock> block_;
};

}  // namespace loom::precision

namespace loom {
using precision::Fp8Mixed;
}  // namespace loom
