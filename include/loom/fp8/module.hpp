#pragma once
// loom::fp8::Linear: a drop-in for torch::nn::Linear (the same options, parameter names and
// initialisation) whose forward runs in fp8 once a precision has enabled it and while an
// fp8 scope is open; otherwise it is torch::nn::Linear's forward. The "fp8-mixed" precision
// (precision/fp8.hpp) enables every eligible loom::fp8::Linear of a model, swaps the
// torch::nn::Linear layers of each torch::nn::Sequential for them, and opens the scope in
// its forward context.
#include <cstdint>
#include <memory>
#include <ostream>
#include <string>

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <loom/error.hpp>
#include <loom/fp8/delayed.hpp>
#include <loom/fp8/linear.hpp>

namespace loom::fp8 {

namespace detail {
inline int& scope_depth() noexcept {
  thread_local int depth = 0;
  return depth;
}
}  // namespace detail

/// True inside an fp8 Scope on this thread: enabled fp8 layers compute in fp8.
inline bool in_scope() noexcept { return detail::scope_depth() > 0; }

/// An RAII scope in which enabled fp8 layers compute in fp8 (thread-local, nests).
class [[nodiscard]] Scope {
 public:
  Scope() noexcept { ++detail::scope_depth(); }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
  ~Scope() { --detail::scope_depth(); }
};

/// Whether a linear layer of these options can compute in fp8: both dimensions multiples of
/// 16, as _scaled_mm needs (for loom::fp8::Linear and torch::nn::Linear alike).
inline bool eligible(const torch::nn::LinearOptions& o) {
  return o.in_features() % 16 == 0 && o.out_features() % 16 == 0;
}

/// "in -> out", how messages name a linear layer's dimensions. (Appended piece by piece: GCC
/// 12 reports a false -Wrestrict for "literal" + std::string&& at -O3.)
inline std::string dims(const torch::nn::LinearOptions& o) {
  std::string d = std::to_string(o.in_features());
  d += " -> ";
  d += std::to_string(o.out_features());
  return d;
}

/// What a precision gives a layer it enables: the recipe, and for Scaling::Delayed the
/// layer's place in the precision's DelayedBlock.
struct LayerConfig {
  LinearRecipe recipe{};
  DelayedRef delayed{};
};

/// y = x W^T + b, as torch::nn::Linear (see the top of this file).
class LinearImpl : public torch::nn::Cloneable<LinearImpl> {
 public:
  LinearImpl(int64_t in_features, int64_t out_features)
      : LinearImpl(torch::nn::LinearOptions(in_features, out_features)) {}
  explicit LinearImpl(const torch::nn::LinearOptions& options_);
  /// Takes `other`'s parameters themselves (the same tensors, so an optimizer built on them
  /// keeps updating this layer) and its training flag.
  explicit LinearImpl(const torch::nn::LinearImpl& other);

  /// Registers fresh parameters initialised as torch::nn::Linear's (the same draws).
  void reset() override;
  void reset_parameters();

  void pretty_print(std::ostream& stream) const override;

  /// fp8 when enabled and inside a Scope; torch::nn::Linear's forward otherwise.
  at::Tensor forward(const at::Tensor& input);

  /// Whether both dimensions are multiples of 16, as fp8 products need.
  bool eligible() const { return fp8::eligible(options); }
  /// Makes forward compute in fp8 (inside a Scope) as `config` says; a precision's business.
  void enable(const LayerConfig& config);
  /// Back to torch::nn::Linear's forward everywhere.
  void disable() noexcept { config_.reset(); }
  /// Whether forward computes in fp8 inside a Scope.
  bool enabled() const noexcept { return config_ != nullptr; }
  /// The recipe this layer was enabled with (LinearRecipe{} when disabled).
  LinearRecipe recipe() const { return config_ ? config_->recipe : LinearRecipe{}; }

  torch::nn::LinearOptions options;
  at::Tensor weight;
  at::Tensor bias;

 private:
  // Shared, immutable: a clone computes as this layer does (with Scaling::Delayed it reads and
  // records the same block's slot, which only the precision's updates change).
  std::shared_ptr<const LayerConfig> config_;
};

/// The module holder of LinearImpl: loom::fp8::Linear(in, out), as torch::nn::Linear.
TORCH_MODULE(Linear);

}  // namespace loom::fp8
