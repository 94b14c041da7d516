// loom::Fsdp (include/loom/dist/fsdp.hpp): a module's parameters cut into one piece per rank
// as FSDP2 cuts them, gathered whole unit by unit for the forward and backward, their
// gradients reduce-scattered back into pieces as the backward leaves each unit.
#include <loom/dist/fsdp.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/strides.h>
#include <torch/autograd.h>

#include <loom/checkpoint/mapped.hpp>
#include <loom/detail/agree_on_failure.hpp>
#include <loom/error.hpp>
#include <loom/nn/fsdp_unit.hpp>
#include <loom/state/entry.hpp>

#include "group_state.hpp"

namespace loom::dist {

namespace detail {

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
    Work work;
  };
  std::vector<Part> parts;
};

class Unit;

struct FsdpState {
  FsdpOptions options;
  ProcessGroup* group = nullptr;
  std::vector<std::shared_ptr<Unit>> units;  // the root first
  std::vector<FsdpParam*> order;             // every parameter, in the module's order
  bool sync = true;                          // no no_sync guard lives
  int64_t unreduced_backwards = 0;           // backwards under no_sync since the last reduction
  std::vector<Unit*> forward_order;          // the units below the root, as this forward ran them
  std::vector<Unit*> last_order;             // and as the forward before it did (forward prefetch)
  Unit* in_flight = nullptr;                 // the unit whose reduce-scatter is in flight

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

FsdpState::~FsdpState() {
  for (auto& u : units) u->detach();
}

/// The unit a post-backward node reduces, if it is still alive.
struct UnitHandle : torch::CustomClassHolder {
  std::weak_ptr<Unit> unit;
};

/// FSDP2's RegisterPostBackwardFunction: an identity on the unit's inputs whose backward runs
/// when every gradient of the unit's forward has been computed (it was the first node of the
/// unit's graph, so it runs last), and reduces them.
struct PostBackwardNode : torch::autograd::Function<PostBackwardNode> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const c10::intrusive_ptr<UnitHandle>& unit,
                                                at::TensorList inputs) {
    ctx->saved_data["unit"] = c10::IValue::make_capsule(unit);
    return inputs.vec();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto handle =
        c10::static_intrusive_pointer_cast<UnitHandle>(ctx->saved_data["unit"].toCapsule());
    if (auto unit = handle->unit.lock()) unit->post_backward();
    torch::autograd::variable_list out;
    out.reserve(grads.size() + 1);
    out.emplace_back();  // the handle's
    for (auto& g : grads) out.push_back(std::move(g));
    return out;
  }
};

}  // namespace detail

namespace {

constexpr std::string_view who = "loom::Fsdp";

using detail::FsdpParam;
using detail::FsdpState;
using detail::Unit;

/// Every parameter of `module` once (a parameter shared by two submodules is one).
std::vector<at::Tensor> unique_parameters(torch::nn::Module& module) {
  std::vector<at::Tensor> out;
  std::unordered_set<const void*> seen;
  for (auto& p : module.parameters(/*recurse=*/true)) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
  }
  return out;
}

/// Empties a storage (FSDP2's untyped_storage().resize_(0)), or gives it `bytes` again from
/// its allocator; the tensors that share it see its new data.
void resize_storage(const at::Tensor& t, std::size_t bytes) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  if (bytes == 0) {
    storage->set_data_ptr_noswap(c10::DataPtr(nullptr, storage->device()));
  } else {
    storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  }
  storage->set_nbytes(bytes);
}

