#pragma once
// loom::Fsdp: fully sharded data parallelism as PyTorch's FSDP2 (`fully_shard`) shards a
// module: every parameter is cut on dim 0 into one piece per rank (torch.chunk's pieces, the
// last ones padded or empty), each rank keeps its piece between steps and the optimizer steps
// the pieces only; the forward and backward run on the whole parameters, gathered from every
// rank first; the gradients are averaged and each rank keeps its piece of them.
//
//   loom::Runtime<loom::Cpu, loom::Fp32, loom::Fsdp> rt;
//   rt.setup(model, optimizer);   // each parameter now this rank's piece (optimizer too)
//   auto loss = ...rt.forward(model, x)...;   // each unit's parameters gathered before it
//   rt.backward(loss, model);     // gradients reduce-scattered: this rank's piece, averaged
//   rt.optimizer_step(optimizer); // steps the pieces
//
// The units are FSDP2's: each loom::FsdpUnit<Block> inside the model (nn/fsdp_unit.hpp,
// Python's fully_shard(block)) and the root, the model itself, which holds every parameter no
// unit does (Python's fully_shard(model) last). A unit's parameters are gathered (one
// all-gather) when its forward starts, freed when it ends (reshard_after_forward), gathered
// again when the gradients reach its outputs, and reduce-scattered (one reduce-scatter) when
// the backward has passed its inputs; the root's are gathered by the runtime's forward and
// kept to the end of the backward, as FSDP2 keeps the root's. The collectives run beside the
// compute: the next unit's all-gather is prefetched one unit ahead (forward and backward) and
// a unit's reduce-scatter runs beside the backward of the unit before it. At most the root,
// the unit running and the one prefetched hold whole parameters; between steps a rank holds
// 1/world of the parameters, gradients and optimizer state. Declarations only:
// src/dist/fsdp.cpp (the loom::dist library).
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <loom/checkpoint/checkpoint_io.hpp>
#include <loom/concepts/strategy.hpp>
#include <loom/dist/process_group.hpp>
#include <loom/nn/empty_init.hpp>
#include <loom/nn/fsdp_unit.hpp>
#include <loom/state_dict.hpp>
#include <loom/step_result.hpp>

