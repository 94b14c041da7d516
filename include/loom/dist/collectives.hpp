#pragma once
// Collectives over nested batches: every tensor leaf of a batch (tuples, maps, vectors,
// optionals, Hana structs: whatever batch/walk.hpp walks) reduced, gathered or broadcast over
// the ranks, on any loom::Collectives (rt.strategy()); Fabric's all_reduce(data), all_gather(data)
// and broadcast(data). One collective per leaf, in the walker's order: every rank passes a
// batch of the same structure (a std::unordered_map's order is its own: prefer std::map) and
// the same shapes. Non-tensor leaves come back unchanged.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>
#include <c10/util/StringUtil.h>

#include <loom/batch/walk.hpp>
#include <loom/concepts/strategy.hpp>
#include <loom/error.hpp>

namespace loom::dist {

namespace detail {

/// Every rank's `t` has rank 0's shape; else the same loom::Error on every rank, naming the
/// first rank that differs (c10d's all-gather would fail or hang on shapes that differ).
template <Collectives S>
void require_same_shape(S& s, const at::Tensor& t, std::string_view what) {
  std::uint64_t hash = 1469598103934665603ull;  // FNV-1a over the sizes
  for (auto d : t.sizes()) hash = (hash ^ static_cast<std::uint64_t>(d)) * 1099511628211ull;
  at::Tensor mine = at::empty({2}, at::TensorOptions().dtype(at::kLong));
  mine.data_ptr<std::int64_t>()[0] = t.dim();
  mine.data_ptr<std::int64_t>()[1] = static_cast<std::int64_t>(hash >> 1);
  const auto all = s.all_gather(mine.to(t.device()));
  const at::Tensor first = all[0].cpu();
  for (std::size_t r = 1; r < all.size(); ++r) {
    if (!all[r].cpu().equal(first)) {
      throw Error("loom::dist::" + std::string(what) + ": rank " + std::to_string(r) +
                  "'s tensor does not have rank 0's shape (this rank's, " +
                  std::to_string(s.rank()) + ", is " + c10::str(t.sizes()) +
                  "); every rank passes tensors of one shape (pad them to one size first)");
    }
  }
}

/// A copy of `batch` whose every tensor leaf is a contiguous copy that `collective` then
/// changes in place (all_reduce, broadcast).
template <class B, class Collective>
B on_copies(const B& batch, Collective&& collective) {
  return batch::map(batch, [&](const at::Tensor& t) {
    at::Tensor c = t.clone(at::MemoryFormat::Contiguous);
    collective(c);
    return c;
  });
}

}  // namespace detail

/// A copy of `batch` whose every tensor leaf is reduced over the ranks with `op` (a contiguous
/// copy of the leaf, reduced in place: Sum, Mean (floating tensors), Max, Min).
///
///   auto m = loom::dist::all_reduce(rt.strategy(), std::map<std::string, torch::Tensor>{
///                {"loss", loss_sum}, {"correct", correct}}, loom::dist::ReduceOp::Sum);
template <Collectives S, class B>
B all_reduce(S& s, const B& batch, ReduceOp op) {
  return detail::on_copies(batch, [&](at::Tensor& c) { s.all_reduce(c, op); });
}

/// A copy of `batch` whose every tensor leaf of shape (d...) becomes the ranks' leaves stacked,
/// shape (world_size, d...), rank r's at index r (one process too: (1, d...)). Leaves whose
/// shapes differ between ranks are a loom::Error on every rank.
template <Collectives S, class B>
B all_gather(S& s, const B& batch) {
  return batch::map(batch, [&](const at::Tensor& t) {
    detail::require_same_shape(s, t, "all_gather");
    return at::stack(s.all_gather(t));
  });
}

/// A copy of `batch` with rank `src`'s tensor leaves on every rank (each rank's leaf gives the
/// shape and dtype to receive into).
template <Collectives S, class B>
B broadcast(S& s, const B& batch, int src) {
  return detail::on_copies(batch, [&](at::Tensor& c) { s.broadcast(c, src); });
}

}  // namespace loom::dist
