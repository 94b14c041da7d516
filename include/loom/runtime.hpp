#pragma once
// loom::Runtime<Device, Precision, Strategy>: the order of a training step's hooks, nothing
// else. This table and the one in docs/architecture.md are the same; change both together.
//
//   build     [p.bind_device(d.device())]                fp8-mixed: fp8 GPU     precision/
//   setup     d.prepare -> p.convert_module -> d.module_to_device
//             -> s.setup(module, d.device(), D::ddp_backend()) [-> d.optimizer_to_device]
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
//   clip      p.clip_gradients(opt, ...)                 unscales first         precision/
//   9         [s.all_reduce(p.amaxes_to_reduce(), Max)]  fp8 delayed scaling    dist/
//             applied = p.optimizer_step(opt)            may skip on inf/nan    precision/, amp/
//   state     d, p, s state_dict (prefixed)              and load_state_dict    all three
//   save      rt.save(path, state): every rank builds the value (device states gathered),
//             rank 0 writes the file atomically, every rank waits     checkpoint/, state/
//   load      rt.load(path, state): every rank reads, maps to its device, loads in place
//   teardown  p.teardown -> s.teardown -> d.teardown     after the last step    all three
#include <concepts>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <loom/batch/walk.hpp>
#include <loom/checkpoint/io.hpp>
#include <loom/concepts/device_policy.hpp>
#include <loom/concepts/precision_policy.hpp>
#include <loom/concepts/strategy.hpp>
#include <loom/detail/families.hpp>
#include <loom/detail/module.hpp>
#include <loom/detail/state_merge.hpp>
#include <loom/dist/single_process.hpp>
#include <loom/error.hpp>
#include <loom/state/entry.hpp>
#include <loom/state/values.hpp>
#include <loom/state_dict.hpp>
#include <loom/step_result.hpp>

namespace loom {

/// A training runtime: a device policy, a precision policy and a strategy policy (one process
/// unless given), called in Lightning Fabric's order. Stores its policies at no cost (empty
/// policies make an empty class) and calls every hook directly, so each call inlines to the
/// policy's code.
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

 public:
  using device_policy = Device;
  using precision_policy = Precision;
  using strategy_policy = Strategy;

