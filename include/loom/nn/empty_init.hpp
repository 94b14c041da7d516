#pragma once
// Modules built without their memory (Fabric's init_module(empty_init=True), Python's
// `with torch.device("meta")`): inside a loom::EmptyInit scope every tensor a module's
// constructor makes (its parameters, its buffers, their initialization) is a meta tensor, a
// shape and a dtype with no storage, built in microseconds. rt.setup gives them memory on the
// device (loom::Fsdp only this rank's pieces); their values come from rt.load (a checkpoint:
// under Fsdp read piece by piece) or from rt.reset_parameters (the modules' own initializers):
//
//   torch::nn::Sequential model{nullptr};
//   {
//     loom::EmptyInit empty;                 // nothing allocated, nothing initialized
//     model = make_model();
//   }
//   rt.setup(model, optimizer);              // memory, no values yet: forward refuses to run
//   rt.load("model.pt", state);              // or rt.reset_parameters(model)
//
// materialize and init_each are what the runtime and the strategies call. Declarations and the
// guard; src/nn/empty_init.cpp.
#include <cstdint>
#include <functional>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/DispatchKey.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

namespace torch::nn {
class Module;
}

namespace loom::nn {

/// While alive, every tensor made on this thread is a meta tensor (no storage): factories and
/// the in-place initializers dispatch to their meta kernels, which draw no random numbers.
/// Only module construction belongs inside: an operation that reads data (a copy from a real
/// tensor, .item()) fails there.
class EmptyInit {
 public:
  EmptyInit() = default;
  EmptyInit(const EmptyInit&) = delete;
  EmptyInit& operator=(const EmptyInit&) = delete;

 private:
  // Factories reach their backend through BackendSelect, which dispatches by their options
  // (CPU) whatever is included: excluded, the Meta key included here decides.
  c10::impl::ExcludeDispatchKeyGuard no_backend_select_{c10::DispatchKey::BackendSelect};
  c10::impl::IncludeDispatchKeyGuard meta_{c10::DispatchKey::Meta};
};

/// Whether `module` has a parameter or buffer on the meta device.
bool has_meta_tensors(const torch::nn::Module& module);

/// `t` (a meta tensor) given `real`'s storage, device, sizes and strides in place: its
/// TensorImpl, and so every holder of it (the module's member, its parameter list, an
/// optimizer built over it), is a tensor on `real`'s device from here on.
void adopt_storage(const at::Tensor& t, const at::Tensor& real);

/// Every meta parameter and buffer of `module` given uninitialized memory on `device`, in
/// place (Python's module.to_empty(device)); the others are left as they are.
void materialize(torch::nn::Module& module, c10::Device device);

/// An initializer of one module's own parameters and buffers (not its children's): true when
/// it knew the module and set them.
using Initializer = std::function<bool(torch::nn::Module&)>;

/// LibTorch's layers' own initialization, as their constructors run it: reset_parameters() of
/// Linear, Bilinear, Conv1d/2d/3d, ConvTranspose1d/2d/3d, Embedding, EmbeddingBag, LayerNorm,
/// GroupNorm, BatchNorm1d/2d/3d and InstanceNorm1d/2d/3d (their running statistics reset
/// too). False for any other module.
bool reset_parameters(torch::nn::Module& module);

/// Where the whole value of a parameter or buffer goes once its module is initialized: `keep`
/// gets the tensor the module holds and the whole value (on the CPU).
using KeepWhole = std::function<void(const at::Tensor& held, const at::Tensor& whole)>;
/// The whole shape of a tensor a module holds (a piece under loom::Fsdp).
using WholeShape = std::function<std::vector<int64_t>(const at::Tensor& held)>;

/// Runs `init` on every module of `root` (root.named_modules(): registration order, the order
/// in which their constructors ran) that holds parameters or buffers of its own, each on
/// whole CPU tensors of their dtype made for it alone (`shape`: a piece's whole shape), then
/// hands each whole value to `keep` and frees it: at most one module's tensors are whole at a
/// time. With LibTorch's layers, seeded as before building the model, the values are those
/// the model built normally gets. Modules `init` does not know are one loom::Error naming them
/// (path and type), thrown after the others were initialized and kept.
void init_each(torch::nn::Module& root, const Initializer& init, const WholeShape& shape,
               const KeepWhole& keep);

}  // namespace loom::nn

namespace loom {
using nn::EmptyInit;
}  // namespace loom