namespace loom::dist {

/// FSDP2's MixedPrecisionPolicy: the dtypes a unit computes and reduces in, while the
/// pieces (and so the optimizer) keep the parameters' own dtype.
struct MixedPrecisionPolicy {
  /// The dtype the pieces are cast to before the all-gather: the forward and backward run on
  /// whole parameters of this dtype (bf16: half the gather's bytes). None: their own.
  std::optional<c10::ScalarType> param_dtype;
  /// The dtype the gradients are reduced in (cast into the reduce-scatter's buffer; gradients
  /// accumulated under no_sync are summed in it), then cast to the pieces' dtype. None: the
  /// gradients' own.
  std::optional<c10::ScalarType> reduce_dtype;
  /// Each unit casts its floating-point tensor arguments to param_dtype before its forward.
  /// The root casts nothing (the runtime's forward gives the model its inputs as they are):
  /// a root whose own parameters meet the model's inputs first needs them in param_dtype, or
  /// the model made a unit itself (FsdpUnit<Net>: it casts, as Python's root does).
  bool cast_forward_inputs = true;
};

/// How rt.save writes Fsdp's pieces (FsdpOptions::checkpoint).
enum class FsdpCheckpoint {
  /// Every piece gathered whole, rank 0 writes one file in the layout one process writes
  /// (FSDP2's full state dict: Python's torch.load reads it).
  Consolidated,
  /// Each rank writes its own pieces (of the parameters and of the optimizer's states of
  /// them): rank 0 the main file (its pieces, every other entry, an index), every other rank
  /// one file beside it (checkpoint/shards.hpp, format 2). Nothing is gathered; every strategy
  /// loads it at any world size, an Fsdp rank reading only the files that hold its rows.
  Sharded,
  /// A torch.distributed.checkpoint directory at the path (checkpoint/dcp.hpp), as Python's
  /// dcp.save of get_state_dict(model, optimizer) writes it: each rank the chunks of its
  /// pieces in `__R_0.distcp`, rank 0 every other tensor and value and the `.metadata`; the
  /// optimizer's state keyed by the parameters' names. Staged beside the path and renamed
  /// into place. Python's dcp.load reads it into FSDP2 at any world size (and
  /// dcp_to_torch_save makes one file of it); every loom strategy's rt.load reads it.
  /// Checkpoints' {.async = true} copies now and writes in a thread (on a gloo group).
  Dcp,
};

/// loom::Fsdp's settings.
struct FsdpOptions {
  /// The process group's: the timeout of the rendezvous and every collective, the backend.
  GroupOptions group;
  /// FSDP2's reshard_after_forward: a unit frees its whole parameters when its forward ends
  /// and gathers them again for its backward (true), or keeps them to the end of its backward
  /// (false: one all-gather less per unit, the memory of the whole unit held meanwhile). The
  /// root always keeps them, as in FSDP2.
  bool reshard_after_forward = true;
  /// While a unit computes its forward, the all-gather of the unit that followed it in the
  /// last forward runs (FSDP2's set_modules_to_forward_prefetch, one unit ahead).
  bool forward_prefetch = true;
  /// While a unit computes its backward, the all-gather of the unit before it in the forward
  /// runs (FSDP2's default backward prefetch, one unit ahead).
  bool backward_prefetch = true;
  /// FSDP2's mp_policy (default: every unit in the parameters' own dtype).
  MixedPrecisionPolicy mixed_precision;
  /// rt.save's layout: one consolidated file, or each rank its pieces.
  FsdpCheckpoint checkpoint = FsdpCheckpoint::Consolidated;
};

/// One unit of a loom::Fsdp, as Fsdp::units() describes it.
struct FsdpUnitInfo {
  std::string path;             // in the module: "" for the root, "blocks.0"
  std::size_t parameters = 0;   // how many it holds
  std::size_t whole_bytes = 0;  // the bytes of its whole parameters held now (0: sharded)
  std::size_t gathers = 0;      // the all-gathers of its pieces so far
  std::size_t prefetched = 0;   // of those, the ones a prefetch started (ahead of the need)
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

/// Fully sharded data parallelism (PyTorch's FSDP2); see the top of this header. Every rank must
/// build the same module; setup broadcasts rank 0's parameters and buffers before sharding, as Ddp
/// does, so the ranks start from one model.
///
/// A rank's piece of a parameter of d0 rows: with c = ceil(d0 / world), the rows
/// [min(rank * c, d0), min((rank + 1) * c, d0)), as FSDP2's `to_local()`. The gradient of the
/// piece is (g_0 + ... + g_{W-1}) / W, the reduction FSDP2 makes (ReduceOp.AVG), so a run
/// equals Python's `fully_shard(model)` with the same optimizer bit for bit on 2 ranks.
class Fsdp : public GroupDefaults<Fsdp> {
 public:
  static constexpr std::string_view strategy() { return "fsdp"; }
  /// Every precision but 16-mixed, refused at compile time (its loss scaler would check each
  /// rank's pieces alone, and the ranks could disagree on skipping a step).
  static constexpr bool takes_precision(std::string_view precision) {
    return precision != "16-mixed";
  }
  /// A module built under loom::EmptyInit comes to setup on the meta device: each rank
  /// allocates only its pieces (and the buffers), uninitialized until rt.load or
  /// rt.reset_parameters.
  static constexpr bool takes_empty_modules = true;

  /// Reads and validates the environment; connects nothing yet (setup() does).
  Fsdp();
  explicit Fsdp(FsdpOptions options);
  Fsdp(Fsdp&&) noexcept;
  Fsdp& operator=(Fsdp&&) noexcept;
  ~Fsdp();