/// Starts gathering the pieces of `params`: for each dtype (of `dtype_of(f)`), every rank's
/// padded pieces cast to it, back to back, one all-gather (asynchronous).
template <class DtypeOf>
detail::PendingGather start_gather(ProcessGroup& group, const std::vector<FsdpParam*>& params,
                                   DtypeOf dtype_of) {
  const int world = group.world_size();
  at::NoGradGuard no_grad;
  std::vector<c10::ScalarType> dtypes;
  for (const auto* f : params) {
    if (std::find(dtypes.begin(), dtypes.end(), dtype_of(*f)) == dtypes.end()) {
      dtypes.push_back(dtype_of(*f));
    }
  }
  detail::PendingGather out;
  for (const auto dtype : dtypes) {
    detail::PendingGather::Part part;
    int64_t numel = 0;
    for (auto* f : params) {
      if (dtype_of(*f) != dtype) continue;
      part.members.push_back(f);
      numel += f->padded_numel();
    }
    part.input = at::empty({numel}, part.members.front()->padded.options().dtype(dtype));
    int64_t at = 0;
    for (const auto* f : part.members) {
      part.input.narrow(0, at, f->padded_numel()).view(f->shape(f->chunk)).copy_(f->padded);
      at += f->padded_numel();
    }
    part.output = at::empty({numel * world}, part.input.options());
    detail::GroupState& state = group.state();
    if (!state.group) {
      part.output.copy_(part.input);
    } else {
      try {
        part.work = detail::all_gather_into(state, part.output, part.input);
      } catch (...) {
        group.fail("all_gather_into", std::current_exception());
      }
    }
    out.parts.push_back(std::move(part));
  }
  return out;
}

/// Waits for `work` (none when the group has no c10d group: the copy was made); a failure is
/// the group's, naming `what`.
void wait(ProcessGroup& group, detail::Work& work, std::string_view what) {
  if (!work.get()) return;
  try {
    work.wait();
  } catch (...) {
    group.fail(what, std::current_exception());
  }
}

/// Waits for `pending`; `take(f, part)` receives each parameter's (world, c * row) part of
/// the result, rank after rank, which read row by row is the whole parameter followed by the
/// padding rows.
template <class Take>
void finish_gather(ProcessGroup& group, detail::PendingGather& pending, Take take) {
  const int world = group.world_size();
  at::NoGradGuard no_grad;
  for (auto& part : pending.parts) {
    wait(group, part.work, "all_gather_into");
    const at::Tensor by_rank = part.output.view({world, part.input.numel()});
    int64_t at = 0;
    for (auto* f : part.members) {
      take(*f, by_rank.narrow(1, at, f->padded_numel()));
      at += f->padded_numel();
    }
  }
}

/// The pieces of `params` gathered (start_gather, then finish_gather).
template <class DtypeOf, class Take>
void gather_pieces(ProcessGroup& group, const std::vector<FsdpParam*>& params, DtypeOf dtype_of,
                   Take take) {
  auto pending = start_gather(group, params, dtype_of);
  finish_gather(group, pending, take);
}

std::vector<FsdpParam*> pointers(std::vector<FsdpParam>& params) {
  std::vector<FsdpParam*> out;
  out.reserve(params.size());
  for (auto& f : params) out.push_back(&f);
  return out;
}

/// Each piece of `pieces` (a tensor laid out as the piece of its parameter: its rows of the
/// parameter's dim 0, the rest of the shape the parameter's) gathered whole on every rank:
/// one all-gather per dtype. For the parameters' own values and the optimizer's states of them.
std::vector<at::Tensor> gather_whole(ProcessGroup& group,
                                     const std::vector<std::pair<FsdpParam*, at::Tensor>>& pieces) {
  const int world = group.world_size();
  at::NoGradGuard no_grad;
  // Each piece padded to its parameter's c rows, as the parameters' own pieces are.
  std::vector<FsdpParam> padded;
  padded.reserve(pieces.size());
  for (const auto& [f, t] : pieces) {
    FsdpParam g = *f;
    g.padded = at::zeros(f->shape(f->chunk), t.options());
    if (f->local > 0) g.padded.narrow(0, 0, f->local).copy_(t);
    padded.push_back(std::move(g));
  }
  std::unordered_map<const FsdpParam*, at::Tensor> whole;
  gather_pieces(
      group, pointers(padded), [](const FsdpParam& f) { return f.padded.scalar_type(); },
      [&](FsdpParam& f, const at::Tensor& part) {
        at::Tensor w = at::empty(f.shape(f.chunk * world), part.options());
        w.view({world, f.padded_numel()}).copy_(part);
        whole.emplace(&f, w.narrow(0, 0, f.sizes[0]));
      });
  std::vector<at::Tensor> out;
  out.reserve(padded.size());
  for (const auto& g : padded) out.push_back(whole.at(&g));
  return out;
}

}  // namespace

