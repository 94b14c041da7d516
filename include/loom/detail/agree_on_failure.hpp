#pragma once
// loom::detail::agree_on_failure: every rank of a strategy learns whether some rank failed at a
// step they all take (a write, a read), so that all of them throw the same loom::Error instead
// of one going on alone and waiting for the others at its next collective. Ddp's saves, Zero's
// sharded saves and loads, and loom::Checkpoints' background writes call it.
#include <cstdint>
#include <string>

#include <ATen/ATen.h>
#include <c10/core/Device.h>

#include <loom/concepts/strategy.hpp>
#include <loom/error.hpp>

namespace loom::detail {

/// `failure`: this rank's reason (empty: it did not fail; a failure with no message should say
/// so in words). When some rank failed, every rank throws "WHAT failed on rank R: REASON" for
/// the lowest such rank R. Costs one all-reduce of one element on `device` when none failed,
/// and a broadcast of the reason when one did. The strategy's all_reduce and broadcast_object
/// (its StrategyPolicy rows) carry them; one process agrees with itself.
template <class Strategy>
void agree_on_failure(Strategy& s, c10::Device device, const std::string& failure,
                      const std::string& what) {
  at::Tensor first = at::full({1}, failure.empty() ? s.world_size() : s.rank(),
                              at::TensorOptions().dtype(at::kLong).device(device));
  s.all_reduce(first, dist::ReduceOp::Min);
  const auto failed = first.cpu().template item<std::int64_t>();
  if (failed == s.world_size()) return;
  const std::string reason = s.broadcast_object(failure, static_cast<int>(failed));
  throw Error(what + " failed on rank " + std::to_string(failed) + ": " + reason);
}

}  // namespace loom::detail
