// loom::Fsdp's units (src/dist/fsdp_state.hpp): each one's parameters gathered whole (its own
// all-gather, or a prefetch's), freed again, watched by hooks on its outputs and a node on its
// inputs, and its gradients reduce-scattered into the pieces as the backward leaves it.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/strides.h>
#include <torch/autograd.h>

#include "fsdp_state.hpp"
#include "group_state.hpp"

namespace loom::dist::detail {

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

namespace {

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
    detail::GroupState& state = group.state();
    // On gloo an all-to-all moves the same bytes 3-4x faster than its all-gather: this rank's
    // pieces in every row, row r for rank r.
    const bool by_all_to_all = state.group && world > 1 && detail::prefers_all_to_all(state);
    part.input = at::empty({by_all_to_all ? world : 1, numel},
                           part.members.front()->padded.options().dtype(dtype));
    int64_t at = 0;
    for (const auto* f : part.members) {
      part.input[0].narrow(0, at, f->padded_numel()).view(f->shape(f->chunk)).copy_(f->padded);
      at += f->padded_numel();
    }
    if (by_all_to_all) part.input.narrow(0, 1, world - 1).copy_(part.input[0]);
    part.output = at::empty({numel * world}, part.input.options());
    if (!state.group) {
      part.output.copy_(part.input.view({-1}));
    } else {
      try {
        at::Tensor flat = part.input.view({-1});
        part.work = by_all_to_all ? detail::all_to_all(state, part.output, flat)
                                  : detail::all_gather_into(state, part.output, flat);
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
    const at::Tensor by_rank = part.output.view({world, -1});
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

}  // namespace

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
    detail::GroupState& state = group.state();
    if (!state.group) {
      part.output = at::empty({numel}, part.input.options());
      part.output.copy_(part.input.view({-1}));  // one rank: the mean of one
    } else {
      try {
        at::Tensor flat = part.input.view({-1});
        if (world == 2 && detail::prefers_all_to_all(state)) {
          // gloo's reduce-scatter is an all-reduce (twice the bytes): on two ranks an
          // all-to-all brings the other rank's part here and finish_reduce adds the two, the
          // sum gloo's makes bit for bit (a + b == b + a). On more ranks gloo's order of the
          // additions is kept: its reduce-scatter.
          part.output = at::empty({world, numel}, part.input.options());
          part.received = true;
          part.work = detail::all_to_all(state, part.output, flat);
        } else {
          part.output = at::empty({numel}, part.input.options());
          part.work = detail::reduce_scatter(state, part.output, flat, ReduceOp::Sum);
        }
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
      if (part.received) part.output = at::add(part.output[0], part.output[1]);  // two ranks'
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

}  // namespace loom::dist::detail
