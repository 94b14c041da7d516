#pragma once
// loom::batch::map(b, f): a copy of batch b with f applied to every defined tensor leaf.
//
// Dispatch table (first match wins; `case [n]` marks each branch of map() below):
//   [1] torch::Tensor                       f(t) if defined, else t unchanged
//   [2] scalars: arithmetic, enum, std::string, std::string_view, loom::opaque<T>
//                                           passed through unchanged
//   [3] torch::data::Example<D, T>          data (and target, if any) mapped
//   [4] std::tuple, std::pair               each element mapped, same type
//   [5] std::vector, std::deque, std::array each element mapped, same type and order
//   [6] std::optional                       the value mapped if present
//   [7] std::variant                        the active alternative mapped, index kept
//   [8] std::map, std::unordered_map        values mapped; keys and iteration order kept
//   [9] a Boost.Hana Struct                 every member mapped (batch/adapt.hpp)
//  [10] anything else                       compile error: batch_member_is_not_walkable<T>
//
// Value semantics: the result is a new object of the same type; leaves that f returns
// unchanged are the same tensors (no copy). Page: docs/concepts/batch.md
#include <array>
#include <cstddef>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include <ATen/core/Tensor.h>
#include <boost/hana/accessors.hpp>
#include <boost/hana/concept/struct.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/unpack.hpp>

#include <loom/batch/adapt.hpp>
#include <loom/detail/batch_case.hpp>
#include <loom/detail/meta.hpp>

namespace loom::batch {

/// Fails to compile, naming T: T is neither a tensor, a scalar, a supported container nor an
/// adapted struct. Adapt it with BOOST_HANA_ADAPT_STRUCT, or mark it loom::opaque<T>.
template <class T>
struct batch_member_is_not_walkable {
  static_assert(detail::always_false<T>,
                "loom::batch: the batch holds a type loom cannot walk, named in "
                "batch_member_is_not_walkable<T>. Adapt it with BOOST_HANA_ADAPT_STRUCT or mark "
                "it loom::opaque<T> (docs/concepts/batch.md)");
};

/// A copy of `b` with `f` applied to every defined tensor leaf; see the table above.
template <class B, class F>
B map(const B& b, F&& f) {
  constexpr detail::Case c = detail::case_of<B>();
  if constexpr (c == detail::Case::Tensor) {  // case [1]
    return b.defined() ? at::Tensor(f(b)) : b;
  } else if constexpr (c == detail::Case::Scalar) {  // case [2]
    return b;
  } else if constexpr (c == detail::Case::Example) {  // case [3]
    B out = b;
    out.data = batch::map(b.data, f);
    if constexpr (!std::is_void_v<typename B::TargetType>) out.target = batch::map(b.target, f);
    return out;
  } else if constexpr (c == detail::Case::Tuple) {  // case [4]
    return std::apply([&](const auto&... e) { return B(batch::map(e, f)...); }, b);
  } else if constexpr (c == detail::Case::Sequence) {  // case [5]
    B out = b;
    for (auto& e : out) e = batch::map(e, f);
    return out;
  } else if constexpr (c == detail::Case::Optional) {  // case [6]
    return b ? B(batch::map(*b, f)) : B{};
  } else if constexpr (c == detail::Case::Variant) {  // case [7]
    if (b.valueless_by_exception()) return b;
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      std::optional<B> out;
      (void)((b.index() == I &&
              (out.emplace(std::in_place_index<I>, batch::map(std::get<I>(b), f)), true)) ||
             ...);
      return B(std::move(*out));
    }
    (std::make_index_sequence<std::variant_size_v<B>>{});
  } else if constexpr (c == detail::Case::Map) {  // case [8]
    B out = b;
    for (auto& kv : out) kv.second = batch::map(kv.second, f);
    return out;
  } else if constexpr (c == detail::Case::Hana) {  // case [9]
    B out = b;
    boost::hana::for_each(boost::hana::accessors<B>(), [&](auto pair) {
      auto& member = boost::hana::second(pair)(out);
      member = batch::map(member, f);
    });
    return out;
  } else {  // case [10]
    (void)batch_member_is_not_walkable<B>{};
    return b;
  }
}

}  // namespace loom::batch
