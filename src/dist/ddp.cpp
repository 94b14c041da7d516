// loom::Ddp on c10d: setup (the parameters checked and broadcast, the Reducer and its Logger),
// the forward and backward passes, checkpoints and the reducer's bucket layout, driven in the
// order Python's torch.nn.parallel.DistributedDataParallel drives them. The process group and
// its collectives: process_group.cpp; join: join.cpp; hooks: comm_hooks.cpp; the
// environment: environment.cpp.
#include <loom/dist/ddp.hpp>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ATen/core/grad_mode.h>
#include <c10/util/StringUtil.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/generated/variable_factories.h>
#include <torch/nn/module.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/logger.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include <loom/checkpoint/shards.hpp>
#include <loom/detail/message_of.hpp>
#include <loom/detail/refuse_state.hpp>
#include <loom/error.hpp>

#include "common.hpp"
#include "roll_call.hpp"

namespace loom::dist {

namespace {

// Python's DistributedDataParallel's broadcast_bucket_size; the reducer's bucket sizes are
// c10d's own (c10d::kDefaultFirstBucketBytes, c10d::kDefaultBucketBytesCap in reducer.hpp).
constexpr std::size_t broadcast_bucket_bytes = 250u << 20;

/// Whether each backward searches the loss's graph for unused parameters: Python's
/// find_unused_parameters and not static_graph (a static graph learns them once).
bool searches_unused(const DdpOptions& o) { return o.find_unused_parameters && !o.static_graph; }

}  // namespace

NoSyncGuard::NoSyncGuard(detail::DdpState* state)
    : state_(state), previous_(state ? state->sync : true) {
  if (state_) state_->sync = false;
}
NoSyncGuard::~NoSyncGuard() {
  if (state_) state_->sync = previous_;
}

namespace {

/// The group's share of DdpOptions, checked with Ddp's words.
GroupOptions group_options(const DdpOptions& options, const std::string& name) {
  if (options.timeout.count() <= 0) {
    throw Error(name + ": DdpOptions::timeout must be positive");
  }
  if (options.bucket_cap_mb && !(*options.bucket_cap_mb > 0)) {
    throw Error(name + ": DdpOptions::bucket_cap_mb must be positive");
  }
  return {options.timeout, options.backend, options.exit_with_agent};
}

}  // namespace

Ddp::Ddp() : Ddp(DdpOptions{}) {}

Ddp::Ddp(DdpOptions options) : Ddp(std::move(options), "loom::Ddp", true) {}

Ddp::Ddp(DdpOptions options, std::string name, bool reducer)
    : group_(name, group_options(options, name)),
      state_(std::make_unique<detail::DdpState>(group_.state(), std::move(options))) {
  state_->reduce_gradients = reducer;
  // A failed collective drops the reducer with the group (both wait for work that never ends).
  group_.state().on_abandon = [state = state_.get()] { state->abandon(); };
}

Ddp::Ddp(Ddp&&) noexcept = default;
Ddp& Ddp::operator=(Ddp&&) noexcept = default;

Ddp::~Ddp() {
  if (!state_) return;
  auto& g = group_.state();
  // Leaving by an exception, or after a failure: the other ranks may be inside another
  // collective, so a barrier could only wait for the timeout. The group and the reducer are
  // dropped, not destroyed.
  if (g.failed || std::uncaught_exceptions() > 0) {
    g.abandon();
    return;
  }
  if (g.group && !g.torn_down) {
    try {
      teardown();
    } catch (...) {
      g.abandon();
      return;
    }
  }
  g.on_abandon = nullptr;
  state_->release();
}

const DdpOptions& Ddp::options() const { return state_->options; }

void Ddp::fail(std::string_view what, std::exception_ptr error) { group_.fail(what, error); }

namespace {

// Ddp::setup's phases after the process group connects (process_group.cpp), in the order
// setup calls them.

/// The parameters the reducer reduces, with their names by index.
struct ReducedParameters {
  std::vector<at::Tensor> params;
  std::unordered_map<std::size_t, std::string> names;
};

/// Those that require a gradient, each once, in Python's order (modules in pre-order, each
/// module's own parameters); none is an error.
ReducedParameters collect_reduced_parameters(torch::nn::Module& module,
                                             const std::string& strategy) {
  ReducedParameters r;
  std::unordered_set<const void*> seen;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const at::Tensor& p = item.value();
    if (!p.requires_grad() || !seen.insert(p.unsafeGetTensorImpl()).second) continue;
    r.names.emplace(r.params.size(), item.key());
    r.params.push_back(p);
  }
  if (r.params.empty()) {
    throw Error(strategy +
                ": the module has no parameter that requires a gradient; data "
                "parallelism has nothing to synchronize");
  }
  return r;
}

/// Python's constructor: the same parameter shapes on every rank. c10d's check fails only on
/// the ranks that differ from rank 0, leaving rank 0 waiting; a fingerprint gathered first
/// makes every rank fail.
void check_same_parameters_on_every_rank(detail::DdpState& s,
                                         const std::vector<at::Tensor>& params) {
  std::string shapes;
  std::uint64_t hash = 1469598103934665603ull;  // FNV-1a over every size, with separators
  for (const auto& p : params) {
    if (!shapes.empty()) shapes += ' ';
    shapes += c10::str(p.sizes());
    for (auto d : p.sizes()) hash = (hash ^ static_cast<std::uint64_t>(d)) * 1099511628211ull;
    hash = (hash ^ 0xffu) * 1099511628211ull;
  }
  std::vector<at::Tensor> prints;
  try {
    auto mine = torch::tensor(
        {static_cast<std::int64_t>(params.size()), static_cast<std::int64_t>(hash >> 1)},
        torch::kLong);
    std::vector<std::vector<at::Tensor>> all(1);
    for (int i = 0; i < s.g.env.world_size; ++i) all[0].push_back(at::empty_like(mine));
    std::vector<at::Tensor> in{mine};
    s.g.group->allgather(all, in)->wait();
    prints = all[0];
  } catch (...) {
    detail::throw_failure(s.g, "comparing the ranks' parameters", std::current_exception());
  }
  for (int r = 0; r < s.g.env.world_size; ++r) {
    if (!torch::equal(prints[static_cast<std::size_t>(r)], prints[0])) {
      throw Error(s.g.name + ": the ranks' models differ: rank " + std::to_string(r) + "'s " +
                  std::to_string(prints[static_cast<std::size_t>(r)][0].item<std::int64_t>()) +
                  " parameters do not have rank 0's shapes (every rank must build the same "
                  "model); this rank's (" +
                  std::to_string(s.g.env.rank) + ") shapes: " + shapes);
    }
  }
  try {
    c10d::verify_params_across_processes(s.g.group, params, std::nullopt);
  } catch (...) {
    auto error = std::current_exception();
    if (detail::is_communication_error(error)) {
      detail::throw_failure(s.g, "checking the parameters across ranks", error);
    }
    throw Error(s.g.name +
                ": the ranks' models differ (their parameters must have the same "
                "count, shapes and strides on every rank): " +
                loom::detail::message_of(error));
  }
}

/// Refuses a saved bucket layout that is not `count` parameters each once.
void check_bucket_order(const detail::DdpState& s,
                        const std::vector<std::vector<std::size_t>>& buckets, std::size_t count) {
  std::vector<bool> seen(count, false);
  std::size_t total = 0;
  for (const auto& bucket : buckets) {
    for (std::size_t i : bucket) {
      if (i >= count || seen[i]) {
        throw Error(s.g.name + "::load_state_dict: the checkpoint's bucket_order names parameter " +
                    std::to_string(i) + (i >= count ? " of " : " twice among ") +
                    std::to_string(count) +
                    " (it was saved for another model; every rank must build the same one)");
      }
      seen[i] = true;
      ++total;
    }
  }
  if (total != count) {
    throw Error(s.g.name + "::load_state_dict: the checkpoint's bucket_order holds " +
                std::to_string(total) + " parameters, this model's reducer " +
                std::to_string(count) + " (it was saved for another model)");
  }
}

/// The reducer, as Python builds it: one bucket for the first iteration unless unused
/// parameters are searched for (without a static graph), then rebuilt in gradient-ready
/// order; its Logger with it; a static graph set on both (Python's _set_static_graph).
void build_reducer(detail::DdpState& s, ReducedParameters reduced) {
  const std::int64_t cap =
      s.options.bucket_cap_mb
          ? static_cast<std::int64_t>(*s.options.bucket_cap_mb * static_cast<double>(1 << 20))
          : std::int64_t{c10d::kDefaultBucketBytesCap};
  const std::int64_t first_cap =
      s.options.bucket_cap_mb ? cap : std::int64_t{c10d::kDefaultFirstBucketBytes};
  std::vector<std::size_t> limits =
      searches_unused(s.options) ? std::vector<std::size_t>{static_cast<std::size_t>(first_cap),
                                                            static_cast<std::size_t>(cap)}
                                 : std::vector<std::size_t>{static_cast<std::size_t>(
                                       std::numeric_limits<std::int64_t>::max())};
  std::vector<bool> sparse(reduced.params.size(), false);
  auto buckets =
      std::get<0>(c10d::compute_bucket_assignment_by_size(reduced.params, limits, sparse));
  std::reverse(buckets.begin(), buckets.end());
  s.reduced_params = reduced.params;
  s.reducer = std::make_shared<c10d::Reducer>(
      reduced.params, std::move(buckets), s.g.group, std::move(sparse), cap,
      s.options.find_unused_parameters, s.options.gradient_as_bucket_view, std::move(reduced.names),
      first_cap,
      /*skip_all_reduce_unused_params=*/false, /*use_python_reducer=*/false,
      std::vector<std::int64_t>{});
  // Always a logger: the reducer dereferences it when the set of unused parameters changes.
  s.logger = std::make_shared<c10d::Logger>(s.reducer);
  s.reducer->set_logger(s.logger);
  if (s.options.static_graph) {
    s.reducer->set_static_graph();
    s.logger->set_static_graph();
  }
  detail::register_comm_hook(s);
  if (!s.loaded_buckets.empty()) {
    check_bucket_order(s, s.loaded_buckets, s.reduced_params.size());
    s.reducer->initialize_buckets(std::exchange(s.loaded_buckets, {}));
  }
}

}  // namespace

