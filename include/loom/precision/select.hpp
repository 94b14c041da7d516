#pragma once
// Choosing a precision policy by Lightning's names: at compile time with precision_t<"...">,
// at run time (CLIs) with with_precision(name, fn).
//
//   name            policy       notes
//   "32-true", "32", 32    Fp32
//   "64-true", "64", 64    Fp64
//   "16-true"              Fp16True
//   "bf16-true"            Bf16True
//   "16-mixed", "16", 16   Fp16Mixed    "16" and 16: discouraged (with_precision warns)
//   "bf16-mixed", "bf16"   Bf16Mixed    "bf16": discouraged (with_precision warns)
// Matching is exact and case-sensitive; anything else is an error listing the names.
#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

#include <c10/util/Exception.h>

#include <loom/error.hpp>
#include <loom/precision/fp32.hpp>
#include <loom/precision/fp64.hpp>
#include <loom/precision/half.hpp>
#include <loom/precision/mixed.hpp>

namespace loom {

namespace precision {

/// The names loom accepts, canonical ones first.
inline constexpr std::string_view allowed_names =
    "\"32-true\", \"64-true\", \"16-true\", \"bf16-true\", \"16-mixed\", \"bf16-mixed\" "
    "(aliases: 32, \"32\", 64, \"64\", 16, \"16\", \"bf16\")";

/// A string usable as a template argument: precision_t<"bf16-mixed">, or precision_t<16>.
template <std::size_t N>
struct Name {
  char text[N]{};
  constexpr Name(const char (&s)[N]) { std::copy_n(s, N, text); }
  constexpr Name(int bits) requires(N == 3) {  // 16, 32, 64 -> "16", "32", "64"
    text[0] = static_cast<char>('0' + bits / 10 % 10);
    text[1] = static_cast<char>('0' + bits % 10);
  }
  constexpr std::string_view view() const { return {text, N - 1}; }
};
Name(int) -> Name<3>;

/// The policy a name selects; an unknown name fails to compile, listing the allowed names.
template <Name S>
struct select {
  static_assert(S.view().substr(0, 18) != "transformer-engine",
                "loom::precision_t: \"transformer-engine\" precision is not supported by loom");
  static_assert(S.view().substr(0, 18) == "transformer-engine",
                "loom::precision_t<Name>: unknown precision name. Allowed: \"32-true\", "
                "\"64-true\", \"16-true\", \"bf16-true\", \"16-mixed\", \"bf16-mixed\" (aliases: "
                "32, \"32\", 64, \"64\", 16, \"16\", \"bf16\")");
};
template <> struct select<"32-true"> { using type = Fp32; };
template <> struct select<"32"> { using type = Fp32; };
template <> struct select<"64-true"> { using type = Fp64; };
template <> struct select<"64"> { using type = Fp64; };
template <> struct select<"16-true"> { using type = Fp16True; };
template <> struct select<"bf16-true"> { using type = Bf16True; };
template <> struct select<"16-mixed"> { using type = Fp16Mixed; };
template <> struct select<"bf16-mixed"> { using type = Bf16Mixed; };
// The discouraged aliases. At run time with_precision warns about them; at compile time no
// compiler reliably reports a [[deprecated]] reached through an alias template, so they are
// accepted silently here.
template <> struct select<"16"> { using type = Fp16Mixed; };
template <> struct select<"bf16"> { using type = Bf16Mixed; };

}  // namespace precision

/// The precision policy Lightning's name selects, at compile time: precision_t<"bf16-mixed">
/// is loom::Bf16Mixed; precision_t<64> is loom::Fp64.
template <precision::Name S>
using precision_t = typename precision::select<S>::type;

/// Calls `fn(policy)` with a default-constructed policy of the precision `name` selects and
/// returns its result; `fn` is generic, so every branch is compiled. Aliases warn (TORCH_WARN);
/// an unknown name throws loom::Error listing the allowed names.
template <class Fn>
decltype(auto) with_precision(std::string_view name, Fn&& fn) {
  auto alias = [&](std::string_view canonical) {
    TORCH_WARN("loom: precision \"", std::string(name), "\" is discouraged, use \"",
               std::string(canonical), "\"");
  };
  if (name == "32-true" || name == "32") return std::forward<Fn>(fn)(precision::Fp32{});
  if (name == "64-true" || name == "64") return std::forward<Fn>(fn)(precision::Fp64{});
  if (name == "16-true") return std::forward<Fn>(fn)(precision::Fp16True{});
  if (name == "bf16-true") return std::forward<Fn>(fn)(precision::Bf16True{});
  if (name == "16-mixed") return std::forward<Fn>(fn)(precision::Fp16Mixed{});
  if (name == "bf16-mixed") return std::forward<Fn>(fn)(precision::Bf16Mixed{});
  if (name == "16") {
    alias("16-mixed");
    return std::forward<Fn>(fn)(precision::Fp16Mixed{});
  }
  if (name == "bf16") {
    alias("bf16-mixed");
    return std::forward<Fn>(fn)(precision::Bf16Mixed{});
  }
  if (name.starts_with("transformer-engine")) {
    throw Error("loom: precision \"" + std::string(name) + "\" is not supported by loom");
  }
  throw Error("loom: unknown precision \"" + std::string(name) + "\"; allowed: " +
              std::string(precision::allowed_names));
}

/// with_precision for Lightning's integer forms: 16, 32 or 64.
template <class Fn>
decltype(auto) with_precision(int bits, Fn&& fn) {
  if (bits != 16 && bits != 32 && bits != 64) {
    throw Error("loom: unknown precision " + std::to_string(bits) + "; allowed: " +
                std::string(precision::allowed_names));
  }
  return with_precision(std::to_string(bits), std::forward<Fn>(fn));
}

}  // namespace loom
