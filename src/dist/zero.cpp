#include <loom/dist/zero.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iomanip>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/StringUtil.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>

#include <loom/amp/grad_scaler.hpp>
#include <loom/checkpoint/mapped.hpp>
#include <loom/checkpoint/shards.hpp>
#include <loom/detail/agree_on_failure.hpp>
#include <loom/detail/clip_grad.hpp>
#include <loom/detail/precision_defaults.hpp>
#include <loom/error.hpp>
#include <loom/optim/optimizer_table.hpp>

#include "ddp_state.hpp"

namespace loom::dist {

namespace detail {

/// One bucket of stage 2's reduction: some of one owner's parameters.
struct GradBucket {
  int owner = 0;
  std::vector<std::size_t> params;  // indices into ZeroState::params
  std::int64_t numel = 0;
  std::size_t pending = 0;  // gradients not yet accumulated in this backward
  bool in_place = false;    // one parameter, summed in its own .grad (no copy)
  bool launched = false, finished = false;
  at::Tensor flat;
  c10::intrusive_ptr<c10d::Work> work;
};

using Accumulator =
    decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

struct ZeroState {
  torch::nn::Module* module = nullptr;
  std::vector<at::Tensor> params;  // the module's parameters that require a gradient
  std::vector<int> owners;         // each one's owner
  std::unordered_map<const void*, int> owner_of;
  std::vector<std::vector<at::Tensor>> shards;  // each rank's, largest first (Python's order)

  // Stage 2, more than one rank: the buckets in launch order, each parameter's bucket, and the
  // hooks on the gradient accumulators that launch a bucket's reduce once its gradients are in.
  std::vector<GradBucket> buckets;
  std::vector<std::size_t> bucket_of;
  std::vector<std::pair<Accumulator, std::uintptr_t>> hooks;
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  std::chrono::milliseconds timeout{0};
  int rank = 0;
  double share = 1.0;
  bool all_reduce = false;  // the buckets' collective: allreduce, or reduce to the owner
  std::size_t next_launch = 0, next_finish = 0;
  bool armed = false;  // a synchronized forward ran: this backward reduces

  ZeroState() = default;
  ZeroState(const ZeroState&) = delete;
  ZeroState& operator=(const ZeroState&) = delete;
  ~ZeroState() { remove_hooks(); }

  void remove_hooks() {
    for (auto& [accumulator, key] : hooks) accumulator->del_post_hook(key);
    hooks.clear();
  }

  /// Copies a bucket's gradients (zeros where a parameter has none) times 1 / world size (the
  /// reducer's average; one pass: the product is written into the bucket), and starts their
  /// sum on the owner.
  void launch(GradBucket& b) {
    const at::Tensor& first = params[b.params.front()];
    b.in_place = b.params.size() == 1 && first.grad().defined() && first.grad().is_contiguous() &&
                 first.grad().layout() == at::kStrided;
    if (b.in_place) {
      // A bucket of one parameter: its gradient is the buffer, scaled and summed in place.
      b.flat = first.grad();
      b.flat.mul_(share);
      start(b);
      return;
    }
    b.flat = at::empty({b.numel}, first.options().requires_grad(false));
    std::int64_t offset = 0;
    for (std::size_t i : b.params) {
      const at::Tensor& p = params[i];
      at::Tensor view = b.flat.narrow(0, offset, p.numel()).view(p.sizes());
      if (p.grad().defined()) {
        at::mul_out(view, p.grad(), share);
      } else {
        view.zero_();
      }
      offset += p.numel();
    }
    start(b);
  }

  /// Starts a bucket's collective on its buffer.
  void start(GradBucket& b) {
    std::vector<at::Tensor> tensors{b.flat};
    if (all_reduce) {
      c10d::AllreduceOptions o;
      o.reduceOp = c10d::ReduceOp(c10d::ReduceOp::SUM);
      o.timeout = timeout;
      b.work = group->allreduce(tensors, o);
    } else {
      c10d::ReduceOptions o;
      o.rootRank = b.owner;
      o.reduceOp = c10d::ReduceOp(c10d::ReduceOp::SUM);
      o.timeout = timeout;
      b.work = group->reduce(tensors, o);
    }
    b.launched = true;
  }

