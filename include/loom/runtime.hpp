#pragma once
// loom::Runtime<Device, Precision, Strategy>: the order of a training step's hooks; beyond it
// only hand-offs (rt.save / rt.load to state/checkpoint.hpp, rt.log to the loggers added). This
// table and the one in docs/architecture.md are the same; change both together.
//
//   build     p.bind_device(d.device())                  fp8-mixed: fp8 GPU     precision/
//   setup     d.prepare -> p.convert_module -> [empty: nn::materialize] -> d.module_to_device
//             -> s.setup(module, d.device(), D::ddp_backend()) [-> d.optimizer_to_device]
//             (empty: built under loom::EmptyInit; S::takes_empty_modules: s.setup does both)
//   1         batch = rt.to_device(batch)                every tensor leaf      device/
//   2         s.pre_forward()                            buckets, buffers       dist/
//   3         args  = batch::map(args, p.convert_input)  floating leaves        precision/
//   4         { auto guard = d.precision_context(p);     autocast/dtype scope   precision/
//   5             out = module->forward(args...); }      user code
//   6         out = batch::map(out, p.convert_output)    back to default dtype  precision/
//   7         l = p.pre_backward(loss, module)           loss scaling           precision/
//   8         s.backward(l, [&] { p.backward(l, module); }); p.post_backward(l, module)
//                                                        gradients reduced      dist/, amp/
//   unscale   p.unscale_gradients(opt)                   undo loss scaling      precision/, amp/
//   clip      s.clip_gradients(opt, max, type, [&](m) { return p.clip_gradients(opt, m, ..); })
//                                                        unscales first         precision/
//   9         s.all_reduce(p.max_reduced_before_step(), Max) (if defined, world > 1)
//                                                        fp8 delayed scaling    dist/
//             applied = s.optimizer_step({opt}, unscale, [&] { return p.optimizer_step(opt); })
//                                                        may skip on inf/nan    precision/, amp/
//             (several: p.optimizer_steps({o1, o2}), one scaler update)   Zero: shard, gather
//   state     d, p, s state_dict (prefixed)              and load_state_dict    all three
//   save      rt.save(path, state): s.save_checkpoint(path, state, io) gets the typed entries,
//             saves them on every rank (device states gathered); Ddp: rank 0 writes  state/, dist/
//   load      v = s.load_checkpoint(path, state, io, d.device()); every entry loads in place
//   log       rt.log / log_dict / log_hyperparams -> the loggers (rank 0)    loggers/
//   teardown  loggers flushed, p.teardown -> s.teardown -> d.teardown        all three
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/Exception.h>
#include <torch/optim/optimizer.h>

#include <loom/batch/walk.hpp>
#include <loom/checkpoint/checkpoint_io.hpp>
#include <loom/concepts/device_policy.hpp>
#include <loom/concepts/precision_policy.hpp>
#include <loom/concepts/strategy.hpp>
#include <loom/detail/checkpoint_files.hpp>
#include <loom/detail/empty_module.hpp>
#include <loom/detail/families.hpp>
#include <loom/detail/module.hpp>
#include <loom/detail/runtime_steps.hpp>
#include <loom/detail/state_merge.hpp>
#include <loom/dist/single_process.hpp>
#include <loom/error.hpp>
#include <loom/guards.hpp>
#include <loom/loggers/logger.hpp>
#include <loom/state_dict.hpp>
#include <loom/step_result.hpp>

namespace loom {

/// A training runtime: a device policy, a precision policy and a strategy policy (one process
/// unless given), called in Lightning Fabric's order. Stores its policies at no cost (empty
/// policies take no space; the runtime adds its list of loggers and a setup flag) and calls
/// every hook directly, so each call inlines to the policy's code.
///
///   loom::Runtime<loom::Cpu, loom::Fp32> rt;
///   rt.setup(model, optimizer);
///   auto out = rt.forward(model, rt.to_device(x));           // (B, classes) fp32
///   rt.backward(loss, model); rt.optimizer_step(optimizer);
template <class Device, class Precision, class Strategy = dist::SingleProcess>
class Runtime {
  // Order first: a policy in the wrong place explains every other failure, so then nothing
  // else is checked. Then each argument's check (detail/families.hpp): a known mistake gives
  // its one message, anything else one message per missing row.
  static constexpr bool in_order = detail::policies_in_order<Device, Precision, Strategy>();
  static_assert(in_order,
                "loom::Runtime: the policy arguments are out of order; the device policy comes "
                "first, then the precision policy, then the strategy policy, as in "
                "Runtime<loom::Cpu, loom::Fp32, loom::Ddp>");
  static_assert(detail::check_policies<in_order>(detail::families{}, static_cast<Device*>(nullptr),
                                                 static_cast<Precision*>(nullptr),
                                                 static_cast<Strategy*>(nullptr)));
  static_assert(!in_order || detail::strategy_takes_precision<Strategy, Precision>(),
                "loom::Runtime: the strategy refuses this precision (its takes_precision(name) "
                "is false for the precision's name); loom::Fsdp refuses 16-mixed: the loss "
                "scaler's inf check would not be agreed over the ranks' pieces");

