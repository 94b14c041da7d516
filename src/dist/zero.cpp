// loom::Zero: the partition (Python's ZeroRedundancyOptimizer's), stage 2's gradient buckets,
// the sharded optimizer step and the broadcast of the updated parameters. Checkpoints:
// zero_checkpoint.cpp.
#include <loom/dist/zero.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
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
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <loom/amp/grad_scaler.hpp>
#include <loom/checkpoint/shards.hpp>
#include <loom/detail/clip_grad.hpp>
#include <loom/detail/precision_defaults.hpp>
#include <loom/detail/tensor_groups.hpp>
#include <loom/error.hpp>
#include <loom/optim/optimizer_table.hpp>

#include "group_state.hpp"
#include "zero_state.hpp"

namespace loom::dist {

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
    : options_(options),
      ddp_(options.ddp, "loom::Zero", /*reducer=*/options.stage == 1),
      state_(std::make_unique<detail::ZeroState>()) {
  if (options_.stage != 1 && options_.stage != 2) {
    throw Error("loom::Zero: ZeroOptions::stage is 1 (optimizer state) or 2 (and gradients), not " +
                std::to_string(options_.stage));
  }
  if (options_.bucket_bytes == 0) throw Error("loom::Zero: ZeroOptions::bucket_bytes must be > 0");
}

Zero::Zero(Zero&&) noexcept = default;
Zero& Zero::operator=(Zero&&) noexcept = default;
Zero::~Zero() = default;

void Zero::fail(std::string_view what, std::exception_ptr error) {
  process_group().fail(what, error);
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
  if (stage() == 2 && process_group().connected()) {
    z.group = &process_group().state();
    z.rank = rank();
    z.share = 1.0 / static_cast<double>(world_size());
    z.all_reduce =
        options_.gradient_collective == ZeroCollective::AllReduce ||
        (options_.gradient_collective == ZeroCollective::Automatic && ddp_.backend() == "gloo");
    build_buckets(z, world_size(), options_.bucket_bytes);
  }
}

const std::vector<int>& Zero::owners() const { return state_->owners; }

void Zero::pre_forward() {
  ddp_.pre_forward();
  if (stage() == 1 || !process_group().connected()) return;
  if (ddp_.synchronizing() && at::GradMode::is_enabled()) {
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
    detail::broadcast_coalesced(process_group().state(), detached, options_.bucket_bytes, 0);
  } catch (...) {
    fail("the buffer broadcast before forward", std::current_exception());
  }
}

void Zero::reduce_gradients() {
  auto& z = *state_;
  if (at::GradMode::is_enabled()) ddp_.record_backward(z.armed);
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
  ddp_.check_step_synchronized();
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
  if (stage() == 1 || !process_group().connected()) return;
  auto& group = process_group().state();
  // Stage 2: every rank's scaler must see an inf that any shard holds.
  std::vector<at::Tensor> grads;
  for (auto& p : z.shards[static_cast<std::size_t>(rank())]) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  // The flag is a maximum of 0s and 1s: the groups' order changes nothing.
  const auto groups = loom::detail::group_by_device_and_dtype({grads});
  try {
    at::NoGradGuard no_grad;
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(group.device);
    at::Tensor found = at::zeros({1}, f32);
    for (const auto& part : groups) {
      const auto& list = part.lists[0];
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
    detail::all_reduce(group, found, ReduceOp::Max).wait();
    if (!groups.empty()) {
      // The gradient that carries the flag, whatever the groups' order: the shard's first of
      // the lowest-numbered dtype.
      const auto first =
          std::min_element(groups.begin(), groups.end(), [](const auto& a, const auto& b) {
            return std::pair(a.dtype, a.indices.front()) < std::pair(b.dtype, b.indices.front());
          });
      at::Tensor g = first->lists[0].front();
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
  if (!process_group().connected()) return;
  auto& g = process_group().state();
  auto& z = *state_;
  try {
    at::NoGradGuard no_grad;
    // Each large parameter in place (no copy), the small ones coalesced into buckets.
    const auto large = static_cast<std::int64_t>(options_.bucket_bytes / 8);
    std::vector<detail::Work> works;
    for (int r = 0; r < world_size(); ++r) {
      std::vector<at::Tensor> small;
      for (auto& p : z.shards[static_cast<std::size_t>(r)]) {
        if (static_cast<std::int64_t>(p.nbytes()) < large || !p.is_contiguous()) {
          small.push_back(p.detach());
          continue;
        }
        at::Tensor one = p.detach();
        works.push_back(detail::broadcast(g, one, r));
      }
      if (!small.empty()) {
        for (auto& w : works) w.wait();
        works.clear();
        detail::broadcast_coalesced(g, small, options_.bucket_bytes, r);
      }
    }
    for (auto& w : works) w.wait();
  } catch (...) {
    fail("the parameter broadcast after the step", std::current_exception());
  }
}

GradNorm Zero::clip_shard(torch::optim::Optimizer& optimizer, double max_norm, double norm_type,
                          const GradNorm& local) {
  auto& g = process_group().state();
  const bool inf_norm = std::isinf(norm_type);
  // The shard's norm (or its p-th power) all-reduced on the device: no host read.
  at::Tensor t = local.tensor().to(g.device, at::kDouble).reshape({1});
  t = inf_norm ? t.clone() : t.pow(norm_type);
  try {
    detail::all_reduce(g, t, inf_norm ? ReduceOp::Max : ReduceOp::Sum).wait();
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

}  // namespace loom::dist
