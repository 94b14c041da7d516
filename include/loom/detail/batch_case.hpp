#pragma once
// Which row of batch/walk.hpp's dispatch table a type falls in, and whether a whole type can
// be walked: what the Batch concept (concepts/batch.hpp) and batch::map both ask.
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
#include <boost/hana/unpack.hpp>

#include <loom/batch/adapt.hpp>
#include <loom/detail/meta.hpp>

// torch::data::Example, declared rather than included: <torch/data/example.h> brings
// torch/types.h and with it ATen/ATen.h; code that holds an Example has included it.
namespace torch::data {
template <typename Data, typename Target>
struct Example;
}  // namespace torch::data

namespace loom::detail {

/// The rows of batch/walk.hpp's dispatch table.
enum class Case {
  Tensor = 1,
  Scalar,
  Example,
  Tuple,
  Sequence,
  Optional,
  Variant,
  Map,
  Hana,
  None
};

template <class T>
inline constexpr bool is_example = false;
template <class D, class T>
inline constexpr bool is_example<torch::data::Example<D, T>> = true;

/// Which row of the dispatch table a type falls in.
template <class T>
constexpr Case case_of() {
  using U = std::remove_cvref_t<T>;
  if constexpr (std::is_same_v<U, at::Tensor>) {
    return Case::Tensor;
  } else if constexpr (std::is_arithmetic_v<U> || std::is_enum_v<U> ||
                       std::is_same_v<U, std::string> || std::is_same_v<U, std::string_view> ||
                       opaque<U>::value) {
    return Case::Scalar;
  } else if constexpr (is_example<U>) {
    return Case::Example;
  } else if constexpr (is_specialization_of<U, std::tuple> || is_specialization_of<U, std::pair>) {
    return Case::Tuple;
  } else if constexpr (is_specialization_of<U, std::vector> ||
                       is_specialization_of<U, std::deque> || is_std_array<U>) {
    return Case::Sequence;
  } else if constexpr (is_specialization_of<U, std::optional>) {
    return Case::Optional;
  } else if constexpr (is_specialization_of<U, std::variant>) {
    return Case::Variant;
  } else if constexpr (is_specialization_of<U, std::map> ||
                       is_specialization_of<U, std::unordered_map>) {
    return Case::Map;
  } else if constexpr (boost::hana::Struct<U>::value) {
    return Case::Hana;
  } else {
    return Case::None;
  }
}

/// True if every part of T falls in rows [1] to [9] of the dispatch table.
template <class T>
constexpr bool is_walkable() {
  using U = std::remove_cvref_t<T>;
  constexpr Case c = case_of<U>();
  if constexpr (c == Case::Tensor || c == Case::Scalar) {
    return true;
  } else if constexpr (c == Case::Example) {
    if constexpr (std::is_void_v<typename U::TargetType>) {
      return is_walkable<typename U::DataType>();
    } else {
      return is_walkable<typename U::DataType>() && is_walkable<typename U::TargetType>();
    }
  } else if constexpr (c == Case::Tuple) {
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return (is_walkable<std::tuple_element_t<I, U>>() && ...);
    }
    (std::make_index_sequence<std::tuple_size_v<U>>{});
  } else if constexpr (c == Case::Sequence || c == Case::Optional) {
    return is_walkable<typename U::value_type>();
  } else if constexpr (c == Case::Variant) {
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return (is_walkable<std::variant_alternative_t<I, U>>() && ...);
    }
    (std::make_index_sequence<std::variant_size_v<U>>{});
  } else if constexpr (c == Case::Map) {
    return is_walkable<typename U::mapped_type>();
  } else if constexpr (c == Case::Hana) {
    return boost::hana::unpack(boost::hana::accessors<U>(), [](auto... pairs) {
      return (is_walkable<decltype(boost::hana::second(pairs)(std::declval<U&>()))>() && ...);
    });
  } else {
    return false;
  }
}

}  // namespace loom::detail