 public:
  using device_policy = Device;
  using precision_policy = Precision;
  using strategy_policy = Strategy;

  Runtime() { precision_.bind_device(device_.device()); }
  explicit Runtime(Device device, Precision precision = Precision(), Strategy strategy = Strategy())
      : device_(std::move(device)),
        precision_(std::move(precision)),
        strategy_(std::move(strategy)) {
    precision_.bind_device(device_.device());
  }

  /// The precision's Lightning name, e.g. "32-true".
  static constexpr std::string_view precision_name() { return Precision::precision(); }

  Device& device() noexcept { return device_; }
  const Device& device() const noexcept { return device_; }
  Precision& precision() noexcept { return precision_; }
  const Precision& precision() const noexcept { return precision_; }
  /// The strategy: rank(), world_size(), barrier(), all_reduce(t, op), no_sync(), ...
  Strategy& strategy() noexcept { return strategy_; }
  const Strategy& strategy() const noexcept { return strategy_; }

  /// The scope to build a model in: parameters get the precision's dtype.
  [[nodiscard]] auto module_init_context() { return precision_.module_init_context(); }
  /// The scope to create tensors in: floating factories give the precision's dtype.
  [[nodiscard]] auto tensor_init_context() { return precision_.tensor_init_context(); }
  /// The forward scope (autocast or default dtype) bound to this runtime's device.
  [[nodiscard]] auto forward_context() {
    forwards_.opened();  // rt.forward opens it too
    return device_.precision_context(precision_);
  }

  /// Prepares the device, converts the module's weights, moves them to the device, then
  /// hands the module to the strategy (Ddp: shapes checked, rank 0's weights broadcast). A
  /// module built under loom::EmptyInit gets uninitialized memory on the device (loom::Fsdp:
  /// each rank its pieces only) and no values: forward refuses to run until rt.load or
  /// rt.reset_parameters gives them.
  template <class M>
  void setup(M& module) {
    torch::nn::Module& m = detail::as_module(module);
    device_.prepare();
    precision_.convert_module(m);
    const bool empty =
        detail::give_memory<Strategy>(m, device_.device(), [&] { device_.module_to_device(m); });
    strategy_.setup(m, device_.device(), Device::ddp_backend());
    stage_ = empty ? detail::Stage::Empty : detail::Stage::Ready;
  }

  /// The modules' own initialization after setup (nn/empty_init.hpp): `init` runs on each
  /// module holding parameters or buffers of its own, in registration order, on whole CPU
  /// tensors made for that module alone, whose values are then kept (loom::Fsdp: each rank its
  /// pieces); the default knows LibTorch's layers (nn::reset_parameters). Seeded as before
  /// building, a model of LibTorch's layers gets the values a normal build gives it, on every
  /// strategy and world size. What a module built under loom::EmptyInit calls when no
  /// checkpoint gives its values; a collective under a distributed strategy.
  template <class M>
  void reset_parameters(M& module, const nn::Initializer& init = nn::reset_parameters) {
    if (stage_ == detail::Stage::Built) [[unlikely]]
      detail::throw_not_ready(stage_, "reset_parameters");
    detail::reset_parameters(strategy_, detail::as_module(module), init);
    stage_ = detail::Stage::Ready;
  }

  /// setup(module), then moves each optimizer's state to the device (Fabric's
  /// `setup(model, opt1, opt2)`: a GAN's two optimizers, a Muon + AdamW split).
  template <class M, std::derived_from<torch::optim::Optimizer>... O>
  requires(sizeof...(O) > 0) void setup(M& module, O&... optimizers) {
    setup(module);
    (device_.optimizer_to_device(optimizers), ...);
  }

  /// Moves the optimizer's state to the device: after loading optimizer state into an
  /// optimizer that setup(module, optimizer) has already seen (a resume).
  torch::optim::Optimizer& optimizer_to_device(torch::optim::Optimizer& optimizer) {
    return device_.optimizer_to_device(optimizer);
  }

  /// A copy of a (nested) batch with every tensor on the device.
  template <class B>
  B to_device(const B& batch) const {
    return batch::map(batch, [this](const at::Tensor& t) { return device_.tensor_to_device(t); });
  }