namespace detail {

/// Rank `src`'s parameters (all of them, as Python) and, with DdpOptions::broadcast_buffers,
/// its buffers, on every rank.
void broadcast_module_state(detail::DdpState& s, torch::nn::Module& module, int src) {
  try {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> states;
    for (const auto& p : module.parameters(true)) states.push_back(p.detach());
    if (s.options.broadcast_buffers) {
      for (const auto& b : module.buffers(true)) states.push_back(b.detach());
    }
    detail::broadcast_coalesced(s.g, states, broadcast_bucket_bytes, src);
  } catch (...) {
    detail::throw_failure(s.g,
                          "broadcasting rank " + std::to_string(src) + "'s parameters and buffers",
                          std::current_exception());
  }
}

/// Python's _find_common_rank: the largest rank for which `candidate` holds.
int find_common_rank(detail::DdpState& s, bool candidate) {
  at::Tensor rank = detail::flag(s.g, candidate ? s.g.env.rank : -1, at::kLong);
  detail::all_reduce(s.g, rank, ReduceOp::Max).wait();
  const auto r = rank.cpu().item<std::int64_t>();
  if (r < 0) throw Error("loom::Ddp::join: no rank qualified to hold the authoritative copy");
  return static_cast<int>(r);
}

/// The module's buffers, detached, broadcast from `src` (Python's _sync_module_buffers).
void broadcast_buffers_from(detail::DdpState& s, int src) {
  auto buffers = s.module->buffers(true);
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> detached;
  for (auto& b : buffers) detached.push_back(b.detach());
  detail::broadcast_coalesced(s.g, detached, broadcast_bucket_bytes, src);
}

/// Python's _check_sync_bufs_pre_fwd.
bool syncs_buffers_before_forward(const detail::DdpState& s) {
  return s.options.broadcast_buffers && s.forward_param_sync && !s.module->buffers(true).empty();
}

}  // namespace detail