namespace detail {

c10::ScalarType Unit::gather_dtype(const FsdpParam& f) const {
  const auto own = f.padded.scalar_type();
  const auto param_dtype = fsdp_->options.mixed_precision.param_dtype;
  return param_dtype && at::isFloatingType(own) ? *param_dtype : own;
}

void Unit::start_unshard(bool prefetch) {
  if (unsharded || gathering || fsdp_ == nullptr || params.empty()) return;
  ++gathers;
  if (prefetch) ++prefetched;
  gathering = start_gather(*fsdp_->group, pointers(params),
                           [this](const FsdpParam& f) { return gather_dtype(f); });
}

void Unit::unshard() {
  if (unsharded || fsdp_ == nullptr) return;
  if (params.empty()) {
    unsharded = true;
    return;
  }
  start_unshard(/*prefetch=*/false);
  const int world = fsdp_->group->world_size();
  finish_gather(*fsdp_->group, *gathering, [&](FsdpParam& f, const at::Tensor& part) {
    const auto dtype = part.scalar_type();
    if (!f.whole.defined() || f.whole.scalar_type() != dtype) {
      f.whole = at::empty(f.shape(f.chunk * world), part.options());
    } else if (f.whole.storage().nbytes() == 0) {
      resize_storage(f.whole, static_cast<std::size_t>(f.whole.numel()) * f.whole.itemsize());
    }
    f.whole.view({world, f.padded_numel()}).copy_(part);
  });
  gathering.reset();
  at::NoGradGuard no_grad;
  for (auto& f : params) {
    f.grad = f.param.grad();  // the piece's gradient (accumulating over steps), put aside
    if (f.grad.defined()) f.param.mutable_grad() = at::Tensor();
    f.param.set_data(f.whole.narrow(0, 0, f.sizes[0]));
  }
  unsharded = true;
}

void Unit::reshard() {
  if (gathering && fsdp_ != nullptr) {  // a prefetch nobody used: waited for, dropped
    finish_gather(*fsdp_->group, *gathering, [](FsdpParam&, const at::Tensor&) {});
    gathering.reset();
  }
  if (!unsharded) return;
  at::NoGradGuard no_grad;
  for (auto& f : params) {
    if (f.param.grad().defined()) f.param.mutable_grad() = at::Tensor();  // a whole one: dropped
    f.param.set_data(f.piece());
    if (f.grad.defined()) f.param.mutable_grad() = std::exchange(f.grad, at::Tensor());
    if (f.whole.defined() && f.whole.storage().nbytes() != 0) resize_storage(f.whole, 0);
  }
  unsharded = false;
}

std::vector<at::Tensor> Unit::before_forward(std::vector<at::Tensor> inputs) {
  if (fsdp_ == nullptr) return inputs;
  unshard();
  if (!root) {
    // Forward prefetch, one unit ahead: the unit that followed this one in the last forward
    // starts gathering while this one computes.
    auto& s = *fsdp_;
    const std::size_t at = s.forward_order.size();
    s.forward_order.push_back(this);
    if (s.options.forward_prefetch && at + 1 < s.last_order.size() && s.last_order[at] == this) {
      s.last_order[at + 1]->start_unshard(/*prefetch=*/true);
    }
  }
  const auto& policy = fsdp_->options.mixed_precision;
  if (policy.param_dtype && policy.cast_forward_inputs) {
    for (auto& t : inputs) {
      if (t.defined() && at::isFloatingType(t.scalar_type()) &&
          t.scalar_type() != *policy.param_dtype) {
        t = t.to(*policy.param_dtype);
      }
    }
  }
  if (root || !at::GradMode::is_enabled()) return inputs;
  // The inputs that require grad pass through the node that reduces the unit's gradients.
  std::vector<std::size_t> where;
  std::vector<at::Tensor> joined;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].defined() && inputs[i].requires_grad()) {
      where.push_back(i);
      joined.push_back(inputs[i]);
    }
  }
  if (joined.empty()) return inputs;  // reduced after the backward (Fsdp::post_backward)
  auto handle = c10::make_intrusive<UnitHandle>();
  handle->unit = weak_from_this();
  auto out = PostBackwardNode::apply(handle, at::TensorList(joined));
  for (std::size_t k = 0; k < where.size(); ++k) inputs[where[k]] = std::move(out[k]);
  return inputs;
}