  /// A copy of a (nested) batch cast for the model's input.
  template <class B>
  B convert_input(const B& batch) {
    return batch::map(batch, [this](const at::Tensor& t) { return precision_.convert_input(t); });
  }

  /// A copy of a (nested) output cast back to the default dtype.
  template <class B>
  B convert_output(const B& batch) {
    return batch::map(batch, [this](const at::Tensor& t) { return precision_.convert_output(t); });
  }

  /// The strategy's pre_forward, convert_input on every argument, the call inside
  /// forward_context, convert_output after the scope has closed.
  template <class M, class... Args>
  auto forward(M&& module, const Args&... args) {
    if (stage_ != detail::Stage::Ready) [[unlikely]]
      detail::throw_not_ready(stage_, "forward");
    strategy_.pre_forward();
    auto out = [&] {
      auto inputs = std::make_tuple(convert_input(args)...);
      [[maybe_unused]] auto guard = forward_context();
      return std::apply([&](auto&... a) { return detail::call(module, a...); }, inputs);
    }();
    return convert_output(out);
  }

  /// Fabric's no_backward_sync: while the scope lives, backward leaves the gradients local
  /// (the strategy's no_sync(): Ddp's reducer skips its all-reduces); the first backward after
  /// it reduces the accumulated sum, one all-reduce per bucket. With `enabled` false, or on
  /// one process, the scope does nothing, so an accumulation loop writes one line:
  ///
  ///   for (std::size_t i = 0; i < micro.size(); ++i) {
  ///     auto scope = rt.no_backward_sync(model, i + 1 < micro.size());
  ///     rt.backward(loss_of(micro[i]) / double(micro.size()), model);
  ///   }
  ///   rt.optimizer_step(optimizer);
  ///
  /// `module` is the model setup() was given; before setup it is a loom::Error, as forward is.
  template <class M>
  [[nodiscard]] auto no_backward_sync(M& module, bool enabled = true) {
    (void)detail::as_module(module);
    if (stage_ == detail::Stage::Built) [[unlikely]]
      detail::throw_not_ready(stage_, "no_backward_sync");
    return OptionalScope<decltype(strategy_.no_sync())>(enabled,
                                                        [this] { return strategy_.no_sync(); });
  }

  /// pre_backward, backward (inside the strategy's: gradients are reduced across processes
  /// when it returns), post_backward; returns post_backward's (detached) loss.
  template <class M>
  at::Tensor backward(const at::Tensor& loss, M& module) {
    torch::nn::Module& m = detail::as_module(module);
    if (forwards_.first_direct_backward()) [[unlikely]] {
      detail::warn_direct_backward(precision_name());
    }
    at::Tensor l = precision_.pre_backward(loss, m);
    strategy_.backward(l, [&] { precision_.backward(l, m); });
    return precision_.post_backward(l, m);
  }

  /// The precision's optimizer step: whether it was applied (false: skipped, non-finite
  /// gradients). Under 16-mixed with a loom::optim optimizer the answer stays on the device
  /// until read (StepResult): the step itself makes no host sync.
  StepResult optimizer_step(torch::optim::Optimizer& optimizer) {
    forwards_.stepped();
    agree_before_step();
    const OptimizerRef one[] = {optimizer};
    return strategy_.optimizer_step(
        Optimizers(one), [&] { precision_.unscale_gradients(optimizer); },
        [&] { return StepResult(precision_.optimizer_step(optimizer)); });
  }

  /// One step of several optimizers that share the backward (a GAN's generator and
  /// discriminator, Muon on the matrices and AdamW on the rest): each steps, in order, and
  /// each result says whether that one was applied. Under 16-mixed this is Python's recipe,
  /// `scaler.step(o1); scaler.step(o2); scaler.update()`: each optimizer unscales its own
  /// gradients (once: an earlier unscale_gradients or clip_gradients counts) and skips only
  /// on its own inf/nan, then the scale is updated once from all their checks. An empty list
  /// or an optimizer named twice is a loom::Error.
  std::vector<StepResult> optimizer_step(Optimizers optimizers) {
    detail::check_distinct(optimizers);
    forwards_.stepped();
    agree_before_step();
    return strategy_.optimizer_step(
        optimizers,
        [&] {
          for (torch::optim::Optimizer& o : optimizers) precision_.unscale_gradients(o);
        },
        [&] { return precision_.optimizer_steps(optimizers); });
  }
  /// `rt.optimizer_step({o1, o2})`.
  std::vector<StepResult> optimizer_step(std::initializer_list<OptimizerRef> optimizers) {
    return optimizer_step(Optimizers(optimizers.begin(), optimizers.size()));
  }