  /// Waits for a bucket: the owner's gradients become the sums, the others' are dropped.
  void finish(GradBucket& b) {
    b.work->wait();
    if (b.in_place) {  // the owner's .grad holds the sum; the others drop theirs
      if (b.owner != rank) params[b.params.front()].mutable_grad() = at::Tensor();
      b.flat = at::Tensor();
      b.work.reset();
      b.finished = true;
      return;
    }
    std::int64_t offset = 0;
    for (std::size_t i : b.params) {
      at::Tensor& p = params[i];
      if (b.owner == rank) {
        at::Tensor view = b.flat.narrow(0, offset, p.numel()).view(p.sizes());
        if (p.grad().defined()) {
          p.mutable_grad().copy_(view);
        } else {
          p.mutable_grad() = view.clone();
        }
      } else {
        p.mutable_grad() = at::Tensor();
      }
      offset += p.numel();
    }
    b.flat = at::Tensor();
    b.work.reset();
    b.finished = true;
  }

  /// Launches the buckets that are ready, in order (every rank launches the same sequence),
  /// and finishes, in order, those whose reduce has completed.
  void advance() {
    while (next_launch < buckets.size() && buckets[next_launch].pending == 0) {
      launch(buckets[next_launch++]);
    }
    while (next_finish < next_launch && buckets[next_finish].work->isCompleted()) {
      finish(buckets[next_finish++]);
    }
  }

  /// A gradient accumulator's hook: parameter `i`'s gradient is in.
  void ready(std::size_t i) {
    if (!armed) return;
    GradBucket& b = buckets[bucket_of[i]];
    if (b.pending > 0 && --b.pending == 0) advance();
  }

  /// Before a synchronized forward: every bucket waits for all its gradients again (reduces
  /// a backward outside rt.backward started are waited for first).
  void arm() {
    for (; next_finish < next_launch; ++next_finish) finish(buckets[next_finish]);
    for (auto& b : buckets) {
      b.pending = b.params.size();
      b.launched = b.finished = false;
    }
    next_launch = next_finish = 0;
    armed = true;
  }

  /// After the backward: the buckets not launched yet (a parameter without a gradient) go in
  /// order, and every bucket is finished.
  void complete() {
    armed = false;
    for (; next_launch < buckets.size(); ++next_launch) launch(buckets[next_launch]);
    for (; next_finish < buckets.size(); ++next_finish) finish(buckets[next_finish]);
  }
};

}  // namespace detail

namespace {

using detail::DdpAccess;

/// Whether a checkpoint value is an optimizer's state in Python's layout.
bool is_optimizer_entry(const c10::IValue& v) {
  if (!v.isGenericDict()) return false;
  const auto d = v.toGenericDict();
  return d.size() == 2 && d.contains("state") && d.contains("param_groups");
}

}  // namespace

std::vector<int> Zero::partition(const std::vector<std::int64_t>& numels, int world) {
  if (world < 1) throw Error("loom::Zero::partition: the world size must be positive");
  std::vector<std::size_t> order(numels.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return numels[a] > numels[b]; });
  std::vector<std::int64_t> sizes(static_cast<std::size_t>(world), 0);
  std::vector<int> owner(numels.size(), 0);
  for (std::size_t i : order) {
    std::size_t r = 0;
    for (std::size_t k = 1; k < sizes.size(); ++k) {
      if (sizes[k] < sizes[r]) r = k;
    }
    owner[i] = static_cast<int>(r);
    sizes[r] += numels[i];
  }
  return owner;
}

Zero::Zero() : Zero(ZeroOptions{}) {}

Zero::Zero(ZeroOptions options)
    : options_(options), ddp_(options.ddp), state_(std::make_unique<detail::ZeroState>()) {
  if (options_.stage != 1 && options_.stage != 2) {
    throw Error("loom::Zero: ZeroOptions::stage is 1 (optimizer state) or 2 (and gradients), not " +
                std::to_string(options_.stage));
  }
  if (options_.bucket_bytes == 0) throw Error("loom::Zero: ZeroOptions::bucket_bytes must be > 0");
  DdpAccess::state(ddp_).reduce_gradients = options_.stage == 1;
  DdpAccess::state(ddp_).name = "loom::Zero";
}