void Unit::after_forward(const std::vector<at::Tensor>& outputs) {
  if (fsdp_ == nullptr || root) return;
  if (fsdp_->options.reshard_after_forward) reshard();
  if (!at::GradMode::is_enabled()) return;
  std::weak_ptr<Unit> self = weak_from_this();
  for (const auto& t : outputs) {
    if (!t.defined() || !t.requires_grad()) continue;
    t.register_hook([self](const at::Tensor&) {
      if (auto unit = self.lock()) unit->pre_backward();
    });
  }
}

void Unit::post_backward() {
  if (!unsharded || fsdp_ == nullptr) return;
  ProcessGroup& group = *fsdp_->group;
  const auto reduce_dtype = fsdp_->options.mixed_precision.reduce_dtype;
  at::NoGradGuard no_grad;
  if (!fsdp_->sync) {  // FSDP2's set_requires_gradient_sync(False): the whole gradients summed
    for (auto& f : params) {
      at::Tensor g = std::exchange(f.param.mutable_grad(), at::Tensor());
      if (!g.defined()) continue;
      if (f.accumulated.defined()) {
        f.accumulated.add_(g);
      } else {
        f.accumulated = reduce_dtype && g.scalar_type() != *reduce_dtype ? g.to(*reduce_dtype) : g;
      }
    }
    reshard();
    return;
  }
  // The whole gradients to reduce: the one this backward computed, added to what earlier
  // backwards under no_sync accumulated.
  std::vector<FsdpParam*> with_grad;
  std::vector<at::Tensor> grads;
  for (auto& f : params) {
    at::Tensor g = std::exchange(f.param.mutable_grad(), at::Tensor());
    if (f.accumulated.defined()) {
      if (g.defined()) f.accumulated.add_(g);
      g = std::exchange(f.accumulated, at::Tensor());
    }
    if (!g.defined()) continue;
    with_grad.push_back(&f);
    grads.push_back(std::move(g));
  }
  reshard();  // the pieces' earlier gradients are back on the parameters
  // At most one reduce-scatter in flight, as FSDP2 keeps it: the one before this unit's ran
  // beside this unit's backward; waited for now, its buffers freed.
  if (fsdp_->in_flight != nullptr && fsdp_->in_flight != this) fsdp_->in_flight->finish_reduce();
  fsdp_->in_flight = this;
  const int world = group.world_size();
  // One reduce-scatter per dtype: row r of the input is every gradient's rows of rank r's
  // piece (zero rows past the end), as FSDP2's chunk_cat lays them out. Started here, waited
  // for at the end of the backward (finish_reduce).
  std::vector<c10::ScalarType> dtypes;
  auto dtype_of = [&](std::size_t i) { return reduce_dtype.value_or(grads[i].scalar_type()); };
  for (std::size_t i = 0; i < grads.size(); ++i) {
    if (std::find(dtypes.begin(), dtypes.end(), dtype_of(i)) == dtypes.end()) {
      dtypes.push_back(dtype_of(i));
    }
  }
  if (!reducing) reducing.emplace();
  for (const auto dtype : dtypes) {
    PendingReduce::Part part;
    part.dtype = dtype;
    std::vector<std::size_t> members;
    int64_t numel = 0;
    for (std::size_t i = 0; i < grads.size(); ++i) {
      if (dtype_of(i) != dtype) continue;
      members.push_back(i);
      part.members.push_back(with_grad[i]);
      numel += with_grad[i]->padded_numel();
    }
    part.input = at::empty({world, numel}, grads[members.front()].options().dtype(dtype));
    int64_t at = 0;
    for (const auto i : members) {
      const FsdpParam& f = *with_grad[i];
      const at::Tensor g = grads[i].reshape({-1});
      for (int r = 0; r < world; ++r) {
        const int64_t rows = std::clamp<int64_t>(f.sizes[0] - r * f.chunk, 0, f.chunk);
        at::Tensor dst = part.input[r].narrow(0, at, f.padded_numel());
        const int64_t n = rows * f.row_numel;
        if (n > 0) dst.narrow(0, 0, n).copy_(g.narrow(0, r * f.chunk * f.row_numel, n));
        if (n < f.padded_numel()) dst.narrow(0, n, f.padded_numel() - n).zero_();
      }
      at += f.padded_numel();
    }
    for (const auto i : members) grads[i] = at::Tensor();  // copied in: freed
    part.output = at::empty({numel}, part.input.options());
    detail::GroupState& state = group.state();
    if (!state.group) {
      part.output.copy_(part.input.view({-1}));  // one rank: the mean of one
    } else {
      try {
        at::Tensor flat = part.input.view({-1});
        part.work = detail::reduce_scatter(state, part.output, flat, ReduceOp::Sum);
      } catch (...) {
        group.fail("reduce_scatter", std::current_exception());
      }
    }
    reducing->parts.push_back(std::move(part));
  }
}

