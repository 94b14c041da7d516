// Modules built without their memory (nn/empty_init.hpp): meta tensors given memory in place,
// and the modules' own initializers run one module at a time on whole CPU tensors.
#include <loom/nn/empty_init.hpp>

#include <string>
#include <utility>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/instancenorm.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <loom/error.hpp>

namespace loom::nn {

namespace {

/// reset_parameters() of the first of `Ts` that `m` is.
template <class... Ts>
bool reset_first(torch::nn::Module& m) {
  return ([&] {
    auto* layer = dynamic_cast<Ts*>(&m);
    if (layer == nullptr) return false;
    layer->reset_parameters();
    return true;
  }() || ...);
}

}  // namespace

bool has_meta_tensors(const torch::nn::Module& module) {
  for (const auto& p : module.parameters(/*recurse=*/true)) {
    if (p.is_meta()) return true;
  }
  for (const auto& b : module.buffers(/*recurse=*/true)) {
    if (b.is_meta()) return true;
  }
  return false;
}

void adopt_storage(const at::Tensor& t, const at::Tensor& real) {
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(real.storage());
  impl->_change_backend_component_keys(real.device());
  impl->set_sizes_and_strides(real.sizes(), real.strides(), real.storage_offset());
}

void materialize(torch::nn::Module& module, c10::Device device) {
  auto give = [&](const at::Tensor& t) {
    if (t.is_meta()) adopt_storage(t, at::empty(t.sizes(), t.options().device(device)));
  };
  for (const auto& p : module.parameters(/*recurse=*/true)) give(p);
  for (const auto& b : module.buffers(/*recurse=*/true)) give(b);
}

bool reset_parameters(torch::nn::Module& module) {
  using namespace torch::nn;
  return reset_first<LinearImpl, BilinearImpl, Conv1dImpl, Conv2dImpl, Conv3dImpl,
                     ConvTranspose1dImpl, ConvTranspose2dImpl, ConvTranspose3dImpl, EmbeddingImpl,
                     EmbeddingBagImpl, LayerNormImpl, GroupNormImpl, BatchNorm1dImpl,
                     BatchNorm2dImpl, BatchNorm3dImpl, InstanceNorm1dImpl, InstanceNorm2dImpl,
                     InstanceNorm3dImpl>(module);
}

void init_each(torch::nn::Module& root, const Initializer& init, const WholeShape& shape,
               const KeepWhole& keep) {
  at::NoGradGuard no_grad;
  std::string unknown;
  for (const auto& item : root.named_modules()) {
    torch::nn::Module& m = *item.value();
    std::vector<at::Tensor> held;
    for (const auto& p : m.parameters(/*recurse=*/false)) held.push_back(p);
    for (const auto& b : m.buffers(/*recurse=*/false)) held.push_back(b);
    if (held.empty()) continue;
    // The module's tensors swapped for whole CPU ones while it initializes them, then back.
    std::vector<at::Tensor> own;
    own.reserve(held.size());
    for (const auto& t : held) {
      own.push_back(t.detach());  // shares t's storage: what t holds again afterwards
      at::Tensor whole = at::empty(shape(t), t.options().device(c10::kCPU));
      t.set_data(whole);
    }
    bool known = false;
    try {
      known = init(m);
    } catch (...) {
      for (std::size_t i = 0; i < held.size(); ++i) held[i].set_data(own[i]);
      throw;
    }
    for (std::size_t i = 0; i < held.size(); ++i) {
      const at::Tensor whole = held[i].detach();
      held[i].set_data(own[i]);
      if (known) keep(held[i], whole);
    }
    if (!known) {
      if (!unknown.empty()) unknown += ", ";
      unknown += "'" + item.key() + "' (" + m.name() + ")";
    }
  }
  if (!unknown.empty()) {
    throw Error("loom: no initializer knows the module(s) " + unknown +
                ", which hold parameters or buffers of their own: give rt.reset_parameters an "
                "initializer for them (loom::nn::Initializer; loom::nn::reset_parameters "
                "knows LibTorch's layers), or load their values from a checkpoint");
  }
}

}  // namespace loom::nn
