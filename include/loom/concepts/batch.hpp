#pragma once
#include <loom/detail/batch_case.hpp>

namespace loom {

/// A type `batch::map` can walk: tensors and scalars nested in supported containers.
///
///   b: const B&  f: a callable torch::Tensor -> torch::Tensor
///
///   expression            returns   does
///   batch::map(b, f)      B         f on every defined tensor leaf; everything else kept
///
/// Rows: tensor; scalar (arithmetic, enum, string, loom::opaque<T>); torch::data::Example;
/// tuple and pair; vector, deque and array; optional; variant; map and unordered_map
/// (values); a Boost.Hana Struct. Anything else is not a Batch, and mapping it fails to
/// compile naming the type (batch_member_is_not_walkable<T>).
/// Laws: map keeps the type, container sizes, keys and order; map(b, identity) shares every
/// tensor with b; map(map(b, f), g) == map(b, g . f).
/// Models: torch::Tensor, std::tuple<Tensor, Tensor>, torch::data::Example<>, ...
/// Page: docs/concepts/batch.md
template <class B>
concept Batch = detail::is_walkable<B>();

}  // namespace loom