void Unit::finish_reduce() {
  if (!reducing || fsdp_ == nullptr) return;
  if (fsdp_->in_flight == this) fsdp_->in_flight = nullptr;
  ProcessGroup& group = *fsdp_->group;
  const int world = group.world_size();
  PendingReduce pending = std::move(*reducing);
  reducing.reset();
  at::NoGradGuard no_grad;
  for (auto& part : pending.parts) {
    if (part.work.get()) {
      wait(group, part.work, "reduce_scatter");
      part.output.div_(world);  // the mean: the sum over the ranks, then / world, as gloo's AVG
    }
    part.input = at::Tensor();
    const at::Tensor& output = part.output;
    int64_t at = 0;
    for (FsdpParam* f : part.members) {
      const auto shape = f->shape(f->local);
      at::Tensor piece_grad;
      if (part.dtype == f->padded.scalar_type()) {
        // The piece's part of the output, not a view of it (an optimizer's zero_grad detaches
        // gradients in place, which a view refuses): its storage, at its offset.
        piece_grad = at::empty({0}, output.options());
        piece_grad.set_(output.storage(), output.storage_offset() + at, shape,
                        c10::contiguous_strides(shape));
      } else {
        piece_grad =
            output.narrow(0, at, f->local * f->row_numel).to(f->padded.scalar_type()).view(shape);
      }
      at += f->padded_numel();
      at::Tensor& current = f->param.mutable_grad();
      if (current.defined()) {
        current.add_(piece_grad);
      } else {
        current = piece_grad;
      }
    }
  }
}

void Unit::pre_backward() {
  unshard();
  if (fsdp_ == nullptr || !fsdp_->options.backward_prefetch) return;
  const auto& order = fsdp_->forward_order;
  const auto it = std::find(order.begin(), order.end(), this);
  if (it != order.end() && it != order.begin()) (*(it - 1))->start_unshard(/*prefetch=*/true);
}

}  // namespace detail

Fsdp::Fsdp() : Fsdp(FsdpOptions{}) {}

Fsdp::Fsdp(FsdpOptions options)
    : group_(std::string(who), options.group), state_(std::make_unique<detail::FsdpState>()) {
  state_->options = std::move(options);
  state_->group = &group_;
}

Fsdp::Fsdp(Fsdp&& other) noexcept
    : GroupDefaults<Fsdp>(std::move(other)),
      group_(std::move(other.group_)),
      state_(std::move(other.state_)) {
  if (state_) state_->group = &group_;
}

Fsdp& Fsdp::operator=(Fsdp&& other) noexcept {
  GroupDefaults<Fsdp>::operator=(std::move(other));
  group_ = std::move(other.group_);
  state_ = std::move(other.state_);
  if (state_) state_->group = &group_;
  return *this;
}

Fsdp::~Fsdp() = default;

const FsdpOptions& Fsdp::options() const { return state_->options; }
bool Fsdp::unsharded() const { return !state_->units.empty() && state_->units.front()->unsharded; }

