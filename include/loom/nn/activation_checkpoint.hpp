#pragma once
// Activation checkpointing: a part of the forward runs without keeping its activations, and
// runs again in backward to rebuild them (Python's torch.utils.checkpoint, which LibTorch lacks).
//
//   out = loom::activation_checkpoint(block, x);              // a module: its forward(x)
//   out = loom::activation_checkpoint(params, fn, x, mask);   // any callable over `params`
//   out = loom::checkpoint_sequential(seq, segments, x);      // Python's checkpoint_sequential
//
// The recomputation restores what the forward saw: the CPU generator's state and, when an
// input is on a CUDA device, that device's generator's (dropout draws the same mask), the
// autocast state of the CPU and CUDA (the same dtypes), and grad mode. The parameters the
// part uses are inputs of the checkpointed node, so their gradients reach them through the
// autograd engine (their AccumulateGrad nodes and hooks, Ddp's included), not from a nested
// backward: a parameter's gradient is the one the plain model gives, bit for bit.
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/ivalue.h>
#include <torch/autograd.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>

#include <loom/amp/autocast.hpp>
#include <loom/device/rng.hpp>
#include <loom/error.hpp>

namespace loom::nn {

namespace detail {

/// The part of the forward to run again: its inputs in, one tensor out.
using Recomputable = std::function<at::Tensor(const std::vector<at::Tensor>&)>;

/// What the forward ran under, to run it again the same way.
struct RecomputeState : torch::CustomClassHolder {
  Recomputable fn;
  std::size_t n_inputs = 0;
  at::Tensor cpu_rng;
  std::optional<c10::Device> cuda_device;  // the first CUDA input's device
  at::Tensor cuda_rng;
  bool cpu_autocast = false, cuda_autocast = false;
  c10::ScalarType cpu_dtype = c10::kBFloat16, cuda_dtype = c10::kHalf;
};

/// Sets the generators to the forward's states while alive, then back to where they were:
/// the recomputation's draws leave the training's random stream untouched.
class ForkedRng {
 public:
  explicit ForkedRng(const RecomputeState& s) : device_(s.cuda_device) {
    cpu_ = loom::device::get_rng_state(c10::Device(c10::kCPU));
    loom::device::set_rng_state(s.cpu_rng, c10::Device(c10::kCPU), kWho);
    if (device_) {
      cuda_ = loom::device::get_rng_state(*device_);
      loom::device::set_rng_state(s.cuda_rng, *device_, kWho);
    }
  }
  ~ForkedRng() {
    loom::device::set_rng_state(cpu_, c10::Device(c10::kCPU), kWho);
    if (device_) loom::device::set_rng_state(cuda_, *device_, kWho);
  }
  ForkedRng(const ForkedRng&) = delete;
  ForkedRng& operator=(const ForkedRng&) = delete;

 private:
  static constexpr const char* kWho = "loom::activation_checkpoint";
  std::optional<c10::Device> device_;
  at::Tensor cpu_, cuda_;
};

/// The checkpointed node: forward(state, inputs..., parameters...) runs the part without
/// grad; backward runs it again with grad and hands back the gradients of the inputs and
/// parameters that require them.
struct RecomputeNode : torch::autograd::Function<RecomputeNode> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx,
                            const c10::intrusive_ptr<RecomputeState>& state,
                            at::TensorList tensors) {
    RecomputeState& s = *state;
    s.cpu_rng = loom::device::get_rng_state(c10::Device(c10::kCPU));
    for (std::size_t i = 0; i < s.n_inputs; ++i) {
      if (tensors[i].defined() && tensors[i].is_cuda()) {
        s.cuda_device = tensors[i].device();
        s.cuda_rng = loom::device::get_rng_state(*s.cuda_device);
        break;
      }
    }
    s.cpu_autocast = loom::detail::autocast_enabled(c10::kCPU);
    s.cpu_dtype = loom::detail::autocast_dtype(c10::kCPU);
    s.cuda_autocast = loom::detail::autocast_enabled(c10::kCUDA);
    s.cuda_dtype = loom::detail::autocast_dtype(c10::kCUDA);
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    ctx->save_for_backward(tensors.vec());
    const std::vector<at::Tensor> inputs(tensors.begin(),
                                         tensors.begin() + static_cast<std::ptrdiff_t>(s.n_inputs));
    at::NoGradGuard no_grad;
    at::Tensor out = s.fn(inputs);
    if (!out.defined()) throw Error("loom::activation_checkpoint: the function returned no tensor");
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto state =
        c10::static_intrusive_pointer_cast<RecomputeState>(ctx->saved_data["state"].toCapsule());
    const RecomputeState& s = *state;
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    std::vector<at::Tensor> inputs;
    inputs.reserve(s.n_inputs);
    for (std::size_t i = 0; i < s.n_inputs; ++i) {
      const at::Tensor& t = saved[i];
      inputs.push_back(t.defined() ? t.detach().requires_grad_(t.requires_grad()) : t);
    }
    at::Tensor out;
    {
      ForkedRng rng(s);
      at::AutoGradMode grad(true);
      amp::AutocastGuard cpu(c10::kCPU, s.cpu_dtype, s.cpu_autocast);
      amp::AutocastGuard cuda(c10::kCUDA, s.cuda_dtype, s.cuda_autocast);
      out = s.fn(inputs);
    }
    // Gradients of what requires them: the detached inputs, then the parameters themselves.
    std::vector<at::Tensor> wrt;
    std::vector<std::size_t> where;
    for (std::size_t i = 0; i < saved.size(); ++i) {
      const at::Tensor& t = i < s.n_inputs ? inputs[i] : saved[i];
      if (t.defined() && t.requires_grad()) {
        wrt.push_back(t);
        where.push_back(i);
      }
    }
    // One slot per forward argument: the state (none), then each tensor.
    torch::autograd::variable_list grads(saved.size() + 1);
    if (wrt.empty() || !out.requires_grad()) return grads;
    const auto computed = torch::autograd::grad({out}, wrt, {grad_outputs[0]},
                                                /*retain_graph=*/false, /*create_graph=*/false,
                                                /*allow_unused=*/true);
    for (std::size_t k = 0; k < where.size(); ++k) grads[where[k] + 1] = computed[k];
    return grads;
  }
};

