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

/// The distributed backends torch.distributed knows.
constexpr bool is_ddp_backend(std::string_view b) {
  return b == "gloo" || b == "nccl" || b == "mpi";
}

}  // namespace loom::detail