Zero::Zero(Zero&&) noexcept = default;
Zero& Zero::operator=(Zero&&) noexcept = default;
Zero::~Zero() = default;

void Zero::fail(std::string_view what, std::exception_ptr error) {
  DdpAccess::fail(ddp_, what, error);
}

namespace {

/// Stage 2's buckets and the hooks that launch them.
void build_buckets(detail::ZeroState& z, int world, std::size_t bucket_bytes) {
  // Gradients arrive roughly in reverse order of the module's parameters: buckets are cut in
  // that order, one open bucket per owner (a reduce has one root), closed at bucket_bytes.
  std::vector<std::optional<detail::GradBucket>> open(static_cast<std::size_t>(world));
  std::vector<std::size_t> bytes(open.size(), 0);
  auto close = [&](std::size_t owner) {
    if (open[owner]) z.buckets.push_back(std::move(*open[owner]));
    open[owner].reset();
    bytes[owner] = 0;
  };
  z.bucket_of.assign(z.params.size(), 0);
  for (std::size_t k = z.params.size(); k-- > 0;) {
    const auto owner = static_cast<std::size_t>(z.owners[k]);
    const at::Tensor& p = z.params[k];
    if (static_cast<std::size_t>(p.nbytes()) >= bucket_bytes / 8) {
      // A large parameter goes alone: its gradient is summed in place, without a copy.
      close(owner);
      detail::GradBucket alone;
      alone.owner = static_cast<int>(owner);
      alone.params.push_back(k);
      alone.numel = p.numel();
      z.buckets.push_back(std::move(alone));
      continue;
    }
    if (open[owner] && z.params[open[owner]->params.front()].scalar_type() != p.scalar_type()) {
      close(owner);
    }
    if (!open[owner]) {
      open[owner].emplace();
      open[owner]->owner = static_cast<int>(owner);
    }
    open[owner]->params.push_back(k);
    open[owner]->numel += p.numel();
    bytes[owner] += static_cast<std::size_t>(p.nbytes());
    if (bytes[owner] >= bucket_bytes) close(owner);
  }
  for (std::size_t owner = 0; owner < open.size(); ++owner) close(owner);
  for (std::size_t b = 0; b < z.buckets.size(); ++b) {
    for (std::size_t i : z.buckets[b].params) z.bucket_of[i] = b;
  }
  detail::ZeroState* state = &z;
  for (std::size_t i = 0; i < z.params.size(); ++i) {
    auto accumulator = torch::autograd::impl::grad_accumulator(z.params[i]);
    const auto key =
        accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
            [state, i](const torch::autograd::variable_list& outputs,
                       const torch::autograd::variable_list&) {
              state->ready(i);
              return outputs;
            }));
    z.hooks.emplace_back(std::move(accumulator), key);
  }
}

}  // namespace

void Zero::setup(torch::nn::Module& module, c10::Device device, std::string_view backend) {
  ddp_.setup(module, device, backend);
  state_ = std::make_unique<detail::ZeroState>();  // a second setup: the old hooks go
  auto& z = *state_;
  z.module = &module;
  std::vector<std::int64_t> numels;
  for (auto& p : module.parameters(/*recurse=*/true)) {
    if (!p.requires_grad()) continue;
    z.params.push_back(p);
    numels.push_back(p.numel());
  }
  z.owners = partition(numels, world_size());
  z.shards.assign(static_cast<std::size_t>(world_size()), {});
  std::vector<std::size_t> order(numels.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return numels[a] > numels[b]; });
  for (std::size_t i : order) {
    z.shards[static_cast<std::size_t>(z.owners[i])].push_back(z.params[i]);
  }
  for (std::size_t i = 0; i < z.params.size(); ++i) {
    z.owner_of.emplace(z.params[i].unsafeGetTensorImpl(), z.owners[i]);
  }
  auto& s = DdpAccess::state(ddp_);
  if (stage() == 2 && s.group) {
    z.group = s.group;
    z.timeout = options_.ddp.timeout;
    z.rank = rank();
    z.share = 1.0 / static_cast<double>(world_size());
    z.all_reduce =
        options_.gradient_collective == ZeroCollective::all_reduce ||
        (options_.gradient_collective == ZeroCollective::automatic && ddp_.backend() == "gloo");
    build_buckets(z, world_size(), options_.bucket_bytes);
  }
}

