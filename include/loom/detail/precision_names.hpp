#pragma once
// Lightning's precision names as the errors print them: the text that precision_t's error,
// with_precision's error and precision::allowed_names show, and the name type precision_t<"...">
// takes. The names themselves are listed once, with their policies, in precision_select.hpp's
// precision_name_list; a static_assert there keeps this text equal to the one that list gives
// (a static_assert's message must be a string literal, so the text is written out here).
#include <algorithm>
#include <cstddef>
#include <string_view>

/// The names loom accepts, canonical ones first, as one string literal.
#define LOOM_DETAIL_PRECISION_NAMES                                                      \
  "\"32-true\", \"64-true\", \"16-true\", \"bf16-true\", \"16-mixed\", \"bf16-mixed\", " \
  "\"fp8-mixed\" "                                                                       \
  "(aliases: 32, \"32\", 64, \"64\", 16, \"16\", \"bf16\")"

namespace loom::detail {

/// A string usable as a template argument: precision_t<"bf16-mixed">, or precision_t<16>.
template <std::size_t N>
struct PrecisionName {
  char text[N]{};
  constexpr PrecisionName(const char (&s)[N]) { std::copy_n(s, N, text); }
  constexpr PrecisionName(int bits) requires(N == 3) {  // 16, 32, 64 -> "16", "32", "64"
    text[0] = static_cast<char>('0' + bits / 10 % 10);
    text[1] = static_cast<char>('0' + bits % 10);
  }
  constexpr std::string_view view() const { return {text, N - 1}; }
};
PrecisionName(int)->PrecisionName<3>;

}  // namespace loom::detail
