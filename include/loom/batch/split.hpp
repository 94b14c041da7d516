#pragma once
// loom::split_microbatches(batch, n): a nested batch cut into n micro-batches along dimension 0,
// for gradient accumulation (Runtime::no_backward_sync). The batch walker (batch/walk.hpp)
// decides what a batch may hold: every defined tensor leaf is narrowed, everything else is
// copied into each micro-batch unchanged.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include <loom/batch/walk.hpp>
#include <loom/error.hpp>

namespace loom {

/// `batch` cut into `n` micro-batches along dimension 0, in order, as torch.tensor_split cuts:
/// with B samples the first B % n micro-batches hold B / n + 1 samples, the others B / n.
/// Each micro-batch has the batch's type; its tensors are views of the batch's (narrow, no
/// copy). Every defined tensor leaf must have at least one dimension and the same size B along
/// dimension 0, and 1 <= n <= B: otherwise a loom::Error says which.
template <class B>
std::vector<B> split_microbatches(const B& batch, std::int64_t n) {
  std::optional<std::int64_t> samples;
  batch::map(batch, [&](const at::Tensor& t) {
    if (t.dim() == 0) {
      throw Error(
          "loom::split_microbatches: the batch holds a tensor with no dimension 0 to "
          "split (a 0-dim tensor); give it a batch dimension, or keep it outside the "
          "batch");
    }
    if (samples && *samples != t.size(0)) {
      throw Error(
          "loom::split_microbatches: the batch's tensors differ in size along dimension "
          "0 (" +
          std::to_string(*samples) + " and " + std::to_string(t.size(0)) +
          "): every tensor must hold the same samples");
    }
    samples = t.size(0);
    return t;
  });
  if (!samples) throw Error("loom::split_microbatches: the batch holds no tensor to split");
  if (n < 1 || n > *samples) {
    throw Error("loom::split_microbatches: n is " + std::to_string(n) + " but the batch holds " +
                std::to_string(*samples) + " samples; n must be from 1 to " +
                std::to_string(*samples));
  }
  const std::int64_t base = *samples / n, extra = *samples % n;
  std::vector<B> micro;
  micro.reserve(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t begin = i * base + std::min(i, extra);
    const std::int64_t length = base + (i < extra ? 1 : 0);
    micro.push_back(
        batch::map(batch, [&](const at::Tensor& t) { return t.narrow(0, begin, length); }));
  }
  return micro;
}

}  // namespace loom
