#pragma once
// loom::optim::EMA: an exponential moving average of a model's weights, Python's
// torch.optim.swa_utils.AveragedModel with get_ema_multi_avg_fn, updated with _foreach_lerp_
// (no host sync), swapped into the model for evaluation, saved in AveragedModel's layout.
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>

#include <loom/detail/module_tensors.hpp>
#include <loom/error.hpp>
#include <loom/state_dict.hpp>
#include <loom/state_reader.hpp>

namespace loom::optim {

/// EMA's settings: the decay per update (`decay`), or the number of steps over which a
/// weight's influence halves (`half_life`: decay = 0.5 ^ (update_every / half_life), Composer's
/// rule); an update every `update_every` calls of update(); `use_buffers` averages the
/// buffers too (BatchNorm's statistics), else copies them, as AveragedModel's flag.
struct EMAOptions {
  std::optional<double> decay = std::nullopt;
  std::optional<double> half_life = std::nullopt;
  int64_t update_every = 1;
  bool use_buffers = true;
};

/// The average of a model's parameters (and buffers), as Python's
///   AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True)
/// bit for bit: the first update copies the model, every later one is
/// `torch._foreach_lerp_(ema, model, 1 - decay)` per device and dtype (integer buffers:
/// `ema.copy_(ema * decay + model * (1 - decay))`). It holds its own tensors (no copy of the
/// module), keeps the update count on the host as well, so update() never reads the device,
/// and saves as AveragedModel's state_dict: `n_averaged`, then `module.<name>` for every
/// parameter and buffer in Python's order (`rt.save` takes it as a State entry). It keeps
/// handles to the model's tensors as they are when it is made, so an update walks no module
/// tree: make it after rt.setup (which converts the model, and under fp8-mixed replaces
/// layers); moving the model later is fine (the handles follow).
///
///   loom::optim::EMA ema(*model, {.decay = 0.999});
///   for (...) { ...; rt.optimizer_step(opt); ema.update(); }
///   { auto scope = ema.swap(); evaluate(model); }   // the averaged weights, then back
class EMA {
 public:
  explicit EMA(torch::nn::Module& model, EMAOptions options = {.decay = 0.999})
      : update_every_(options.update_every), use_buffers_(options.use_buffers) {
    if (options.decay.has_value() == options.half_life.has_value()) {
      fail("give exactly one of decay and half_life");
    }
    if (update_every_ < 1) fail("update_every must be at least 1");
    if (options.half_life) {
      if (!(*options.half_life > 0.0)) fail("half_life must be positive");
      decay_ = std::exp2(-static_cast<double>(update_every_) / *options.half_life);
    } else {
      decay_ = *options.decay;
    }
    if (!(decay_ >= 0.0 && decay_ <= 1.0)) {  // Python's check, in its words
      fail("Invalid decay value " + std::to_string(decay_) +
           " provided. Please provide a value "
           "in [0,1] range.");
    }
    at::NoGradGuard no_grad;
    std::unordered_set<std::string> buffers;
    for (const auto& b : model.named_buffers()) buffers.insert(b.key());
    for (auto& [name, t] : loom::detail::module_tensors(model)) {
      names_.push_back(name);
      live_.push_back(t);  // the handle itself: it follows set_data (a move, a swap)
      averaged_.push_back(t.detach().clone());
      buffer_.push_back(buffers.count(name) != 0);
    }
  }

  /// One call per training step (after the optimizer step); every update_every-th call
  /// averages the model's current weights in (AveragedModel.update_parameters).
  void update() {
    if (++calls_ % update_every_ != 0) return;
    at::NoGradGuard no_grad;
    const std::vector<at::Tensor>& live = live_;
    if (n_averaged_ == 0) {
      for (std::size_t i = 0; i < live.size(); ++i) averaged_[i].copy_(live[i]);
    } else {
      // Python groups by (device, dtype): _foreach_lerp_ for floating groups, the formula
      // for the others; the groups are elementwise, so one list per kind gives its bits.
      std::vector<at::Tensor> ema_f, model_f;
      for (std::size_t i = 0; i < live.size(); ++i) {
        if (!use_buffers_ && buffer_[i]) continue;
        if (at::isFloatingType(averaged_[i].scalar_type()) ||
            at::isComplexType(averaged_[i].scalar_type())) {
          ema_f.push_back(averaged_[i]);
          model_f.push_back(live[i].to(averaged_[i].device()));
        } else {
          averaged_[i].copy_(averaged_[i] * decay_ +
                             live[i].to(averaged_[i].device()) * (1.0 - decay_));
        }
      }
      if (!ema_f.empty()) at::_foreach_lerp_(ema_f, model_f, at::Scalar(1.0 - decay_));
    }
    if (!use_buffers_) {  // the buffers follow the model, as AveragedModel keeps them
      for (std::size_t i = 0; i < live.size(); ++i) {
        if (buffer_[i]) averaged_[i].copy_(live[i]);
      }
    }
    ++n_averaged_;
  }