void Ddp::setup(torch::nn::Module& module, c10::Device device, std::string_view backend) {
  auto& s = *state_;
  if (s.module) {
    throw Error(s.g.name +
                ": setup() was called a second time; one Ddp wraps one module "
                "(use one runtime per model)");
  }
  group_.connect(device, backend);
  ReducedParameters reduced = collect_reduced_parameters(module, s.g.name);
  s.module = &module;
  if (!group_.connected()) return;  // one process: nothing to reduce
  check_same_parameters_on_every_rank(s, reduced.params);
  broadcast_module_state(s, module, 0);
  if (s.reduce_gradients) build_reducer(s, std::move(reduced));
}

void Ddp::pre_forward() {
  auto& s = *state_;
  if (!s.module) {
    throw Error(s.g.name +
                ": forward before setup; call rt.setup(model) first (it connects the "
                "process group and broadcasts rank 0's weights)");
  }
  if (s.g.torn_down) throw Error(s.g.name + ": forward after teardown(); the group is shut down");
  if (!s.reducer) return;
  bool others_joined = false;
  try {
    // Python's DistributedDataParallel._pre_forward, in its order.
    if (at::GradMode::is_enabled() && s.sync) s.reducer->prepare_for_forward();
    if (s.joining) {
      // Join.notify_join_context: this rank has not joined (the joined ones add zeros).
      at::Tensor ones = detail::flag(s.g, 1);
      s.reducer->set_forward_pass_work_handle(detail::all_reduce(s.g, ones, ReduceOp::Sum).get(),
                                              s.join_options.divide_by_initial_world_size);
      if (s.join_options.throw_on_early_termination) {
        at::Tensor joined = detail::flag(s.g, 0);
        detail::all_reduce(s.g, joined, ReduceOp::Sum).wait();
        others_joined = joined.cpu().item<float>() != 0;
      }
    }
    if (!others_joined) {
      if (at::GradMode::is_enabled()) s.reducer->rebuild_buckets();  // once, in iteration 2
      if (syncs_buffers_before_forward(s)) {
        // Under join, rank 0 may have joined with stale buffers: the largest rank still in.
        broadcast_buffers_from(s, s.joining ? find_common_rank(s, true) : 0);
      }
      if (s.joining) {
        // Tells the joined ranks whether this iteration's backward synchronizes.
        at::Tensor sync = detail::flag(s.g, s.sync ? 1 : 0);
        (void)detail::all_reduce(s.g, sync, ReduceOp::Sum);  // c10d keeps the work
      }
    }
  } catch (...) {
    fail("the reducer's work before forward", std::current_exception());
  }
  if (others_joined) {
    throw Error(s.g.name + "::join: rank " + std::to_string(s.g.env.rank) +
                " found that another rank has run out of inputs "
                "(JoinOptions::throw_on_early_termination)");
  }
}