const std::vector<int>& Zero::owners() const { return state_->owners; }

void Zero::pre_forward() {
  ddp_.pre_forward();
  auto& s = DdpAccess::state(ddp_);
  if (stage() == 1 || !s.group) return;
  if (s.sync && at::GradMode::is_enabled()) {
    try {
      state_->arm();
    } catch (...) {
      fail("the gradient reduction of stage 2", std::current_exception());
    }
  }
  if (!options_.ddp.broadcast_buffers) return;
  auto buffers = state_->module->buffers(true);
  if (buffers.empty()) return;
  try {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> detached;
    for (auto& b : buffers) detached.push_back(b.detach());
    c10d::broadcast_coalesced(s.group, detached, options_.bucket_bytes, 0);
  } catch (...) {
    fail("the buffer broadcast before forward", std::current_exception());
  }
}

void Zero::reduce_gradients() {
  auto& z = *state_;
  if (at::GradMode::is_enabled()) detail::record_backward(DdpAccess::state(ddp_), z.armed);
  if (!z.armed) return;  // one process, or a forward under no_sync
  at::NoGradGuard no_grad;
  try {
    z.complete();
  } catch (...) {
    fail("the gradient reduction of stage 2", std::current_exception());
  }
}

void Zero::before_step(Optimizers optimizers) {
  auto& z = *state_;
  if (z.module == nullptr) {
    throw Error("loom::Zero: optimizer_step before setup; call rt.setup(model, optimizer) first");
  }
  detail::check_step_synchronized(DdpAccess::state(ddp_));
  for (std::size_t i = 0; i < optimizers.size(); ++i) {
    torch::optim::Optimizer& o = optimizers[i];
    if (amp::unscales_itself(o)) {
      throw Error("loom::Zero: optimizer " + std::to_string(i) +
                  " unscales its gradients inside its step; Zero unscales every gradient before "
                  "the sharded step, which it would repeat. Use loom::Ddp for it");
    }
    for (const auto& group : o.param_groups()) {
      for (const auto& p : group.params()) {
        if (!z.owner_of.contains(p.unsafeGetTensorImpl())) {
          throw Error(
              "loom::Zero: optimizer " + std::to_string(i) +
              " has a parameter that is not one of the module's trainable parameters (shape " +
              c10::str(p.sizes()) + "); Zero shards the module setup() was given");
        }
      }
    }
    // State of other ranks' shards (a whole checkpoint just loaded) is not this rank's to keep.
    auto& st = o.state();
    for (auto it = st.begin(); it != st.end();) {
      auto found = z.owner_of.find(it->first);
      if (found != z.owner_of.end() && found->second != rank()) {
        it = st.erase(it);
      } else {
        ++it;
      }
    }
  }
  auto& s = DdpAccess::state(ddp_);
  if (stage() == 1 || !s.group) return;
  // Stage 2: every rank's scaler must see an inf that any shard holds.
  std::map<at::ScalarType, std::vector<at::Tensor>> grads;
  for (auto& p : z.shards[static_cast<std::size_t>(rank())]) {
    if (p.grad().defined()) grads[p.grad().scalar_type()].push_back(p.grad());
  }
  try {
    at::NoGradGuard no_grad;
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(s.device);
    at::Tensor found = at::zeros({1}, f32);
    for (auto& [type, list] : grads) {
      (void)type;
      if (!list.front().is_floating_point()) continue;
      // Extremes of each gradient (read only): inf or nan where one is not finite. On the
      // CPU each tensor's aminmax (one vectorized pass; the inf-norm's CPU kernel is ten
      // times slower), on a GPU the inf-norm (one fused kernel for the list).
      std::vector<at::Tensor> extremes;
      if (list.front().is_cpu()) {
        for (const auto& g : list) {
          auto [low, high] = at::aminmax(g);
          extremes.push_back(low);
          extremes.push_back(high);
        }
      } else {
        extremes = at::_foreach_norm(list, std::numeric_limits<double>::infinity());
      }
      found = at::maximum(found, at::stack(extremes)
                                     .isfinite()
                                     .logical_not()
                                     .any()
                                     .to(at::kFloat)
                                     .to(found.device())
                                     .reshape({1}));
    }
    std::vector<at::Tensor> tensors{found};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp(c10d::ReduceOp::MAX);
    o.timeout = options_.ddp.timeout;
    s.group->allreduce(tensors, o)->wait();
    if (!grads.empty()) {
      at::Tensor g = grads.begin()->second.front();
      g.as_strided({1}, {1}, g.storage_offset())
          .masked_fill_(found.gt(0), std::numeric_limits<double>::quiet_NaN());
    }
  } catch (const Error&) {
    throw;
  } catch (...) {
    fail("stage 2's inf agreement before the step", std::current_exception());
  }
}

