#pragma once
// What loom::Fsdp's files share (internal to the loom::dist library): a parameter cut on dim
// 0, a unit of parameters gathered and reduced together with its hooks, the collectives in
// flight, the strategy's state. fsdp.cpp: the strategy's hooks; fsdp_unit.cpp: the units
// (gathers, reshards, the autograd hooks, the reduce-scatters); fsdp_checkpoint.cpp: rt.save
// and rt.load.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <loom/dist/fsdp.hpp>
#include <loom/nn/fsdp_unit.hpp>

#include "group_state.hpp"

namespace loom::dist::detail {

/// The name in loom::Fsdp's errors.
inline constexpr std::string_view fsdp_who = "loom::Fsdp";

/// One parameter of a unit, cut on dim 0 (FSDP2's FSDPParam).
struct FsdpParam {
  at::Tensor param;            // the module's (and the optimizer's) parameter tensor
  std::vector<int64_t> sizes;  // its whole shape
  int64_t chunk = 0;           // c = ceil(d0 / world): the rows of every rank's padded piece
  int64_t local = 0;           // this rank's rows: clamp(d0 - rank * c, 0, c)
  int64_t row_numel = 1;       // the elements of one row
  at::Tensor padded;  // (c, ...): this rank's rows, then zero rows; the piece is its first rows
  // (world * c, ...): where the whole parameter lives while gathered. Its storage is kept and
  // emptied (0 bytes) while sharded: what the backward saved of the parameter (views such as
  // a Linear's weight.t()) shares it, and sees the data again once it is gathered again.
  at::Tensor whole;
  at::Tensor grad;         // the piece's gradient, put aside while the parameter is whole
  at::Tensor accumulated;  // the whole gradient summed over backwards under no_sync

  int64_t padded_numel() const { return chunk * row_numel; }
  std::vector<int64_t> shape(int64_t rows) const {
    auto s = sizes;
    s[0] = rows;
    return s;
  }
  at::Tensor piece() const { return padded.narrow(0, 0, local); }
};

/// An all-gather of a unit's pieces in flight, one per dtype (started by a prefetch or by the
/// unit itself, waited when the unit needs its parameters).
struct PendingGather {
  struct Part {
    std::vector<FsdpParam*> members;
    at::Tensor input, output;
    Work work;
  };
  std::vector<Part> parts;
};

/// A reduce-scatter of a unit's gradients in flight, one per dtype: it runs beside the backward
/// of the unit before it, and is waited for when that unit's starts (or the backward ends).
struct PendingReduce {
  struct Part {
    std::vector<FsdpParam*> members;
    c10::ScalarType dtype = c10::kFloat;
    at::Tensor input, output;
    bool received = false;  // output holds both ranks' parts (an all-to-all), not their sum
    Work work;
  };
  std::vector<Part> parts;
};

class Unit;

struct FsdpState {
  FsdpOptions options;
  ProcessGroup* group = nullptr;
  c10::Device device{c10::kCPU};             // setup's: where the pieces live
  std::vector<std::shared_ptr<Unit>> units;  // the root first
  std::vector<FsdpParam*> order;             // every parameter, in the module's order
  bool sync = true;                          // no no_sync guard lives
  int64_t unreduced_backwards = 0;           // backwards under no_sync since the last reduction
  std::vector<Unit*> forward_order;          // the units below the root, as this forward ran them
  std::vector<Unit*> last_order;             // and as the forward before it did (forward prefetch)
  Unit* in_flight = nullptr;                 // the unit whose reduce-scatter is in flight
  // The gloo group whose collectives an asynchronous DCP save's thread runs (made at the first
  // one; its thread holds it too, so it outlives the strategy until the write is done).
  std::shared_ptr<ProcessGroup> saves;

  ~FsdpState();
};

/// One unit: its parameters and whether they are whole (FSDP2's FSDPParamGroup with the
/// hooks of its FSDPState).
class Unit final : public nn::detail::UnitHooks, public std::enable_shared_from_this<Unit> {
 public:
  Unit(FsdpState& fsdp, std::string at, bool is_root)
      : path(std::move(at)), root(is_root), fsdp_(&fsdp) {}

  std::vector<at::Tensor> before_forward(std::vector<at::Tensor> inputs) override;
  void after_forward(const std::vector<at::Tensor>& outputs) override;

  /// The parameters whole: one all-gather per dtype of the pieces (cast to param_dtype),
  /// started here unless a prefetch started it.
  void unshard();
  /// Starts the all-gather of unshard() without waiting for it (`prefetch`: ahead of need).
  void start_unshard(bool prefetch);
  /// Waits for the reduce-scatters post_backward started and adds each piece's gradient to
  /// its parameter's.
  void finish_reduce();
  /// The parameters back to their pieces, the whole ones' storage emptied.
  void reshard();
  /// When the gradients reach the unit's outputs: gathered again, and the unit before it in
  /// the forward starts gathering (backward prefetch, one unit ahead).
  void pre_backward();
  /// When the backward has left the unit: its gradients reduce-scattered (or accumulated
  /// under no_sync), its parameters resharded.
  void post_backward();
  void detach() { fsdp_ = nullptr; }

  std::vector<FsdpParam> params;
  std::string path;
  bool root;
  bool unsharded = false;
  std::optional<PendingGather> gathering;
  std::optional<PendingReduce> reducing;
  std::size_t gathers = 0, prefetched = 0;  // all-gathers started, and by a prefetch

 private:
  c10::ScalarType gather_dtype(const FsdpParam& f) const;

  FsdpState* fsdp_;  // null once the strategy is gone: the hooks then do nothing
};

/// Each piece of `pieces` (a tensor laid out as the piece of its parameter: its rows of the
/// parameter's dim 0, the rest of the shape the parameter's) gathered whole on every rank:
/// one all-gather per dtype. For the parameters' own values and the optimizer's states of them.
std::vector<at::Tensor> gather_whole(ProcessGroup& group,
                                     const std::vector<std::pair<FsdpParam*, at::Tensor>>& pieces);

}  // namespace loom::dist::detail