void Ddp::prepare_backward(const at::Tensor& loss) {
  auto& s = *state_;
  if (!s.reducer || !at::GradMode::is_enabled()) return;
  detail::record_backward(s, s.sync);
  if (!s.sync) {
    s.forward_param_sync = false;
    return;
  }
  s.forward_param_sync = true;
  try {
    s.reducer->prepare_for_backward(searches_unused(s.options) ? std::vector<at::Tensor>{loss}
                                                               : std::vector<at::Tensor>{});
    // A static graph's first backward: the reducer only records which gradients arrive, and
    // all-reduces every bucket once the whole pass is done (Python's _DDPSink queues the same
    // callback from the backward of the forward's outputs; here from the loss's gradient).
    if (s.options.static_graph && !s.delay_all_reduce_queued && loss.requires_grad()) {
      detail::DdpState* state = &s;
      loss.register_hook([state](const at::Tensor&) {
        if (state->delay_all_reduce_queued || !state->reducer) return;
        state->delay_all_reduce_queued = true;
        std::weak_ptr<c10d::Reducer> reducer = state->reducer;
        torch::autograd::Engine::get_default_engine().queue_callback([reducer] {
          if (auto r = reducer.lock()) r->delay_all_reduce();
        });
      });
    }
  } catch (...) {
    fail("preparing the backward pass", std::current_exception());
  }
}