Zero::Narrowed::Narrowed(Zero& zero, Optimizers optimizers) : optimizers_(optimizers) {
  const auto& owner_of = zero.state_->owner_of;
  const int me = zero.rank();
  for (torch::optim::Optimizer& o : optimizers_) {
    for (auto& group : o.param_groups()) {
      saved_.push_back(group.params());
      std::vector<at::Tensor> mine;
      for (const auto& p : saved_.back()) {
        if (owner_of.at(p.unsafeGetTensorImpl()) == me) mine.push_back(p);
      }
      group.params() = std::move(mine);
    }
  }
}

void Zero::Narrowed::restore() {
  if (restored_) return;
  restored_ = true;
  std::size_t k = 0;
  for (torch::optim::Optimizer& o : optimizers_) {
    for (auto& group : o.param_groups()) group.params() = std::move(saved_[k++]);
  }
}

Zero::Narrowed::~Narrowed() { restore(); }

void Zero::broadcast_parameters() {
  auto& s = DdpAccess::state(ddp_);
  if (!s.group) return;
  auto& z = *state_;
  try {
    at::NoGradGuard no_grad;
    // Each large parameter in place (no copy), the small ones coalesced into buckets.
    const auto large = static_cast<std::int64_t>(options_.bucket_bytes / 8);
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (int r = 0; r < world_size(); ++r) {
      std::vector<at::Tensor> small;
      for (auto& p : z.shards[static_cast<std::size_t>(r)]) {
        if (static_cast<std::int64_t>(p.nbytes()) < large || !p.is_contiguous()) {
          small.push_back(p.detach());
          continue;
        }
        std::vector<at::Tensor> one{p.detach()};
        c10d::BroadcastOptions o;
        o.rootRank = r;
        o.timeout = options_.ddp.timeout;
        works.push_back(s.group->broadcast(one, o));
      }
      if (!small.empty()) {
        for (auto& w : works) w->wait();
        works.clear();
        c10d::broadcast_coalesced(s.group, small, options_.bucket_bytes, r);
      }
    }
    for (auto& w : works) w->wait();
  } catch (...) {
    fail("the parameter broadcast after the step", std::current_exception());
  }
}

GradNorm Zero::clip_shard(torch::optim::Optimizer& optimizer, double max_norm, double norm_type,
                          const GradNorm& local) {
  auto& s = DdpAccess::state(ddp_);
  const bool inf_norm = std::isinf(norm_type);
  // The shard's norm (or its p-th power) all-reduced on the device: no host read.
  at::Tensor t = local.tensor().to(s.device, at::kDouble).reshape({1});
  t = inf_norm ? t.clone() : t.pow(norm_type);
  try {
    std::vector<at::Tensor> tensors{t};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp(inf_norm ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM);
    o.timeout = options_.ddp.timeout;
    s.group->allreduce(tensors, o)->wait();
  } catch (...) {
    fail("the gradient norm's all-reduce in clip_gradients", std::current_exception());
  }
  at::Tensor total = (inf_norm ? t : t.pow(1.0 / norm_type)).reshape({});
  loom::detail::clip_grads_with_norm(loom::detail::grads_of(loom::detail::all_params(optimizer)),
                                     max_norm, total);
  return GradNorm(std::move(total));
}

