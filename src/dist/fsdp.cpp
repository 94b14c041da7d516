// loom::Fsdp (include/loom/dist/fsdp.hpp): a module's parameters cut into one piece per rank
// as FSDP2 cuts them, gathered whole for the forward and backward, their gradients
// reduce-scattered back into pieces.
#include <loom/dist/fsdp.hpp>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/strides.h>

#include <loom/error.hpp>

#include "group_state.hpp"

namespace loom::dist {

namespace detail {

/// One parameter of the module, cut on dim 0 (FSDP2's FSDPParam).
struct FsdpParam {
  at::Tensor param;            // the module's (and the optimizer's) parameter tensor
  std::vector<int64_t> sizes;  // its whole shape
  int64_t chunk = 0;           // c = ceil(d0 / world): the rows of every rank's padded piece
  int64_t local = 0;           // this rank's rows: clamp(d0 - rank * c, 0, c)
  int64_t row_numel = 1;       // the elements of one row
  at::Tensor padded;  // (c, ...): this rank's rows, then zero rows; the piece is its first rows
  at::Tensor grad;    // the piece's gradient, put aside while the parameter is whole

  int64_t padded_numel() const { return chunk * row_numel; }
  std::vector<int64_t> shape(int64_t rows) const {
    auto s = sizes;
    s[0] = rows;
    return s;
  }
  at::Tensor piece() const { return padded.narrow(0, 0, local); }
};

struct FsdpState {
  FsdpOptions options;
  std::vector<FsdpParam> params;
  bool unsharded = false;
  bool sync = true;                 // no no_sync guard lives
  int64_t unreduced_backwards = 0;  // backwards under no_sync since the last reduction
};

}  // namespace detail

namespace {

constexpr std::string_view who = "loom::Fsdp";

/// Every parameter of `module` once (a parameter shared by two submodules is one).
std::vector<at::Tensor> unique_parameters(torch::nn::Module& module) {
  std::vector<at::Tensor> out;
  std::unordered_set<const void*> seen;
  for (auto& p : module.parameters(/*recurse=*/true)) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
  }
  return out;
}

}  // namespace

Fsdp::Fsdp() : Fsdp(FsdpOptions{}) {}

Fsdp::Fsdp(FsdpOptions options)
    : group_(std::string(who), options.group), state_(std::make_unique<detail::FsdpState>()) {
  state_->options = std::move(options);
}

Fsdp::Fsdp(Fsdp&&) noexcept = default;
Fsdp& Fsdp::operator=(Fsdp&&) noexcept = default;
Fsdp::~Fsdp() = default;

const FsdpOptions& Fsdp::options() const { return state_->options; }
bool Fsdp::unsharded() const { return state_->unsharded; }

void Fsdp::setup(torch::nn::Module& module, c10::Device device, std::string_view backend) {
  group_.connect(device, backend);
  auto& s = *state_;
  if (!s.params.empty()) throw Error(std::string(who) + ": setup was called twice");
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
  for (const auto& p : params) {
    detail::FsdpParam f;
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
    p.set_data(f.piece());
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();
    s.params.push_back(std::move(f));
  }
}

namespace {

/// Every parameter of `params` whole: one all-gather per dtype of each rank's padded pieces,
/// back to back, rank after rank (FSDP2's all-gather); each result is the whole parameter
/// followed by the padding rows, (world * c, ...).
std::vector<at::Tensor> gather(ProcessGroup& group, std::vector<detail::FsdpParam>& params) {
  const int world = group.world_size();
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> out(params.size());
  std::vector<c10::ScalarType> dtypes;
  for (const auto& f : params) {
    if (std::find(dtypes.begin(), dtypes.end(), f.padded.scalar_type()) == dtypes.end()) {
      dtypes.push_back(f.padded.scalar_type());
    }
  }
  for (const auto dtype : dtypes) {
    std::vector<std::size_t> members;
    std::vector<at::Tensor> pieces;
    int64_t numel = 0;
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (params[i].padded.scalar_type() != dtype) continue;
      members.push_back(i);
      pieces.push_back(params[i].padded.reshape({-1}));
      numel += params[i].padded_numel();
    }
    const at::Tensor input = at::cat(pieces);
    at::Tensor output = at::empty({numel * world}, input.options());
    group.all_gather_into(output, input);
    const at::Tensor by_rank = output.view({world, numel});
    int64_t at = 0;
    for (const auto i : members) {
      const auto& f = params[i];
      // (world, c * row) -> (world * c, ...): the whole parameter, then the padding rows.
      out[i] = by_rank.narrow(1, at, f.padded_numel()).contiguous().view(f.shape(f.chunk * world));
      at += f.padded_numel();
    }
  }
  return out;
}

}  // namespace