  /// Undoes loss scaling on the optimizer's gradients (16-mixed), so they can be inspected or
  /// clipped; does nothing for precisions without a scaler. Idempotent until the next step.
  void unscale_gradients(torch::optim::Optimizer& optimizer) {
    precision_.unscale_gradients(optimizer);
  }

  /// Clips the total gradient norm of the optimizer's parameters to `max_norm` (nothing if
  /// max_norm <= 0) and returns the norm before clipping; unscales first under 16-mixed.
  /// Python's `clip_grad_norm_(foreach=True)`: the norm is computed and the gradients scaled on
  /// the device, so clipping makes no host sync; the GradNorm reads the norm when asked. When
  /// a gradient is not finite the norm is nan or inf (a 16-mixed overflow step: the step then
  /// skips); `error_if_nonfinite` reads the norm (one sync) and makes that a loom::Error.
  GradNorm clip_gradients(torch::optim::Optimizer& optimizer, double max_norm,
                          double norm_type = 2.0, bool error_if_nonfinite = false) {
    if (max_norm <= 0) return GradNorm(0.0);
    GradNorm norm = strategy_.clip_gradients(optimizer, max_norm, norm_type, [&](double threshold) {
      return precision_.clip_gradients(optimizer, threshold, precision::ClipAlgorithm::Norm,
                                       norm_type);
    });
    if (error_if_nonfinite) detail::check_finite_norm(norm, norm_type);
    return norm;
  }

  /// Clips every gradient element of the optimizer's parameters to [-value, value] (nothing
  /// if value <= 0); unscales first under 16-mixed.
  void clip_gradients_by_value(torch::optim::Optimizer& optimizer, double value) {
    precision_.clip_gradients(optimizer, value, precision::ClipAlgorithm::Value, 0.0);
  }

  /// The factor the loss is scaled by before backward: the GradScaler's scale under 16-mixed
  /// (reading it syncs with a CUDA device), 1 for every other precision.
  double loss_scale() const { return precision_.loss_scale(); }

  /// The device's view of a batch source: batches moved, then passed through `fn`.
  template <class Source, class... Fn>
  auto dataloader(Source& source, Fn... fn) {
    return device_.dataloader_to_device(source, std::move(fn)...);
  }

  /// Every policy's state, keys prefixed "device.", "precision." and "strategy.", plus
  /// "precision": the precision's name, which load_state_dict checks.
  StateDict state_dict() const {
    return detail::merge_states(precision_name(), {{"device.", device_.state_dict()},
                                                   {"precision.", precision_.state_dict()},
                                                   {"strategy.", strategy_.state_dict()}});
  }

  /// Loads what state_dict() saved; refuses a state saved under another precision, or with
  /// keys no policy owns.
  void load_state_dict(const StateDict& state) {
    auto parts =
        detail::split_states(state, precision_name(), {"device.", "precision.", "strategy."});
    device_.load_state_dict(parts[0]);
    precision_.load_state_dict(parts[1]);
    strategy_.load_state_dict(parts[2]);
  }

  /// Writes `state` to `path` as a torch.save file that stock Python opens with
  /// torch.load(path): {name: value} for every entry, in order (state/entry.hpp says what
  /// each kind of object becomes; the runtime's own entry is state/runtime.hpp's). Atomic: the
  /// old file stays whole until the new one has been written and synced (`{.sync = false}`
  /// skips the fsyncs: see checkpoint::SaveOptions). Call it on every rank: each builds its
  /// part (the runtime's device states are gathered), then the strategy's save_checkpoint
  /// decides who writes (Ddp: rank 0; a failed write throws loom::Error on every rank).
  /// Needs <loom/state/checkpoint.hpp> (included by <loom/loom.hpp>).
  template <class S = State>
  void save(const std::filesystem::path& path,
            const S& state,  // loom::State: #include <loom/state/checkpoint.hpp>
            checkpoint::SaveOptions options = {}) {
    detail::checkpoint_files<S>::save(*this, path, state, options);
  }

