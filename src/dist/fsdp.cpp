// loom::Fsdp (include/loom/dist/fsdp.hpp): the strategy's hooks over its units
// (src/dist/fsdp_unit.cpp): setup finds the units and cuts the parameters, the forward gathers
// the root, the end of the backward reduces what is left, the clip spans every rank's pieces.
// rt.save and rt.load: src/dist/fsdp_checkpoint.cpp.
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
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include <loom/detail/empty_module.hpp>
#include <loom/error.hpp>
#include <loom/nn/empty_init.hpp>
#include <loom/nn/fsdp_unit.hpp>

#include "fsdp_state.hpp"

namespace loom::dist {

namespace {

constexpr std::string_view who = detail::fsdp_who;

using detail::FsdpParam;
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

}  // namespace

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
  s.device = device;
  at::NoGradGuard no_grad;
  // Built under loom::EmptyInit (the runtime left it to this setup): each meta parameter gets
  // only this rank's piece, each meta buffer its whole memory, uninitialized; the rest moves.
  const bool empty = nn::has_meta_tensors(module);
  if (empty) {
    for (const auto& t : module.parameters(/*recurse=*/true)) {
      if (!t.is_meta() && t.device() != device) t.set_data(t.to(device));
    }
    for (const auto& t : module.buffers(/*recurse=*/true)) {
      if (t.is_meta()) {
        nn::adopt_storage(t, at::empty(t.sizes(), t.options().device(device)));
      } else if (t.device() != device) {
        t.set_data(t.to(device));
      }
    }
  }
  const auto params = unique_parameters(module);
  for (const auto& p : params) {
    if (p.dim() == 0) {
      throw Error(std::string(who) +
                  ": a parameter of no dimension cannot be cut on dim 0 (FSDP2 refuses it "
                  "too); give it a dimension of size 1");
    }
  }
  // One model on every rank: rank 0's parameters and buffers (FSDP2 leaves that to the
  // seed; a rank that built another model would train another one). Empty ones have none.
  if (!empty) loom::detail::broadcast_module(group_, module, 0);

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
    f.padded = at::zeros(f.shape(f.chunk), p.options().device(device));
    if (f.local > 0 && !p.is_meta()) {
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
    if (f->param.is_meta()) {
      nn::adopt_storage(f->param, f->piece());  // set_data cannot leave the meta device
    } else {
      f->param.set_data(f->piece());
    }
    if (f->param.grad().defined()) f->param.mutable_grad() = at::Tensor();
  }
}

void Fsdp::reset_parameters(torch::nn::Module& module, const nn::Initializer& init) {
  auto& s = *state_;
  check_step_ready();
  // Rank 0's CPU generator on every rank: each module's whole values drawn alike everywhere
  // (those one process draws), each rank keeping its piece. It stays rank 0's afterwards.
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  if (group_.world_size() > 1) {
    at::Tensor state = gen.get_state().to(s.device);
    group_.broadcast(state, 0);
    gen.set_state(state.cpu());
  }
  std::unordered_map<const void*, FsdpParam*> by_impl;
  for (auto* f : s.order) by_impl.emplace(f->param.unsafeGetTensorImpl(), f);
  auto find = [&](const at::Tensor& t) -> FsdpParam* {
    const auto it = by_impl.find(t.unsafeGetTensorImpl());
    return it == by_impl.end() ? nullptr : it->second;
  };
  const int64_t rank = group_.rank();
  nn::init_each(
      module, init,
      [&](const at::Tensor& t) {
        const FsdpParam* f = find(t);
        return f != nullptr ? f->sizes : t.sizes().vec();
      },
      [&](const at::Tensor& held, const at::Tensor& whole) {
        const FsdpParam* f = find(held);
        if (f == nullptr) {  // a buffer: whole on every rank
          held.detach().copy_(whole);
        } else if (f->local > 0) {
          held.detach().copy_(whole.narrow(0, std::min(rank * f->chunk, f->sizes[0]), f->local));
        }
      });
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

void Fsdp::teardown() { group_.teardown(); }

FsdpNoSync Fsdp::no_sync() { return FsdpNoSync(state_->sync); }

}  // namespace loom::dist
