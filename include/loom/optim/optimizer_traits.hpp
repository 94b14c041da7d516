#pragma once
// loom::optim::optimizer_traits<O>: what loom knows about the optimizer type O, one row of
// loom's optimizer table (optim/optimizer_table.hpp, docs/optim.md "Your own optimizer").
//
// clang-format off
//   member                          what loom does with it                    TraitsDefaults
//   options, param_state            the types of O's group options and of     (required)
//                                   one parameter's state
//   name                            O in loom's messages                      (required)
//   python_layout                   false: rt.save refuses O                  true
//   save_options(o, dict)           a param group's keys (all but "params")   (required while
//                                   in Python's order                          python_layout)
//   load_options(o, reader)         sets o from a checkpoint's param group
//   save_state(s, dict)             one parameter's state, Python's keys
//   load_state(reader, group)       one parameter's state from a checkpoint
//   move_state(s, device)           moves every tensor of s                   (required)
//   momentum                        which option OneCycleLR cycles            MomentumKind::None
//   momentum_of(o)                  that option, as double&                   (required unless
//                                                                              None)
//   amp                             how a GradScaler steps O                  AmpSupport::HostCheck
//   set_amp(opt, scale, found_inf)  the fused hand-over (docs/optim.md)       (required when Fused)
// clang-format on
//
// Every member is static. `o`: options&, `s`: param_state&, `dict`: c10::impl::GenericDict&,
// `reader`: const PythonReader&, `group`: const options& (the group's options just loaded).
// register_optimizer<O>() checks the table and names the first member that is missing.
#include <optional>
#include <string_view>
#include <type_traits>
#include <vector>

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/optim/optimizer.h>

namespace loom::optim {

/// Which of Python's momentum hyper-parameters an optimizer's options hold: OneCycleLR cycles
/// it (Python's `use_beta1`), and a scheduler rolls it back with the lr after a skipped step.
enum class MomentumKind {
  None,      ///< no momentum: OneCycleLR with cycle_momentum refuses the optimizer
  Momentum,  ///< `momentum` (SGD, RMSprop)
  Beta1,     ///< `betas[0]` (Adam, AdamW)
};

/// How an optimizer steps under a GradScaler (16-mixed).
enum class AmpSupport {
  /// The scaler unscales the gradients, reads found_inf on the host (one sync) and calls
  /// step() only when it is zero. Any optimizer can.
  HostCheck,
  /// The optimizer takes the scale and the device-side found_inf through set_amp and does
  /// nothing where found_inf is set: no host sync (loom::optim's fused optimizers).
  Fused,
  /// The optimizer unscales the gradients inside its own step: 16-mixed steps it as
  /// HostCheck but refuses to clip its gradients (they would be unscaled twice).
  SelfUnscaling,
  /// The optimizer cannot run under a scaler (LBFGS: its closure recomputes the gradients
  /// unscaled); 16-mixed refuses it.
  Refused,
};

/// What a Python layout reads from one dict of a checkpoint (a param group, or one parameter's
/// state): typed values whose errors name the key path ("loom::load: 'optimizer.param_groups.0
/// .lr': expected a number, ..."). state/optimizer.hpp implements it over state/values.hpp.
class PythonReader {
 public:
  /// Whether the dict holds `key` with a value other than None.
  virtual bool has(std::string_view key) const = 0;
  /// A number: a Python float, int or bool, or a one-element tensor (Python's `step`).
  virtual double number(std::string_view key) const = 0;
  /// A bool (or the ints 0 and 1).
  virtual bool boolean(std::string_view key) const = 0;
  /// The numbers of a list or a tuple (Adam's `betas`).
  virtual std::vector<double> numbers(std::string_view key) const = 0;
  /// A state tensor as its parameter's: the parameter's shape (else an error), on its device,
  /// in its dtype when both are floating point (Python's rule for every state but `step`).
  /// When loading from a file it may be the optimizer's own tensor for this key, which the
  /// checkpoint's values fill once every parameter's state has been read: load_state keeps
  /// it (as loom's rows do) and reads none of its values.
  virtual at::Tensor tensor(std::string_view key) const = 0;
  /// The parameter whose state this dict is (undefined for a param group).
  virtual const at::Tensor& param() const = 0;
  /// Throws loom::Error naming `key` under this dict's path (the dict itself if `key` is empty).
  [[noreturn]] virtual void fail(std::string_view key, std::string_view what) const = 0;

  /// number(key), or `fallback` when the dict has no such key (or None).
  double number_or(std::string_view key, double fallback) const {
    return has(key) ? number(key) : fallback;
  }
  /// boolean(key), or `fallback` when the dict has no such key (or None).
  bool boolean_or(std::string_view key, bool fallback) const {
    return has(key) ? boolean(key) : fallback;
  }

  PythonReader() = default;
  PythonReader(const PythonReader&) = delete;
  PythonReader& operator=(const PythonReader&) = delete;
  virtual ~PythonReader() = default;
};

/// What an optimizer_traits specialization inherits: Python's layout expected, no momentum, the
/// scaler's host-checked step (see the table at the top of this file).
struct TraitsDefaults {
  static constexpr bool python_layout = true;
  static constexpr MomentumKind momentum = MomentumKind::None;
  static constexpr AmpSupport amp = AmpSupport::HostCheck;
};

/// What loom knows about the optimizer type O: specialize it (deriving from TraitsDefaults),
/// then call register_optimizer<O>() once. The primary template is left undefined, so that
/// register_optimizer names the missing specialization.
template <class O>
struct optimizer_traits;

}  // namespace loom::optim