  Runtime() { bind_device(); }
  explicit Runtime(Device device, Precision precision = Precision(), Strategy strategy = Strategy())
      : device_(std::move(device)),
        precision_(std::move(precision)),
        strategy_(std::move(strategy)) {
    bind_device();
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
  [[nodiscard]] auto forward_context() { return device_.precision_context(precision_); }

  /// Prepares the device, converts the module's weights, moves them to the device, then
  /// hands the module to the strategy (Ddp: shapes checked, rank 0's weights broadcast).
  template <class M>
  void setup(M& module) {
    torch::nn::Module& m = detail::as_module(module);
    device_.prepare();
    precision_.convert_module(m);
    device_.module_to_device(m);
    strategy_.setup(m, device_.device(), Device::ddp_backend());
  }

  /// setup(module), then moves the optimizer's state to the device.
  template <class M>
  void setup(M& module, torch::optim::Optimizer& optimizer) {
    setup(module);
    device_.optimizer_to_device(optimizer);
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
    strategy_.pre_forward();
    auto out = [&] {
      auto inputs = std::make_tuple(convert_input(args)...);
      [[maybe_unused]] auto guard = forward_context();
      return std::apply([&](auto&... a) { return detail::call(module, a...); }, inputs);
    }();
    return convert_output(out);
  }

  /// pre_backward, backward (inside the strategy's: gradients are reduced across processes
  /// when it returns), post_backward; returns post_backward's (detached) loss.
  template <class M>
  at::Tensor backward(const at::Tensor& loss, M& module) {
    torch::nn::Module& m = detail::as_module(module);
    at::Tensor l = precision_.pre_backward(loss, m);
    strategy_.backward(l, [&] { precision_.backward(l, m); });
    return precision_.post_backward(l, m);
  }

  /// The precision's optimizer step: whether it was applied (false: skipped, non-finite
  /// gradients). Under 16-mixed with a loom::optim optimizer the answer stays on the device
  /// until read (StepResult): the step itself makes no host sync.
  StepResult optimizer_step(torch::optim::Optimizer& optimizer) {
    if constexpr (requires {
                    { precision_.amaxes_to_reduce() } -> std::same_as<at::Tensor>;
                  }) {
      // fp8-mixed's delayed scaling: every rank takes the largest amaxes, so all keep the
      // same scales.
      if (strategy_.world_size() > 1) {
        at::Tensor amaxes = precision_.amaxes_to_reduce();
        if (amaxes.defined()) strategy_.all_reduce(amaxes, dist::ReduceOp::Max);
      }
    }
    return precision_.optimizer_step(optimizer);
  }

  /// Undoes loss scaling on the optimizer's gradients (16-mixed), so they can be inspected or
  /// clipped; does nothing for precisions without a scaler. Idempotent until the next step.
  void unscale_gradients(torch::optim::Optimizer& optimizer) {
    precision_.unscale_gradients(optimizer);
  }

  /// Clips the total gradient norm of the optimizer's parameters to `max_norm` (nothing if
  /// max_norm <= 0) and returns the norm before clipping; unscales first under 16-mixed. When
  /// a gradient is not finite the norm is nan (a 16-mixed overflow step: the step then skips).
  double clip_gradients(torch::optim::Optimizer& optimizer, double max_norm,
                        double norm_type = 2.0) {
    return precision_.clip_gradients(optimizer, max_norm, precision::ClipAlgorithm::Norm,
                                     norm_type);
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

  /// This runtime's entry in a checkpoint (what {"runtime", rt} in a loom::State saves):
  ///   {"precision": "16-mixed",
  ///    "device": [each rank's device state: {"torch": CPU RNG, "torch.cuda": CUDA RNG}],
  ///    "precision_state": {the GradScaler's five keys under 16-mixed, else empty},
  ///    "strategy": {the strategy's state}}
  /// Under Ddp every rank must call it: the device states are gathered from all ranks.
  state::Dict checkpoint_state() {
    state::Dict d = state::new_dict();
    d.insert("precision", std::string(precision_name()));
    d.insert("device", gather_device_states());
    d.insert("precision_state", state::detail::to_dict(precision_.state_dict()));
    d.insert("strategy", state::detail::to_dict(strategy_.state_dict()));
    return d;
  }

  /// Restores checkpoint_state()'s value: this rank's device state, the precision's state and
  /// the strategy's. Precision-specific state (the GradScaler) needs the precision it was
  /// saved under: otherwise (or when it is missing) loom::Error when `strict`, else a warning
  /// naming it and the state is dropped. A file from another world size: the same.
  void load_checkpoint_state(const c10::IValue& value, bool strict) {
    const std::string path = "runtime";
    const state::Dict d = state::as_dict(value, path);
    const auto name = state::at(d, "precision", path);
    if (!name.isString()) state::fail(state::join(path, "precision"), "expected a string");
    const std::string saved = name.toStringRef();
    auto problem = [&](const std::string& where, const std::string& what) {
      if (strict) state::fail(where, what);
      TORCH_WARN("loom::load: '", where, "': ", what, "; not restored (strict=false)");
    };
    // Device: this rank's entry.
    if (state::has(d, "device")) {
      const auto ranks = state::as_sequence(state::at(d, "device", path), path + ".device");
      const auto world = static_cast<std::size_t>(strategy_.world_size());
      if (ranks.size() != world) {
        problem(path + ".device", "the checkpoint holds the device states of " +
                                      std::to_string(ranks.size()) + " rank(s), this run has " +
                                      std::to_string(world));
      } else {
        const auto rank = static_cast<std::size_t>(strategy_.rank());
        device_.load_state_dict(state::detail::from_dict(ranks[rank], path + ".device"));
      }
    }
    // Precision: only under the same precision.
    const StateDict mine = precision_.state_dict();
    const StateDict theirs = state::has(d, "precision_state")
                                 ? state::detail::from_dict(state::at(d, "precision_state", path),
                                                            path + ".precision_state")
                                 : StateDict{};
    if (saved == precision_name()) {
      precision_.load_state_dict(theirs);
    } else if (!theirs.empty()) {
      problem(path + ".precision_state",
              "holds the state of precision \"" + saved + "\" (" + theirs.begin()->first +
                  ", ...), which this runtime's \"" + std::string(precision_name()) +
                  "\" cannot use; model and optimizer states load under any precision, "
                  "precision-specific state only under its own");
    } else if (!mine.empty()) {
      problem(path + ".precision_state", "the checkpoint was saved under precision \"" + saved +
                                             "\", which has no state; this runtime's \"" +
                                             std::string(precision_name()) + "\" needs its own (" +
                                             mine.begin()->first + ", ...)");
    }
    if (state::has(d, "strategy")) {
      strategy_.load_state_dict(
          state::detail::from_dict(state::at(d, "strategy", path), path + ".strategy"));
    }
  }

  /// Writes `state` to `path` as a torch.save file that stock Python opens with
  /// torch.load(path): {name: value} for every entry, in order (state/entry.hpp says what
  /// each kind of object becomes). Atomic: the old file stays whole until the new one has
  /// been written and synced (`{.sync = false}` skips the fsyncs: see
  /// checkpoint::SaveOptions). Call it on every rank: each builds its part (the runtime's
  /// device states are gathered), rank 0 writes, every rank returns once the file is there;
  /// a failed write throws loom::Error on every rank.
  void save(const std::filesystem::path& path, const State& state,
            checkpoint::SaveOptions options = {}) {
    state::Dict d = state::new_dict();
    for (const auto& e : state) {
      if (state::has(d, e.name())) {
        throw Error("loom::save: the state names '" + e.name() + "' twice");
      }
      d.insert(e.name(), e.save());
    }
    std::string failure;
    if (strategy_.rank() == 0) {
      try {
        checkpoint::save_value(path, d, options);
      } catch (const std::exception& ex) {
        failure = ex.what();
      }
    }
    if (strategy_.world_size() > 1) {
      at::Tensor failed = device_.tensor_to_device(
          at::full({1}, failure.empty() ? 0 : 1, at::TensorOptions().dtype(at::kInt)));
      strategy_.all_reduce(failed, dist::ReduceOp::Max);
      if (failure.empty() && failed.cpu().item<int>() != 0) {
        throw Error("loom::save: rank 0 could not write " + path.string());
      }
    }
    if (!failure.empty()) throw Error(failure);
  }

  /// Restores every entry of `state` in place from the file at `path` (loom's or Python's:
  /// torch.save(model.state_dict()), fabric.save(...)), with tensors mapped to this runtime's
  /// device, and returns what the file holds beyond `state`. With `strict` (the default) a
  /// name missing from the file, and in a module a missing or unexpected key or a mismatched
  /// shape, is a loom::Error naming the key; without it, missing names and keys are warned
  /// about and skipped. Model and optimizer states load under any precision (cast to the
  /// parameters' dtypes); see load_checkpoint_state for the precision's own. Every rank calls
  /// it and reads the file.
  StateDict load(const std::filesystem::path& path, const State& state, bool strict = true) {
    const c10::IValue value = checkpoint::load_value(path, device_.device());
    const state::Dict d = state::as_dict(value, path.string());
    for (const auto& e : state) {
      auto it = d.find(c10::IValue(e.name()));
      if (it == d.end()) {
        if (strict) {
          throw Error("loom::load: '" + e.name() + "' is not in the checkpoint " + path.string() +
                      " (strict=true)");
        }
        TORCH_WARN("loom::load: '", e.name(), "' is not in the checkpoint ", path.string(),
                   "; left as it is (strict=false)");
        continue;
      }
      e.load(it->value(), strict);
    }
    StateDict rest;
    for (const auto& item : d) {
      if (!item.key().isString()) continue;
      bool named = false;
      for (const auto& e : state) named = named || e.name() == item.key().toStringRef();
      if (!named) rest.emplace(item.key().toStringRef(), item.value());
    }
    return rest;
  }

  /// Releases what the policies hold, after the last step: the precision's, the strategy's
  /// (Ddp: a barrier, then the process group shuts down), then the device's (Cuda waits for
  /// its work and empties the allocator's cache).
  void teardown() {
    precision_.teardown();
    strategy_.teardown();
    device_.teardown();
  }

 private:
  // A precision that depends on the device (fp8-mixed: can this GPU run fp8 products?)
  // learns it once, when the runtime is built.
  void bind_device() {
    if constexpr (requires(c10::Device d) { precision_.bind_device(d); }) {
      precision_.bind_device(device_.device());
    }
  }

  /// Each rank's device state, in rank order (one process: its own). Tensors are gathered
  /// with an all_reduce of a zero-filled (world, n) buffer each rank fills its row of.
  c10::impl::GenericList gather_device_states() {
    c10::impl::GenericList out(c10::AnyType::get());
    const StateDict mine = device_.state_dict();
    const int world = strategy_.world_size();
    if (world <= 1) {
      out.push_back(state::detail::to_dict(mine));
      return out;
    }
    std::vector<StateDict> all(static_cast<std::size_t>(world));
    for (const auto& [key, value] : mine) {
      if (!value.isTensor()) {
        for (auto& s : all) s.emplace(key, value);
        continue;
      }
      const at::Tensor t = value.toTensor();
      at::Tensor buf = device_.tensor_to_device(at::zeros({world, t.numel()}, t.options()));
      buf[strategy_.rank()].copy_(t.reshape({-1}));
      strategy_.all_reduce(buf, dist::ReduceOp::Sum);
      const at::Tensor host = buf.cpu();
      for (int r = 0; r < world; ++r) {
        all[static_cast<std::size_t>(r)].emplace(key, host[r].reshape(t.sizes()).clone());
      }
    }
    for (auto& s : all) out.push_back(state::detail::to_dict(s));
    return out;
  }

  [[no_unique_address]] Device device_;
  [[no_unique_address]] Precision precision_;
  [[no_unique_address]] Strategy strategy_;
};

}  // namespace loom