ShardMemory Zero::memory(const torch::optim::Optimizer& optimizer) const {
  ShardMemory m;
  const auto& z = *state_;
  if (z.module == nullptr) return m;
  for (const auto& p : z.module->parameters(true)) {
    m.parameters += p.numel() * static_cast<std::int64_t>(p.element_size());
    if (p.grad().defined()) {
      m.gradients += p.grad().numel() * static_cast<std::int64_t>(p.grad().element_size());
    }
  }
  const auto* info = optim::find_optimizer(optimizer);
  if (info == nullptr) return m;
  for (const auto& entry : optimizer.state()) {
    if (!entry.second) continue;
    c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
    info->save_state(*entry.second, d);
    for (const auto& item : d) {
      if (item.value().isTensor()) {
        const auto& t = item.value().toTensor();
        m.optimizer_state += t.numel() * static_cast<std::int64_t>(t.element_size());
      }
    }
  }
  return m;
}

namespace {

/// Every rank's `mine` on rank 0, its own first, by point-to-point messages (the other ranks
/// get nothing back): what rank 0 needs to consolidate, 1/world of a broadcast's traffic.
std::vector<c10::IValue> gather_on_zero(detail::DdpState& s, int rank, int world,
                                        const c10::IValue& mine,
                                        std::chrono::milliseconds timeout) {
  std::vector<c10::IValue> out;
  const auto on_device = at::TensorOptions().device(s.device);
  if (rank != 0) {
    const std::vector<char> bytes = torch::jit::pickle_save(mine);
    const auto n = static_cast<std::int64_t>(bytes.size());
    std::vector<at::Tensor> size{at::full({1}, n, on_device.dtype(at::kLong))};
    at::Tensor data = at::empty({n}, at::TensorOptions().dtype(at::kByte));
    std::memcpy(data.data_ptr(), bytes.data(), bytes.size());
    std::vector<at::Tensor> payload{data.to(s.device)};
    s.group->send(size, 0, 0)->wait(timeout);
    s.group->send(payload, 0, 1)->wait(timeout);
    return out;
  }
  out.push_back(mine);
  for (int r = 1; r < world; ++r) {
    std::vector<at::Tensor> size{at::empty({1}, on_device.dtype(at::kLong))};
    s.group->recv(size, r, 0)->wait(timeout);
    const auto n = size.front().cpu().item<std::int64_t>();
    std::vector<at::Tensor> payload{at::empty({n}, on_device.dtype(at::kByte))};
    s.group->recv(payload, r, 1)->wait(timeout);
    const at::Tensor data = payload.front().cpu();
    const auto* first = static_cast<const char*>(data.data_ptr());
    out.push_back(torch::jit::pickle_load(std::vector<char>(first, first + n)));
  }
  return out;
}

/// A name no earlier save of the same path used: the shard files of a save that did not
/// finish never mix with those an index names.
std::string new_shard_tag() {
  const auto now = static_cast<std::uint64_t>(std::chrono::system_clock::now().time_since_epoch() /
                                              std::chrono::nanoseconds(1));
  const std::uint64_t mixed = now ^ (static_cast<std::uint64_t>(std::random_device{}()) << 32);
  std::ostringstream out;
  out << std::hex << std::setw(16) << std::setfill('0') << mixed;
  return out.str();
}

/// Removes the shard files of `path` that a save other than `tag`'s wrote (an older save of
/// the same path, or one that did not finish). Best effort: what cannot go stays.
void remove_other_shards(const std::filesystem::path& path, const std::string& tag) {
  for (const auto& [file, other] : checkpoint::shard_files(path)) {
    if (other == tag) continue;
    std::error_code ec;
    std::filesystem::remove(file, ec);
  }
}

}  // namespace