  /// Restores every entry of `state` in place from the file at `path` (loom's or Python's:
  /// torch.save(model.state_dict()), fabric.save(...)), read through the strategy's
  /// load_checkpoint with tensors mapped to this runtime's device, and returns what the file
  /// holds beyond `state`. With `strict` (the default) a name missing from the file, and in a
  /// module a missing or unexpected key or a mismatched shape, is a loom::Error naming the
  /// key; without it, missing names and keys are warned about and skipped. A file another
  /// number of ranks wrote needs LoadOptions::world_size_may_change (the overload below). Model and
  /// optimizer states load under any precision (cast to the parameters' dtypes); the
  /// precision's own state only under its own precision. A file that cannot be read whole
  /// throws loom::CheckpointUnreadable; one that reads but does not fit `state` or this
  /// runtime, loom::CheckpointMismatch (both loom::Error, error.hpp). Every rank calls it and
  /// reads the file. Needs <loom/state/checkpoint.hpp> (included by <loom/loom.hpp>).
  template <class S = State>
  StateDict load(const std::filesystem::path& path,
                 const S& state,  // loom::State: #include <loom/state/checkpoint.hpp>
                 bool strict = true) {
    return load(path, state, LoadOptions{.strict = strict});
  }
  /// rt.load with all of its settings (state/load_options.hpp).
  template <class S = State>
  StateDict load(const std::filesystem::path& path, const S& state, const LoadOptions& options) {
    StateDict rest = detail::checkpoint_files<S>::load(
        *this, path, state, detail::load_options_at<Strategy>(stage_, options));
    if (stage_ == detail::Stage::Empty) stage_ = detail::Stage::Ready;  // the values are in
    return rest;
  }

  /// Adds a logger that log, log_dict and log_hyperparams feed (Fabric's `loggers=`), first
  /// giving it the strategy's rank (Logger::attach: Fabric sets its loggers' rank from the
  /// strategy); a logger given another LoggerOptions::rank is a loom::Error.
  void add_logger(std::shared_ptr<Logger> logger) {
    if (logger) logger->attach(static_cast<int64_t>(strategy_.rank()));
    loggers_.add(std::move(logger));  // a null one: loom::Error
  }
  /// The loggers added.
  const Loggers& loggers() const noexcept { return loggers_; }

  /// Fabric's log(name, value, step): one row for every logger, on global rank 0 only (other
  /// ranks return at once and read nothing). A tensor value is copied on its device and read
  /// when the logger flushes, once for all the values buffered.
  void log(std::string_view name, const MetricValue& value, int64_t step) {
    if (Loggers* l = rank0_loggers()) l->log(name, value, step);
  }
  /// Fabric's log_dict(metrics, step): one row of several metrics.
  void log_dict(std::initializer_list<std::pair<std::string_view, MetricValue>> metrics,
                int64_t step) {
    if (Loggers* l = rank0_loggers()) l->log_dict(metrics, step);
  }
  /// log_dict of metrics built at run time (a monitor's, say).
  void log_dict(const std::vector<std::pair<std::string, MetricValue>>& metrics, int64_t step) {
    if (Loggers* l = rank0_loggers()) l->log_dict(metrics, step);
  }
  /// Lightning's log_hyperparams, on global rank 0.
  void log_hyperparams(const Hyperparams& params) {
    if (Loggers* l = rank0_loggers()) l->log_hyperparams(params);
  }

  /// Releases what the policies hold, after the last step: the loggers' buffered rows are
  /// written, then the precision's, the strategy's (Ddp: a barrier, then the process group
  /// shuts down), then the device's (Cuda waits for its work and empties the allocator's
  /// cache).
  void teardown() {
    if (Loggers* l = rank0_loggers()) l->flush();
    precision_.teardown();
    strategy_.teardown();
    device_.teardown();
  }

 private:
  // What every rank must agree on before a step (fp8-mixed's amaxes), all-reduced with Max.
  void agree_before_step() {
    if (strategy_.world_size() > 1) {
      at::Tensor shared = precision_.max_reduced_before_step();
      if (shared.defined()) strategy_.all_reduce(shared, dist::ReduceOp::Max);
    }
  }

  // The loggers this process feeds: all of them on global rank 0, none elsewhere (other ranks
  // neither buffer nor read anything).
  Loggers* rank0_loggers() {
    return !loggers_.empty() && strategy_.rank() == 0 ? &loggers_ : nullptr;
  }

  [[no_unique_address]] Device device_;
  [[no_unique_address]] Precision precision_;
  [[no_unique_address]] Strategy strategy_;
  Loggers loggers_;
  // Before setup, set up without values (EmptyInit), ready: forward runs only when ready.
  detail::Stage stage_ = detail::Stage::Built;
  // Under a precision whose forward runs in autocast: whether a forward scope opened since the
  // last step (detail/runtime_steps.hpp); other precisions hold nothing for it.
  [[no_unique_address]] std::conditional_t<Precision::precision().ends_with("-mixed"),
                                           detail::ForwardCount, detail::NoForwardCount>
      forwards_;
};

}  // namespace loom