  /// How many times the model has been averaged in (AveragedModel's n_averaged).
  int64_t n_averaged() const noexcept { return n_averaged_; }
  double decay() const noexcept { return decay_; }
  /// The averaged tensors by state_dict name (Python's order).
  std::vector<std::pair<std::string, at::Tensor>> averaged() const {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (std::size_t i = 0; i < names_.size(); ++i) out.emplace_back(names_[i], averaged_[i]);
    return out;
  }

  /// The scope of swap(): the model holds the averaged weights until it ends.
  class Swap {
   public:
    explicit Swap(EMA& ema) : ema_(&ema) { ema_->exchange(); }
    ~Swap() {
      if (ema_ != nullptr) ema_->exchange();
    }
    Swap(Swap&& o) noexcept : ema_(std::exchange(o.ema_, nullptr)) {}
    Swap(const Swap&) = delete;
    Swap& operator=(const Swap&) = delete;
    Swap& operator=(Swap&&) = delete;

   private:
    EMA* ema_;
  };

  /// Puts the averaged weights into the model until the returned scope ends (Composer's
  /// EMA for evaluation): each parameter and buffer exchanges its storage with the average
  /// (no copy, no new memory), so the optimizer, hooks and the model's tensors stay the same
  /// objects. Do not step the optimizer inside the scope.
  [[nodiscard]] Swap swap() { return Swap(*this); }

  /// AveragedModel's state_dict(): "n_averaged" (a 0-dim int64 tensor), then "module.NAME" for
  /// every parameter and buffer.
  state::Dict state_dict() const {
    state::Dict d = state::new_dict();
    d.insert("n_averaged", at::scalar_tensor(n_averaged_, at::TensorOptions(at::kLong)));
    for (std::size_t i = 0; i < names_.size(); ++i) {
      d.insert("module." + names_[i], averaged_[i].detach());
    }
    return d;
  }

  /// Loads AveragedModel's (or loom's) state: copies every averaged tensor in place (onto its
  /// device and dtype) and the count. Keys must match exactly; nothing changes when one does
  /// not. With update_every k the calls since the last update are not in the state: the next
  /// update comes k calls after the load, as after a save taken right after an update.
  void load_state_dict(const c10::IValue& state) {
    state::Reader r("loom::optim::EMA::load_state_dict", state);
    const at::Tensor n = r.tensor("n_averaged");
    if (n.numel() != 1 || at::isFloatingType(n.scalar_type())) {
      r.fail("n_averaged", "expected one integer, got a tensor of " + std::to_string(n.numel()) +
                               " " + std::string(c10::toString(n.scalar_type())) + " values");
    }
    std::vector<at::Tensor> sources;
    for (std::size_t i = 0; i < names_.size(); ++i) {
      const auto key = "module." + names_[i];
      at::Tensor t = r.tensor(key);
      if (t.sizes() != averaged_[i].sizes()) {
        r.fail(key, "has shape " + shape(t) + ", the model's is " + shape(averaged_[i]));
      }
      sources.push_back(std::move(t));
    }
    r.finish();
    at::NoGradGuard no_grad;
    for (std::size_t i = 0; i < names_.size(); ++i) averaged_[i].copy_(sources[i]);
    n_averaged_ = n.item<int64_t>();
    calls_ = n_averaged_ * update_every_;  // in phase when saved right after an update
  }

 private:
  [[noreturn]] static void fail(const std::string& what) {
    throw Error("loom::optim::EMA: " + what);
  }
  static std::string shape(const at::Tensor& t) {
    std::string s = "[";
    for (std::size_t i = 0; i < t.sizes().size(); ++i) {
      s += (i ? ", " : "") + std::to_string(t.sizes()[i]);
    }
    return s + "]";
  }
  /// Exchanges the storages of the model's tensors and the averages.
  void exchange() {
    at::NoGradGuard no_grad;
    for (std::size_t i = 0; i < live_.size(); ++i) {
      at::Tensor model_data = live_[i].variable_data();  // the model's storage, plain
      live_[i].set_data(averaged_[i]);
      averaged_[i] = model_data;
    }
  }

  int64_t update_every_;
  bool use_buffers_;
  double decay_ = 0.999;
  std::vector<std::string> names_;
  std::vector<at::Tensor> live_;      // the model's parameters and buffers, by names_
  std::vector<at::Tensor> averaged_;  // their averages
  std::vector<bool> buffer_;
  int64_t calls_ = 0, n_averaged_ = 0;
};

}  // namespace loom::optim
