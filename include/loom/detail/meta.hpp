#pragma once
#include <array>
#include <cstddef>
#include <string_view>
#include <type_traits>

namespace loom::detail {

/// Forces its argument to be a constant expression when used in a requires-expression.
template <auto V>
struct constant {
  static constexpr auto value = V;
};

/// False for every T; makes a static_assert depend on a template parameter.
template <class...>
inline constexpr bool always_false = false;

/// True if T is Template<Args...>.
template <class T, template <class...> class Template>
inline constexpr bool is_specialization_of = false;
template <template <class...> class Template, class... Args>
inline constexpr bool is_specialization_of<Template<Args...>, Template> = true;

/// True for std::array<T, N>.
template <class T>
inline constexpr bool is_std_array = false;
template <class T, std::size_t N>
inline constexpr bool is_std_array<std::array<T, N>> = true;

/// True for loom's Defaults bases themselves (each names itself defaults_type), false for the
/// policies that derive from them and for any class in between (is_default.hpp).
template <class C>
constexpr bool is_defaults_base() {
  if constexpr (requires { typename C::defaults_type; }) {
    return std::is_same_v<typename C::defaults_type, C>;
  } else {
    return false;
  }
}

/// The distributed backends torch.distributed knows.
constexpr bool is_ddp_backend(std::string_view b) {
  return b == "gloo" || b == "nccl" || b == "mpi";
}

}  // namespace loom::detail