  /// Connects the group, broadcasts rank 0's parameters and buffers, finds the units (each
  /// FsdpUnit inside `module`, and the root: `module`), then keeps this rank's piece of every
  /// parameter (the module's parameter tensors, and so the optimizer's, hold the pieces from
  /// here on). A parameter belongs to the innermost unit holding it. A parameter of no
  /// dimension is a loom::Error.
  void setup(torch::nn::Module& module, c10::Device device, std::string_view backend);
  /// Gathers the root's parameters whole (one all-gather per dtype), unless they are whole.
  void pre_forward();
  /// `step` (the precision's backward), during which each unit's gradients are
  /// reduce-scattered as the backward leaves it; then those of every unit it did not leave
  /// through a tensor that requires grad (the root, a unit fed the data) and every unit's
  /// parameters back to their pieces. Under no_sync() the whole gradients accumulate instead.
  template <class Step>
  void backward(const at::Tensor& loss, Step&& step) {
    (void)loss;
    std::forward<Step>(step)();
    post_backward();
  }
  /// Gradient accumulation (FSDP2's set_requires_gradient_sync(False)): backwards within the
  /// guard's scope accumulate whole gradients locally (in reduce_dtype where the policy names
  /// one); the first backward after it reduces their sum once.
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

  /// rt.reset_parameters: rank 0's CPU generator state on every rank, then each module's
  /// whole values drawn by `init` on the CPU, one module at a time, each rank keeping its
  /// rows: the values one process gets, on every world size. A collective.
  void reset_parameters(torch::nn::Module& module, const nn::Initializer& init);

  const FsdpOptions& options() const;
  ProcessGroup& process_group() { return group_; }
  const ProcessGroup& process_group() const { return group_; }
  /// Whether the root's parameters are whole now (between a forward and the end of its
  /// backward).
  bool unsharded() const;
  /// The units, the root first, then each FsdpUnit in the module's order. Empty before setup.
  std::vector<FsdpUnitInfo> units() const;
  /// Every parameter whole (FSDP2's full_tensor()), in the module's order, as copies: a
  /// collective every rank calls (one all-gather per dtype).
  std::vector<at::Tensor> full_parameters();

  /// rt.save, consolidated (the default): one file (FSDP2's full state dict): every tensor of
  /// the module and optimizer entries that is a piece (a parameter, an optimizer state of its
  /// shape) gathered whole on every rank, rank 0 writes; the same file SingleProcess and Ddp
  /// write. Sharded (FsdpCheckpoint::Sharded): each rank writes its pieces, rank 0 the main
  /// file. Dcp (FsdpCheckpoint::Dcp): a DCP directory, each rank its chunks. Any strategy
  /// loads each at any world size. rt.load: any such file (of any
  /// strategy, at any world size; Zero's sharded ones merged) or DCP directory (loom's or
  /// Python's), each whole tensor cut to this rank's piece; of a sharded Fsdp file or a DCP
  /// directory, only this rank's rows are read, from the files that hold them.
  void save_checkpoint(const std::filesystem::path& path, const State& state,
                       const checkpoint::CheckpointIO& io);
  c10::IValue load_checkpoint(const std::filesystem::path& path, const State& state,
                              const checkpoint::CheckpointIO& io, c10::Device device);

  void teardown();

 private:
  void post_backward();
  void check_step_ready();
  GradNorm clip_pieces(torch::optim::Optimizer& optimizer, double max_norm, double norm_type);
  void save_sharded(const std::filesystem::path& path, const State& state,
                    const checkpoint::CheckpointIO& io);

  ProcessGroup group_;
  std::unique_ptr<detail::FsdpState> state_;
};

}  // namespace loom::dist

namespace loom {
using dist::Fsdp;
using dist::FsdpCheckpoint;
using dist::FsdpOptions;
using dist::FsdpUnitInfo;
using dist::MixedPrecisionPolicy;
}  // namespace loom