void Fsdp::pre_forward() {
  auto& s = *state_;
  if (s.unsharded || s.params.empty()) return;
  auto whole = gather(group_, s.params);
  for (std::size_t i = 0; i < s.params.size(); ++i) {
    auto& f = s.params[i];
    f.grad = f.param.grad();  // the piece's gradient (accumulating over steps), put aside
    if (f.grad.defined()) f.param.mutable_grad() = at::Tensor();
    f.param.set_data(whole[i].narrow(0, 0, f.sizes[0]));
  }
  s.unsharded = true;
}

std::vector<at::Tensor> Fsdp::full_parameters() {
  auto& s = *state_;
  std::vector<at::Tensor> out;
  if (s.unsharded) {
    for (const auto& f : s.params) out.push_back(f.param.detach().clone());
    return out;
  }
  auto whole = gather(group_, s.params);
  for (std::size_t i = 0; i < s.params.size(); ++i) {
    out.push_back(whole[i].narrow(0, 0, s.params[i].sizes[0]).clone());
  }
  return out;
}

void Fsdp::post_backward() {
  auto& s = *state_;
  if (!s.unsharded) return;
  if (!s.sync) {  // FSDP2's set_requires_gradient_sync(False): the whole gradients accumulate
    ++s.unreduced_backwards;
    return;
  }
  const int world = group_.world_size();
  at::NoGradGuard no_grad;
  // One reduce-scatter per dtype over the parameters that got a gradient: row r of the input
  // is every gradient's rows of rank r's piece (zero rows past the end), as FSDP2 lays it out.
  std::vector<c10::ScalarType> dtypes;
  for (const auto& f : s.params) {
    const auto& g = f.param.grad();
    if (g.defined() && std::find(dtypes.begin(), dtypes.end(), g.scalar_type()) == dtypes.end()) {
      dtypes.push_back(g.scalar_type());
    }
  }
  for (const auto dtype : dtypes) {
    std::vector<detail::FsdpParam*> group;
    std::vector<at::Tensor> rows;
    int64_t numel = 0;
    for (auto& f : s.params) {
      const auto& g = f.param.grad();
      if (!g.defined() || g.scalar_type() != dtype) continue;
      group.push_back(&f);
      at::Tensor padded = at::zeros(f.shape(f.chunk * world), g.options());
      padded.narrow(0, 0, f.sizes[0]).copy_(g);
      rows.push_back(padded.view({world, f.padded_numel()}));
      numel += f.padded_numel();
    }
    at::Tensor input = at::cat(rows, 1);
    at::Tensor output = at::empty({numel}, input.options());
    group_.reduce_scatter(output, input, ReduceOp::Mean);
    int64_t at = 0;
    for (auto* f : group) {
      // The piece's part of the output, not a view of it (an optimizer's zero_grad detaches
      // gradients in place, which a view refuses): its storage, at its offset.
      at::Tensor piece_grad = at::empty({0}, output.options());
      const auto shape = f->shape(f->local);
      piece_grad.set_(output.storage(), output.storage_offset() + at, shape,
                      c10::contiguous_strides(shape));
      at += f->padded_numel();
      f->param.mutable_grad() = at::Tensor();
      if (f->grad.defined()) {
        f->grad.add_(piece_grad);
      } else {
        f->grad = piece_grad;
      }
    }
  }
  for (auto& f : s.params) {
    if (f.param.grad().defined()) f.param.mutable_grad() = at::Tensor();  // not reduced: none
    f.param.set_data(f.piece());
    if (f.grad.defined()) f.param.mutable_grad() = std::exchange(f.grad, at::Tensor());
  }
  s.unsharded = false;
  s.unreduced_backwards = 0;
}

void Fsdp::check_step_ready() {
  auto& s = *state_;
  if (!s.unsharded) return;
  if (s.unreduced_backwards > 0) {
    throw Error(std::string(who) +
                ": an optimizer step after backward passes that all ran under no_sync: the "
                "gradients were never reduced (run the last backward of the step outside "
                "no_sync)");
  }
  // A forward without a backward (evaluation): back to the pieces, their gradients kept.
  at::NoGradGuard no_grad;
  for (auto& f : s.params) {
    f.param.set_data(f.piece());
    if (f.grad.defined()) f.param.mutable_grad() = std::exchange(f.grad, at::Tensor());
  }
  s.unsharded = false;
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

void Fsdp::save_checkpoint(const std::filesystem::path& path, const State&,
                           const checkpoint::CheckpointIO&) {
  throw Error(std::string(who) + ": rt.save(" + path.string() +
              ") of a sharded module is not supported yet");
}

c10::IValue Fsdp::load_checkpoint(const std::filesystem::path& path, const State&,
                                  const checkpoint::CheckpointIO&, c10::Device) {
  throw Error(std::string(who) + ": rt.load(" + path.string() +
              ") into a sharded module is not supported yet");
}

void Fsdp::teardown() { group_.teardown(); }

FsdpNoSync Fsdp::no_sync() { return FsdpNoSync(state_->sync); }

}  // namespace loom::dist
