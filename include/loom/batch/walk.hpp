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
#include <torch/data/example.h>

#include <loom/batch/adapt.hpp>
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

/// The rows of the dispatch table above.
enum class Case { tensor = 1, scalar, example, tuple, sequence, optional, variant, map, hana, none };

namespace walk_detail {
template <class T>
inline constexpr bool is_example = false;
template <class D, class T>
inline constexpr bool is_example<torch::data::Example<D, T>> = true;
}  // namespace walk_detail

/// Which row of the dispatch table a type falls in.
template <class T>
constexpr Case case_of() {
  using U = std::remove_cvref_t<T>;
  if constexpr (std::is_same_v<U, at::Tensor>) {
    return Case::tensor;
  } else if constexpr (std::is_arithmetic_v<U> || std::is_enum_v<U> ||
                       std::is_same_v<U, std::string> || std::is_same_v<U, std::string_view> ||
                       opaque<U>::value) {
    return Case::scalar;
  } else if constexpr (walk_detail::is_example<U>) {
    return Case::example;
  } else if constexpr (detail::is_specialization_of<U, std::tuple> ||
                       detail::is_specialization_of<U, std::pair>) {
    return Case::tuple;
  } else if constexpr (detail::is_specialization_of<U, std::vector> ||
                       detail::is_specialization_of<U, std::deque> || detail::is_std_array<U>) {
    return Case::sequence;
  } else if constexpr (detail::is_specialization_of<U, std::optional>) {
    return Case::optional;
  } else if constexpr (detail::is_specialization_of<U, std::variant>) {
    return Case::variant;
  } else if constexpr (detail::is_specialization_of<U, std::map> ||
                       detail::is_specialization_of<U, std::unordered_map>) {
    return Case::map;
  } else if constexpr (boost::hana::Struct<U>::value) {
    return Case::hana;
  } else {
    return Case::none;
  }
}

/// True if every part of T falls in rows [1] to [9] of the dispatch table.
template <class T>
constexpr bool is_walkable() {
  using U = std::remove_cvref_t<T>;
  constexpr Case c = case_of<U>();
  if constexpr (c == Case::tensor || c == Case::scalar) {
    return true;
  } else if constexpr (c == Case::example) {
    if constexpr (std::is_void_v<typename U::TargetType>) {
      return is_walkable<typename U::DataType>();
    } else {
      return is_walkable<typename U::DataType>() && is_walkable<typename U::TargetType>();
    }
  } else if constexpr (c == Case::tuple) {
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return (is_walkable<std::tuple_element_t<I, U>>() && ...);
    }(std::make_index_sequence<std::tuple_size_v<U>>{});
  } else if constexpr (c == Case::sequence || c == Case::optional) {
    return is_walkable<typename U::value_type>();
  } else if constexpr (c == Case::variant) {
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return (is_walkable<std::variant_alternative_t<I, U>>() && ...);
    }(std::make_index_sequence<std::variant_size_v<U>>{});
  } else if constexpr (c == Case::map) {
    return is_walkable<typename U::mapped_type>();
  } else if constexpr (c == Case::hana) {
    return boost::hana::unpack(boost::hana::accessors<U>(), [](auto... pairs) {
      return (is_walkable<decltype(boost::hana::second(pairs)(std::declval<U&>()))>() && ...);
    });
  } else {
    return false;
  }
}

/// A copy of `b` with `f` applied to every defined tensor leaf; see the table above.
template <class B, class F>
B map(const B& b, F&& f) {
  constexpr Case c = case_of<B>();
  if constexpr (c == Case::tensor) {  // case [1]
    return b.defined() ? at::Tensor(f(b)) : b;
  } else if constexpr (c == Case::scalar) {  // case [2]
    return b;
  } else if constexpr (c == Case::example) {  // case [3]
    B out = b;
    out.data = batch::map(b.data, f);
    if constexpr (!std::is_void_v<typename B::TargetType>) out.target = batch::map(b.target, f);
    return out;
  } else if constexpr (c == Case::tuple) {  // case [4]
    return std::apply([&](const auto&... e) { return B(batch::map(e, f)...); }, b);
  } else if constexpr (c == Case::sequence) {  // case [5]
    B out = b;
    for (auto& e : out) e = batch::map(e, f);
    return out;
  } else if constexpr (c == Case::optional) {  // case [6]
    return b ? B(batch::map(*b, f)) : B{};
  } else if constexpr (c == Case::variant) {  // case [7]
    if (b.valueless_by_exception()) return b;
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      std::optional<B> out;
      (void)((b.index() == I &&
              (out.emplace(std::in_place_index<I>, batch::map(std::get<I>(b), f)), true)) ||
             ...);
      return B(std::move(*out));
    }(std::make_index_sequence<std::variant_size_v<B>>{});
  } else if constexpr (c == Case::map) {  // case [8]
    B out = b;
    for (auto& kv : out) kv.second = batch::map(kv.second, f);
    return out;
  } else if constexpr (c == Case::hana) {  // case [9]
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
