#pragma once
// loom::cuda::GraphedStep: a whole training step (forward, backward, clip, optimizer step)
// captured once as a CUDA graph over static input buffers and replayed for every batch; on the
// CPU the same step runs eagerly over the same buffers. Not in <loom/loom.hpp> (it brings the
// CUDA graph headers): #include <loom/cuda/graphed_step.hpp>.
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <loom/optim/fused.hpp>
#include <loom/step_result.hpp>

namespace loom::cuda {

/// GraphedStep's settings.
struct GraphedStepOptions {
  /// Eager steps before the capture, each a real step on its batch (on a side stream on
  /// CUDA, as Python's recipe): they make the optimizer state, the loss scaler's tensors and
  /// the libraries' workspaces, which must exist before capture. At least 1.
  int warmup_steps = 3;
};

/// A training step replayed as one CUDA graph (Python's `torch.cuda.graph` recipe, on
/// LibTorch's at::cuda::CUDAGraph):
///
///   auto x = torch::zeros({64, 784}, cuda), y = torch::zeros({64}, cuda.dtype(torch::kLong));
///   loom::cuda::GraphedStep step(rt, {x, y}, {opt}, [&](const std::vector<at::Tensor>& in) {
///     at::Tensor loss = loss_fn(rt.forward(model, in[0]), in[1]);
///     rt.backward(loss, model);
///     rt.clip_gradients(opt, 1.0);          // on the device: no host sync
///     rt.optimizer_step(opt);               // 16-mixed: skips on the device
///     return loss;
///   });
///   for (auto& [xb, yb] : batches) { at::Tensor loss = step({xb, yb}); schedule.step(); }
///
/// Each call copies the batch into the static inputs, then runs the step: eagerly for the
/// first `warmup_steps` calls, captured on the next (into a private memory pool, the default
/// CUDA generator registered so dropout draws anew at every replay) and replayed from then on.
/// Every call is one real step, so N calls equal N eager steps. The optimizers' gradients are
/// set to none before every eager step and before the capture (the graph's backward then
/// writes them afresh at every replay): the step must not zero them itself.
///
/// The step must not read the device on the host: anything that does (a LibTorch optimizer
/// under 16-mixed, `.item()`, LibTorch's clip_grad_norm_) fails the capture with a loom::Error
/// naming the op. The optimizers must be loom::optim fused ones: GraphedStep switches them to
/// a learning rate on the device (FusedOptimizer::set_tensor_lr) and writes each group's lr
/// into it before every step, outside the graph, so any LR schedule keeps working. One
/// process only (Ddp's all-reduces are launched by the reducer's hooks, which a replay would
/// not run). On the CPU there is no graph: every call is an eager step over the same static
/// buffers, so the discipline (static inputs, no zero_grad in the step, the lr on the device)
/// is testable anywhere.
class GraphedStep {
 public:
  using Step = std::function<at::Tensor(const std::vector<at::Tensor>& inputs)>;

  /// `inputs`: the static input buffers, all on the runtime's device; `optimizers`: those the
  /// step steps; `step`: the step, called with `inputs`, returning its output (the loss).
  template <class Runtime>
  GraphedStep(Runtime& rt, std::vector<at::Tensor> inputs,
              std::initializer_list<OptimizerRef> optimizers, Step step,
              GraphedStepOptions options = {})
      : GraphedStep(rt.strategy().world_size(), std::move(inputs),
                    std::vector<OptimizerRef>(optimizers), std::move(step), options) {}

  GraphedStep(int world_size, std::vector<at::Tensor> inputs, std::vector<OptimizerRef> optimizers,
              Step step, GraphedStepOptions options = {});
  ~GraphedStep();
  GraphedStep(GraphedStep&&) noexcept;
  GraphedStep& operator=(GraphedStep&&) noexcept;
  GraphedStep(const GraphedStep&) = delete;
  GraphedStep& operator=(const GraphedStep&) = delete;

  /// One step on `batch` (each tensor the shape and dtype of its static input; any device):
  /// returns the step's output. On CUDA after the capture that is the graph's static tensor,
  /// overwritten by the next step: clone it to keep it.
  const at::Tensor& operator()(const std::vector<at::Tensor>& batch);

  /// Whether the step has been captured (CUDA, after warmup_steps calls).
  bool captured() const noexcept;
  /// The steps run so far.
  std::int64_t steps() const noexcept;
  /// The static input buffers.
  const std::vector<at::Tensor>& inputs() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom::cuda
