#pragma once
// loom::detail::agree_on_failure: every rank of a strategy learns whether some rank failed at a
// step they all take (a write, a read), so that all of them throw the same loom::Error instead
// of one going on alone and waiting for the others at its next collective: what
// dist::ProcessGroup::agree does (the Collectives row `agree`). agree_on(s, what, fn) runs a
// rank's part of such a step and agrees on it: rank 0's write in rt.save, Zero's sharded
// saves and loads; loom::Checkpoints agrees on its background write's failure_of(error).
#include <concepts>
#include <cstdint>
#include <exception>
#include <string>
#include <utility>

#include <ATen/ATen.h>
#include <c10/core/Device.h>

#include <loom/concepts/strategy.hpp>
#include <loom/detail/message_of.hpp>
#include <loom/error.hpp>

namespace loom::detail {

/// `failure`: this rank's reason (empty: it did not fail; a failure with no message should say
/// so in words). When some rank failed, every rank throws "WHAT failed on rank R: REASON" for
/// the lowest such rank R. Costs one all-reduce of one element on `device` when none failed,
/// and a broadcast of the reason when one did. The strategy's all_reduce and broadcast_object
/// (Collectives rows) carry them; one process agrees with itself.
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

/// A failure's reason for agree: empty for none, else its message (never empty).
inline std::string failure_of(const std::exception_ptr& error) {
  if (!error) return {};
  std::string text = message_of(error);
  return text.empty() ? "an error with no message" : text;
}

/// Runs `fn`; the reason it threw a std::exception with (never empty), or empty.
template <std::invocable Fn>
std::string failure_of(Fn&& fn) {
  try {
    std::forward<Fn>(fn)();
  } catch (const std::exception& e) {
    return *e.what() ? e.what() : "an error with no message";
  }
  return {};
}

/// Runs `fn`, this rank's part of a step every rank takes, then `s.agree`s on whether some
/// rank's part threw: every rank throws the same loom::Error "WHAT failed on rank R: REASON",
/// or none does.
template <class S, class Fn>
void agree_on(S& s, const std::string& what, Fn&& fn) {
  s.agree(failure_of(std::forward<Fn>(fn)), what);
}

}  // namespace loom::detail