inline at::Tensor run_checkpointed(Recomputable fn, std::vector<at::Tensor> inputs,
                                   const std::vector<at::Tensor>& params) {
  auto state = c10::make_intrusive<RecomputeState>();
  state->fn = std::move(fn);
  state->n_inputs = inputs.size();
  torch::autograd::variable_list tensors = std::move(inputs);
  tensors.insert(tensors.end(), params.begin(), params.end());
  return RecomputeNode::apply(state, at::TensorList(tensors));  // a list: each one an input
}

}  // namespace detail

/// Runs `fn(inputs...)` (tensors in, one tensor out) without keeping its activations; backward
/// runs it again to rebuild them. `params`: the parameters fn uses (a module's
/// `parameters()`); their gradients arrive through the autograd engine as in the plain model.
/// A parameter fn uses but `params` omits gets no gradient. fn must be a function of its
/// inputs, the parameters, the RNG and the autocast state (all restored for the rerun).
template <class Fn, class... Inputs>
requires std::invocable<Fn&, const Inputs&...> at::Tensor activation_checkpoint(
    const std::vector<at::Tensor>& params, Fn fn, const Inputs&... inputs) {
  static_assert((std::same_as<Inputs, at::Tensor> && ...),
                "loom::activation_checkpoint: the inputs must be tensors");
  detail::Recomputable run = [fn = std::move(fn)](const std::vector<at::Tensor>& in) mutable {
    return [&]<std::size_t... I>(std::index_sequence<I...>) { return at::Tensor(fn(in[I]...)); }
    (std::index_sequence_for<Inputs...>{});
  };
  return detail::run_checkpointed(std::move(run), {inputs...}, params);
}

/// `module->forward(inputs...)` checkpointed: the module's parameters are the ones it uses.
/// `module` (a holder, a shared_ptr or a pointer) is copied: backward reruns it after this
/// call has returned, so a loop's local handle is fine; the module itself must live on.
template <class M, class... Inputs>
requires(!std::same_as<std::remove_cvref_t<M>, std::vector<at::Tensor>>) &&
    requires(M& m, const Inputs&... in) {
  m->forward(in...);
}
at::Tensor activation_checkpoint(M& module, const Inputs&... inputs) {
  return activation_checkpoint(
      module->parameters(),
      [handle = module](const auto&... in) mutable { return handle->forward(in...); }, inputs...);
}

/// Python's torch.utils.checkpoint.checkpoint_sequential: `seq`'s modules in `segments`
/// consecutive runs of equal length (the last takes the rest); every run but the last is
/// checkpointed, the last runs as usual. `segments` from 1 to the number of modules.
inline at::Tensor checkpoint_sequential(torch::nn::Sequential& seq, int64_t segments,
                                        const at::Tensor& input) {
  const auto n = static_cast<int64_t>(seq->size());
  if (segments < 1 || segments > n) {
    throw Error("loom::checkpoint_sequential: segments must be from 1 to the " + std::to_string(n) +
                " modules of the Sequential, got " + std::to_string(segments));
  }
  const int64_t size = n / segments;
  auto run = [&seq](int64_t first, int64_t last) {  // modules [first, last]
    // A copy of the holder: backward reruns the segment after this call has returned.
    return [held = seq, first, last](const at::Tensor& x) mutable {
      at::Tensor y = x;
      for (int64_t i = first; i <= last; ++i) y = held->begin()[i].forward(y);
      return y;
    };
  };
  at::Tensor x = input;
  int64_t end = -1;
  for (int64_t start = 0; start < size * (segments - 1); start += size) {
    end = start + size - 1;
    std::vector<at::Tensor> params;
    for (int64_t i = start; i <= end; ++i) {
      for (const auto& p : seq->ptr(static_cast<std::size_t>(i))->parameters()) params.push_back(p);
    }
    x = activation_checkpoint(params, run(start, end), x);
  }
  return run(end + 1, n - 1)(x);
}

}  // namespace loom::nn

// In loom::, where users write them.
namespace loom {
using nn::activation_checkpoint;
using nn::checkpoint_sequential;
}  // namespace loom
