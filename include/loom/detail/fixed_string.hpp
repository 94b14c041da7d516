#pragma once
// loom::detail::fixed_string: a string literal held by value, so that it can be a template
// argument (loom::Event<"on_after_backward">, rt.call<"on_validation_end">(loss)). Users never
// name it: a literal converts to it where a template parameter of this type is declared.
#include <cstddef>
#include <string_view>

namespace loom::detail {

/// A string literal of N characters (its terminating zero included) as a structural value.
template <std::size_t N>
struct fixed_string {
  char chars[N] = {};

  constexpr fixed_string(const char (&text)[N]) {  // NOLINT: implicit, from "a literal"
    for (std::size_t i = 0; i < N; ++i) chars[i] = text[i];
  }

  /// The text, without the terminating zero.
  constexpr std::string_view view() const { return std::string_view(chars, N - 1); }
};

}  // namespace loom::detail
