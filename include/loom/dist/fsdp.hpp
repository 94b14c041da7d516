#pragma once
// loom::Fsdp: fully sharded data parallelism as PyTorch's FSDP2 (`fully_shard`) shards a
// module: every parameter is cut on dim 0 into one piece per rank (torch.chunk's pieces, the
// last ones padded or empty), each rank keeps its piece between steps and the optimizer steps
// the pieces only; the forward and backward run on the whole parameters, gathered from every
// rank first; the gradients are averaged and each rank keeps its piece of them.
//
//   loom::Runtime<loom::Cpu, loom::Fp32, loom::Fsdp> rt;
//   rt.setup(model, optimizer);   // each parameter now this rank's piece (optimizer too)
//   auto loss = ...rt.forward(model, x)...;   // the parameters gathered whole first
//   rt.backward(loss, model);     // gradients reduce-scattered: this rank's piece, averaged
//   rt.optimizer_step(optimizer); // steps the pieces
//
// This is FSDP2 with one unit, the root (Python's `fully_shard(model)` alone): the whole
// parameters live from the forward to the end of the backward, as the root's do in FSDP2
// (which does not reshard the root after its forward); between steps a rank holds 1/world of
// the parameters, gradients and optimizer state. Declarations only: src/dist/fsdp.cpp
// (the loom::dist library).
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <loom/checkpoint/checkpoint_io.hpp>
#include <loom/concepts/strategy.hpp>
#include <loom/dist/process_group.hpp>
#include <loom/state_dict.hpp>
#include <loom/step_result.hpp>

namespace loom::dist {

/// loom::Fsdp's settings.
struct FsdpOptions {
  /// The process group's: the timeout of the rendezvous and every collective, the backend.
  GroupOptions group;
};

namespace detail {
struct FsdpState;  // src/dist/fsdp.cpp
}

/// Restores gradient synchronization when it goes out of scope (Fsdp::no_sync()).
class FsdpNoSync {
 public:
  explicit FsdpNoSync(bool& sync) : sync_(&sync), previous_(sync) { sync = false; }
  FsdpNoSync(const FsdpNoSync&) = delete;
  FsdpNoSync& operator=(const FsdpNoSync&) = delete;
  ~FsdpNoSync() { *sync_ = previous_; }

 private:
  bool* sync_;
  bool previous_;
};

/// Fully sharded data parallelism (PyTorch's FSDP2, the root as the one unit); see the top of
/// this header. Every rank must build the same module; setup broadcasts rank 0's parameters
/// and buffers before sharding, as Ddp does, so the ranks start from one model.
///
/// A rank's piece of a parameter of d0 rows: with c = ceil(d0 / world), the rows
/// [min(rank * c, d0), min((rank + 1) * c, d0)), as FSDP2's `to_local()`. The gradient of the
/// piece is (g_0 + ... + g_{W-1}) / W, the reduction FSDP2 makes (ReduceOp.AVG), so a run
/// equals Python's `fully_shard(model)` with the same optimizer bit for bit on 2 ranks.
class Fsdp : public GroupDefaults<Fsdp> {
 public:
  static constexpr std::string_view strategy() { return "fsdp"; }

  /// Reads and validates the environment; connects nothing yet (setup() does).
  Fsdp();
  explicit Fsdp(FsdpOptions options);
  Fsdp(Fsdp&&) noexcept;
  Fsdp& operator=(Fsdp&&) noexcept;
  ~Fsdp();

  /// Connects the group, broadcasts rank 0's parameters and buffers, then keeps this rank's
  /// piece of every parameter (the module's parameter tensors, and so the optimizer's, hold
  /// the pieces from here on). A parameter of no dimension is a loom::Error.
  void setup(torch::nn::Module& module, c10::Device device, std::string_view backend);
  /// Gathers every parameter whole (one all-gather), unless they are whole already.
  void pre_forward();
  /// `step` (the precision's backward) on the whole parameters, then the gradients
  /// reduce-scattered (each rank keeps its piece, averaged) and the parameters cut to their
  /// pieces again; under no_sync() the whole gradients accumulate instead, and the
  /// parameters stay whole.
  template <class Step>
  void backward(const at::Tensor& loss, Step&& step) {
    (void)loss;
    std::forward<Step>(step)();
    post_backward();
  }
  /// Gradient accumulation (FSDP2's set_requires_gradient_sync(False)): backwards within the
  /// guard's scope accumulate whole gradients locally; the first backward after it reduces
  /// their sum once.
  [[nodiscard]] FsdpNoSync no_sync();

  /// The precision's step on the pieces. A step while the gradients are not reduced (every
  /// backward since the last step under no_sync) is a loom::Error.
  template <class Unscale, class Step>
  auto optimizer_step(Optimizers, Unscale&&, Step&& step) {
    check_step_ready();
    return std::forward<Step>(step)();
  }
  /// The total norm over every rank's gradient pieces, as torch.nn.utils.clip_grad_norm_
  /// computes it on FSDP2's sharded gradients (each piece's norm, their squares summed over
  /// the ranks in one all-reduce); the pieces scaled by min(max_norm / (norm + 1e-6), 1).
  /// norm_type 2 only.
  template <class Clip>
  GradNorm clip_gradients(torch::optim::Optimizer& optimizer, double max_norm, double norm_type,
                          Clip&&) {
    return clip_pieces(optimizer, max_norm, norm_type);
  }

  const FsdpOptions& options() const;
  ProcessGroup& process_group() { return group_; }
  const ProcessGroup& process_group() const { return group_; }
  /// Whether the parameters are whole now (between a forward and the end of its backward).
  bool unsharded() const;
  /// Every parameter whole (FSDP2's full_tensor()), in the module's order, as copies: a
  /// collective every rank calls (one all-gather per dtype).
  std::vector<at::Tensor> full_parameters();

  /// rt.save and rt.load: not yet (a loom::Error naming the strategy).
  void save_checkpoint(const std::filesystem::path& path, const State& state,
                       const checkpoint::CheckpointIO& io);
  c10::IValue load_checkpoint(const std::filesystem::path& path, const State& state,
                              const checkpoint::CheckpointIO& io, c10::Device device);

  void teardown();

 private:
  void post_backward();
  void check_step_ready();
  GradNorm clip_pieces(torch::optim::Optimizer& optimizer, double max_norm, double norm_type);

  ProcessGroup group_;
  std::unique_ptr<detail::FsdpState> state_;
};

}  // namespace loom::dist

namespace loom {
using dist::Fsdp;
using dist::FsdpOptions;
}  // namespace loom