std::vector<FsdpUnitInfo> Fsdp::units() const {
  std::vector<FsdpUnitInfo> out;
  for (const auto& u : state_->units) {
    FsdpUnitInfo info{u->path, u->params.size(), 0, u->gathers, u->prefetched};
    for (const auto& f : u->params) {
      if (f.whole.defined()) info.whole_bytes += f.whole.storage().nbytes();
    }
    out.push_back(std::move(info));
  }
  return out;
}

void Fsdp::setup(torch::nn::Module& module, c10::Device device, std::string_view backend) {
  group_.connect(device, backend);
  auto& s = *state_;
  if (!s.units.empty()) throw Error(std::string(who) + ": setup was called twice");
  const int world = group_.world_size();
  const int rank = group_.rank();
  at::NoGradGuard no_grad;
  const auto params = unique_parameters(module);
  for (const auto& p : params) {
    if (p.dim() == 0) {
      throw Error(std::string(who) +
                  ": a parameter of no dimension cannot be cut on dim 0 (FSDP2 refuses it "
                  "too); give it a dimension of size 1");
    }
  }
  // One model on every rank: rank 0's parameters and buffers (FSDP2 leaves that to the
  // seed; a rank that built another model would train another one).
  auto broadcast = [&](const at::Tensor& t) {  // in place, through a copy if strided
    at::Tensor whole = t.detach();
    if (whole.is_contiguous()) {
      group_.broadcast(whole, 0);
    } else {
      at::Tensor c = whole.contiguous();
      group_.broadcast(c, 0);
      whole.copy_(c);
    }
  };
  for (const auto& p : params) broadcast(p);
  for (const auto& b : module.buffers(/*recurse=*/true)) broadcast(b);

  // The units: the root, then every FsdpUnit below it; each parameter to the innermost.
  std::unordered_set<const void*> claimed;
  auto cut = [&](const at::Tensor& p) {
    FsdpParam f;
    f.param = p;
    f.sizes = p.sizes().vec();
    const int64_t rows = f.sizes[0];
    f.chunk = (rows + world - 1) / world;
    f.local = std::clamp<int64_t>(rows - static_cast<int64_t>(rank) * f.chunk, 0, f.chunk);
    f.row_numel = rows == 0 ? 0 : p.numel() / rows;
    f.padded = at::zeros(f.shape(f.chunk), p.options());
    if (f.local > 0) {
      f.padded.narrow(0, 0, f.local)
          .copy_(p.detach().narrow(0, static_cast<int64_t>(rank) * f.chunk, f.local));
    }
    return f;
  };
  auto visit = [&](auto& self, torch::nn::Module& m, const std::string& path, Unit& owner) -> void {
    for (const auto& item : m.named_parameters(/*recurse=*/false)) {
      if (claimed.insert(item.value().unsafeGetTensorImpl()).second) {
        owner.params.push_back(cut(item.value()));
      }
    }
    for (const auto& child : m.named_children()) {
      const std::string child_path = path.empty() ? child.key() : path + "." + child.key();
      Unit* next = &owner;
      if (auto* unit = dynamic_cast<nn::detail::UnitBase*>(child.value().get())) {
        s.units.push_back(std::make_shared<Unit>(s, child_path, /*root=*/false));
        unit->attach(s.units.back());
        next = s.units.back().get();
      }
      self(self, *child.value(), child_path, *next);
    }
  };
  s.units.push_back(std::make_shared<Unit>(s, "", /*root=*/true));
  if (auto* unit = dynamic_cast<nn::detail::UnitBase*>(&module)) unit->attach(s.units.front());
  visit(visit, module, "", *s.units.front());

  std::unordered_map<const void*, FsdpParam*> by_impl;
  for (auto& u : s.units) {
    for (auto& f : u->params) by_impl.emplace(f.param.unsafeGetTensorImpl(), &f);
  }
  for (const auto& p : params) s.order.push_back(by_impl.at(p.unsafeGetTensorImpl()));
  for (auto* f : s.order) {
    f->param.set_data(f->piece());
    if (f->param.grad().defined()) f->param.mutable_grad() = at::Tensor();
  }
}