void Zero::save_checkpoint(const std::filesystem::path& path, const c10::IValue& value,
                           const checkpoint::CheckpointIO& io) {
  auto& s = DdpAccess::state(ddp_);
  if (!s.group || !value.isGenericDict()) {
    ddp_.save_checkpoint(path, value, io);
    return;
  }
  // Each rank's optimizer entries hold the state of its shard's parameters (their ids are the
  // whole groups').
  const auto top = value.toGenericDict();
  c10::impl::GenericDict mine(c10::StringType::get(), c10::AnyType::get());
  for (const auto& item : top) {
    if (is_optimizer_entry(item.value())) {
      mine.insert(item.key(), item.value().toGenericDict().at("state"));
    }
  }
  if (mine.empty()) {
    ddp_.save_checkpoint(path, value, io);
    return;
  }
  if (options_.checkpoint == ZeroCheckpoint::sharded) {
    // Every rank but 0 writes its states beside the main file, then rank 0 writes the main
    // file (its own states and the index) once every shard is in place.
    auto& z = *state_;
    std::string tag;
    try {
      tag = ddp_.broadcast_object(rank() == 0 ? new_shard_tag() : std::string(), 0);
    } catch (...) {
      fail("the sharded save's name", std::current_exception());
    }
    checkpoint::ShardIndex index;
    index.world_size = world_size();
    for (int r = 1; r < world_size(); ++r) {
      index.files.push_back(checkpoint::shard_path(path, tag, r, world_size()).filename().string());
    }
    for (std::size_t i = 0; i < z.params.size(); ++i) {
      index.owners.push_back(z.owners[i]);
      index.numels.push_back(z.params[i].numel());
    }
    std::string failure;
    const auto own = checkpoint::shard_path(path, tag, rank(), world_size());
    if (rank() != 0) {
      try {
        io.save(own, c10::IValue(mine));
      } catch (const std::exception& e) {
        failure = *e.what() ? e.what() : "an error with no message";
      }
    }
    loom::detail::agree_on_failure(ddp_, s.device, failure,
                                   "loom::Zero: writing the shard " + own.filename().string());
    ddp_.save_checkpoint(path, rank() == 0 ? checkpoint::with_shard_index(value, index) : value,
                         io);
    if (rank() == 0) remove_other_shards(path, tag);
    return;
  }
  // Consolidated: every rank's states go to rank 0, which merges them by id and writes.
  std::vector<c10::IValue> all;
  try {
    all = gather_on_zero(s, rank(), world_size(), c10::IValue(mine), options_.ddp.timeout);
  } catch (...) {
    fail("gathering the optimizer state on rank 0", std::current_exception());
  }
  if (rank() != 0) {
    ddp_.save_checkpoint(path, value, io);
    return;
  }
  std::map<std::string, std::map<std::int64_t, c10::IValue>> merged;
  for (const auto& got : all) {
    for (const auto& entry : got.toGenericDict()) {
      auto& states = merged[entry.key().toStringRef()];
      for (const auto& e : entry.value().toGenericDict()) {
        states.insert_or_assign(e.key().toInt(), e.value());
      }
    }
  }
  auto whole = top.copy();
  for (auto& [name, states] : merged) {
    auto entry = top.at(name).toGenericDict().copy();
    c10::impl::GenericDict state(c10::IntType::get(), c10::AnyType::get());
    for (auto& [id, v] : states) state.insert(id, v);
    entry.insert_or_assign("state", state);
    whole.insert_or_assign(name, entry);
  }
  ddp_.save_checkpoint(path, c10::IValue(whole), io);
}

c10::IValue Zero::load_checkpoint(const std::filesystem::path& path,
                                  const checkpoint::CheckpointIO& io, c10::Device device) {
  auto& s = DdpAccess::state(ddp_);
  if (!s.group) return ddp_.load_checkpoint(path, io, device);
  // Every rank reads the main file; of a sharded checkpoint, every shard, or only its own when
  // this run partitions the parameters as the saving run did. Any rank's failure is every
  // rank's (a rank that went on alone would wait for the others at its next collective).
  const auto& z = *state_;
  c10::IValue value;
  std::string failure;
  try {
    // Every CRC-32 checked here, inside the agreement (not as rt.load copies the tensors): a
    // corrupted shard fails every rank.
    checkpoint::DeferredChecks checks;
    value = io.load(path, device);
    if (checkpoint::has_shard_index(value)) {
      const auto index = checkpoint::shard_index(value, path);
      bool same = index.world_size == world_size() && index.owners.size() == z.params.size() &&
                  !z.params.empty();
      for (std::size_t i = 0; same && i < z.params.size(); ++i) {
        same = index.owners[i] == z.owners[i] && index.numels[i] == z.params[i].numel();
      }
      value = checkpoint::merge_shards(path, std::move(value), io, device,
                                       [&](int r) { return !same || r == rank(); });
    }
    checks.finish();
  } catch (const std::exception& e) {
    failure = *e.what() ? e.what() : "an error with no message";
  }
  loom::detail::agree_on_failure(ddp_, s.device, failure, "loom::Zero: loading " + path.string());
  return value;
}

}  // namespace loom::dist
