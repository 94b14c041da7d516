#pragma once
// Delayed scaling (TransformerEngine's recipe): each fp8 operand is cast with a scale computed
// from the amaxes of earlier steps, and its own amax is recorded for the steps to come.
//
// The state of n layers is one block: amax_history (history_len, n, 3) and scale (n, 3), fp32,
// column 0 the input, 1 the weight, 2 the output gradient. Row 0 of the history collects the
// current step's amaxes (the largest over micro-batches); update() then applies
// TransformerEngine's rule to every layer at once:
//
//   amax  = max over the history (Amax::Max) or its row 0 (Amax::MostRecent)
//   scale = fp8_max / amax / 2^margin where amax is finite and > 0, else the scale unchanged
//   history rolled by one row (row 0 becomes the oldest), row 0 zeroed
//
// Scales start at 1. Under data parallelism the row 0 of every rank is all-reduced (MAX)
// before update(), so every rank keeps the same scales.
#include <cstdint>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <loom/error.hpp>
#include <loom/fp8/scaled_mm.hpp>

namespace loom::fp8 {

/// The options of Scaling::Delayed (TransformerEngine's DelayedScaling defaults).
struct DelayedOptions {
  enum class Amax { Max, MostRecent };
  int64_t history_len = 1024;  ///< steps of amaxes kept
  int margin = 0;              ///< scales are divided by 2^margin
  Amax amax = Amax::Max;       ///< how the history becomes one amax
};

/// The operands a layer's delayed-scaling state has a column for.
enum class Operand : int64_t { Input = 0, Weight = 1, GradOutput = 2 };

/// The delayed-scaling state of a set of layers (see above): plain tensors.
struct DelayedBlock {
  at::Tensor amax_history;  ///< (history_len, layers, 3) fp32
  at::Tensor scale;         ///< (layers, 3) fp32

  /// Zero histories and unit scales for `layers` layers on `device`.
  static DelayedBlock make(int64_t layers, const DelayedOptions& options, c10::Device device);

  int64_t layers() const { return scale.defined() ? scale.size(0) : 0; }

  /// Where `layer`'s `operand` takes its scale from and records its amax.
  ScaleSlot slot(int64_t layer, Operand operand) const {
    const auto c = static_cast<int64_t>(operand);
    return {scale.select(0, layer).select(0, c),
            amax_history.select(0, 0).select(0, layer).select(0, c)};
  }

  /// The current step's amaxes, (layers, 3), a contiguous view: what data parallelism reduces.
  at::Tensor current() const { return amax_history.select(0, 0); }

  /// TransformerEngine's update (see above), on the device, no host sync. `grad_dtype` is the
  /// output gradient's format (its column's fp8 maximum).
  void update(const DelayedOptions& options, c10::ScalarType grad_dtype);
};

}  // namespace loom::fp8