void Fsdp::pre_forward() {
  auto& s = *state_;
  if (!s.forward_order.empty()) {  // a forward without a backward (evaluation) ran last
    s.last_order = std::move(s.forward_order);
    s.forward_order.clear();
  }
  if (!s.units.empty()) s.units.front()->unshard();
}

std::vector<at::Tensor> Fsdp::full_parameters() {
  std::vector<std::pair<FsdpParam*, at::Tensor>> pieces;
  for (auto* f : state_->order) pieces.emplace_back(f, f->piece());
  return gather_whole(group_, pieces);
}

void Fsdp::post_backward() {
  auto& s = *state_;
  // What the backward did not reduce on its way (a unit whose inputs need no gradient, the
  // root): reduced now, the last unit first, the root last; then the reduction in flight
  // waited for, and every prefetch nobody used.
  for (auto it = s.units.rbegin(); it != s.units.rend(); ++it) (*it)->post_backward();
  for (auto& u : s.units) u->finish_reduce();
  for (auto& u : s.units) u->reshard();
  s.last_order = std::move(s.forward_order);
  s.forward_order.clear();
  if (s.sync) {
    s.unreduced_backwards = 0;
  } else {
    ++s.unreduced_backwards;
  }
}

void Fsdp::check_step_ready() {
  auto& s = *state_;
  if (s.unreduced_backwards > 0) {
    throw Error(std::string(who) +
                ": an optimizer step after backward passes that all ran under no_sync: the "
                "gradients were never reduced (run the last backward of the step outside "
                "no_sync)");
  }
  // A forward without a backward (evaluation): back to the pieces, their gradients kept.
  for (auto& u : s.units) u->reshard();
}

GradNorm Fsdp::clip_pieces(torch::optim::Optimizer& optimizer, double max_norm, double norm_type) {
  if (norm_type != 2.0) {
    throw Error(std::string(who) + ": clip_gradients supports the 2-norm only, got norm_type " +
                std::to_string(norm_type));
  }
  check_step_ready();
  std::vector<at::Tensor> grads;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) {
      if (p.grad().defined()) grads.push_back(p.grad());
    }
  }
  if (grads.empty()) return GradNorm(0.0);
  at::NoGradGuard no_grad;
  // torch.nn.utils.clip_grad_norm_ on FSDP2's sharded gradients, step for step: each piece's
  // norm, their squares summed over the ranks (one all-reduce), the square roots' norm.
  const auto norms = at::_foreach_norm(grads, 2.0);
  at::Tensor squares = at::pow(at::stack(norms), 2.0);
  group_.all_reduce(squares, ReduceOp::Sum);
  const at::Tensor total = at::linalg_vector_norm(at::pow(squares, 0.5), 2.0);
  const at::Tensor coef =
      at::clamp(at::add(total, 1e-6).reciprocal() * max_norm, std::nullopt, 1.0);
  at::_foreach_mul_(grads, coef);
  return GradNorm(total);
}