NoSyncGuard Ddp::no_sync() { return NoSyncGuard(state_.get()); }

void Ddp::check_step_synchronized() { detail::check_step_synchronized(*state_); }

bool Ddp::synchronizing() const { return state_->sync; }

void Ddp::record_backward(bool synced) { detail::record_backward(*state_, synced); }

void Ddp::teardown() {
  if (group_.failed()) return;
  group_.teardown();
  state_->release();
}

void detail::check_step_synchronized(DdpState& s) {
  const int backwards = std::exchange(s.backwards_since_step, 0);
  const bool synced = std::exchange(s.synced_since_step, false);
  if (!s.g.group || s.g.env.world_size <= 1 || backwards == 0 || synced) return;
  throw Error(s.g.name + "::optimizer_step: none of the " + std::to_string(backwards) +
              " backward pass(es) since the last step reduced the gradients (each ran under "
              "rt.no_backward_sync), so every rank would step on its own gradients and the "
              "replicas would drift apart. Let the last micro-batch's backward run outside "
              "the scope: rt.no_backward_sync(model, /*enabled=*/i + 1 < micro_batches)");
}

StateDict Ddp::state_dict() const {
  const auto& s = *state_;
  if (!s.reducer) return {};
  std::unordered_map<const void*, std::int64_t> index;
  for (std::size_t i = 0; i < s.reduced_params.size(); ++i) {
    index.emplace(s.reduced_params[i].unsafeGetTensorImpl(), static_cast<std::int64_t>(i));
  }
  c10::impl::GenericList buckets(c10::ListType::ofInts());
  // The buckets' own gradient tensors (no copies): only their parameters are read.
  for (const auto& bucket : s.reducer->get_grad_buckets(/*return_zero_tensors=*/false)) {
    c10::List<std::int64_t> ids;
    for (const auto& p : bucket.getParameters()) ids.push_back(index.at(p.unsafeGetTensorImpl()));
    buckets.push_back(std::move(ids));
  }
  return {{"bucket_order", buckets}};
}

void Ddp::load_state_dict(const StateDict& state) {
  auto& s = *state_;
  StateDict rest = state;
  const auto found = rest.find("bucket_order");
  if (found == rest.end()) return loom::detail::refuse_state(strategy(), "strategy", rest);
  const c10::IValue order = found->second;
  rest.erase(found);
  loom::detail::refuse_state(strategy(), "strategy", rest);
  const std::string bad = s.g.name +
                          "::load_state_dict: bucket_order is not a list of lists of "
                          "parameter indices";
  if (!order.isList()) throw Error(bad);
  std::vector<std::vector<std::size_t>> buckets;
  for (const c10::IValue& bucket : order.toListRef()) {
    if (!bucket.isList()) throw Error(bad);
    auto& ids = buckets.emplace_back();
    for (const c10::IValue& i : bucket.toListRef()) {
      if (!i.isInt() || i.toInt() < 0) throw Error(bad);
      ids.push_back(static_cast<std::size_t>(i.toInt()));
    }
  }
  if (!s.reducer) {  // before setup, or one process: setup applies it (or has nothing to)
    s.loaded_buckets = std::move(buckets);
    return;
  }
  check_bucket_order(s, buckets, s.reduced_params.size());
  s.reducer->initialize_buckets(std::move(buckets));
}

}  // namespace loom::dist