namespace {

/// A tensor slot of a checkpoint's value that holds a sharded parameter's tensor: a module
/// entry's parameter, or an optimizer entry's per-parameter state of the parameter's shape.
struct Slot {
  state::Dict dict;
  c10::IValue key;
  FsdpParam* param;
};

/// The slots of `top` (the value rt.save writes, or rt.load read) for `state`'s module and
/// optimizer entries: a module's parameters by their names, an optimizer's states by the
/// parameter ids its param groups number (Python's layout), whose tensor `fits` its
/// parameter ("step" never is one).
template <class Fits>
std::vector<Slot> slots(const State& state, const state::Dict& top,
                        const std::unordered_map<const void*, FsdpParam*>& by_impl, Fits fits) {
  std::vector<Slot> out;
  auto find = [&](const at::Tensor& p) -> FsdpParam* {
    const auto it = by_impl.find(p.unsafeGetTensorImpl());
    return it == by_impl.end() ? nullptr : it->second;
  };
  for (const StateEntry& e : state) {
    const c10::IValue name(e.name());
    if (!top.contains(name) || !top.at(name).isGenericDict()) continue;
    const state::Dict d = top.at(name).toGenericDict();
    if (e.module() != nullptr) {
      for (const auto& item : e.module()->named_parameters(/*recurse=*/true)) {
        FsdpParam* f = find(item.value());
        const c10::IValue key(item.key());
        if (f != nullptr && d.contains(key) && d.at(key).isTensor() &&
            fits(d.at(key).toTensor(), *f)) {
          out.push_back(Slot{d, key, f});
        }
      }
    } else if (e.optimizer() != nullptr) {
      const c10::IValue states_key(std::string("state"));
      if (!d.contains(states_key) || !d.at(states_key).isGenericDict()) continue;
      const state::Dict states = d.at(states_key).toGenericDict();
      int64_t id = 0;
      for (const auto& group : e.optimizer()->param_groups()) {
        for (const auto& p : group.params()) {
          const c10::IValue key(id++);
          FsdpParam* f = find(p);
          if (f == nullptr || !states.contains(key) || !states.at(key).isGenericDict()) continue;
          const state::Dict per = states.at(key).toGenericDict();
          for (const auto& item : per) {
            if (item.key().isString() && item.key().toStringRef() == "step") continue;
            if (item.value().isTensor() && fits(item.value().toTensor(), *f)) {
              out.push_back(Slot{per, item.key(), f});
            }
          }
        }
      }
    }
  }
  return out;
}

std::unordered_map<const void*, FsdpParam*> by_impl(const std::vector<FsdpParam*>& order) {
  std::unordered_map<const void*, FsdpParam*> out;
  for (auto* f : order) out.emplace(f->param.unsafeGetTensorImpl(), f);
  return out;
}

}  // namespace

void Fsdp::save_checkpoint(const std::filesystem::path& path, const State& state,
                           const checkpoint::CheckpointIO& io) {
  auto& s = *state_;
  check_step_ready();  // every unit's pieces on its parameters
  // The consolidated file (FSDP2's full state dict): every sharded tensor gathered whole, on
  // every rank, rank 0 writes. The same file as SingleProcess and Ddp write of the model.
  const state::Dict top = state::save_entries(state);
  const auto found = slots(
      state, top, by_impl(s.order),
      [](const at::Tensor& t, const FsdpParam& f) { return t.sizes().vec() == f.shape(f.local); });
  std::vector<std::pair<FsdpParam*, at::Tensor>> pieces;
  pieces.reserve(found.size());
  for (const auto& slot : found) pieces.emplace_back(slot.param, slot.dict.at(slot.key).toTensor());
  const auto whole = gather_whole(group_, pieces);
  for (std::size_t i = 0; i < found.size(); ++i) {
    found[i].dict.insert_or_assign(found[i].key, whole[i]);
  }
  group_.save_on_rank_zero(path, c10::IValue(top), io);
}

c10::IValue Fsdp::load_checkpoint(const std::filesystem::path& path, const State& state,
                                  const checkpoint::CheckpointIO& io, c10::Device device) {
  auto& s = *state_;
  check_step_ready();
  c10::IValue value;
  loom::detail::agree_on(group_, std::string(who) + ": loading " + path.string(), [&] {
    checkpoint::DeferredChecks checks;  // every CRC-32 inside the agreement
    value = GroupDefaults<Fsdp>::load_checkpoint(path, state, io, device);
    checks.finish();
  });
  if (!value.isGenericDict()) return value;  // rt.load names what is wrong
  // A whole tensor (saved by any strategy at any world size) cut to this rank's piece; one of
  // another shape is left for the entry's load to name.
  const int64_t rank = group_.rank();
  const auto found =
      slots(state, value.toGenericDict(), by_impl(s.order),
            [](const at::Tensor& t, const FsdpParam& f) { return t.sizes().vec() == f.sizes; });
  for (const auto& slot : found) {
    const FsdpParam& f = *slot.param;
    const at::Tensor whole = slot.dict.at(slot.key).toTensor();
    const int64_t first = std::min(rank * f.chunk, f.sizes[0]);
    slot.dict.insert_or_assign(slot.key, whole.narrow(0, first, f.local).clone());
  }
  return value;
}

void Fsdp::teardown() { group_.teardown(); }

FsdpNoSync Fsdp::no_sync() { return FsdpNoSync(state_->sync); }

}  // namespace loom::dist
