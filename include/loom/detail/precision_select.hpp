#pragma once
// The type precision_t<"..."> names: one specialisation per accepted name (precision/select.hpp).
#include <string_view>

#include <loom/detail/precision_names.hpp>
#include <loom/precision/fp32.hpp>
#include <loom/precision/fp64.hpp>
#include <loom/precision/fp8.hpp>
#include <loom/precision/half.hpp>
#include <loom/precision/mixed.hpp>

namespace loom::detail {

/// The policy a name selects; an unknown name fails to compile, listing the allowed names.
template <PrecisionName S>
struct select_precision {
  static_assert(S.view().substr(0, 18) != "transformer-engine",
                "loom::precision_t: \"transformer-engine\" precision is not supported by loom; "
                "its native alternative is \"fp8-mixed\"");
  static_assert(
      S.view().substr(0, 18) == "transformer-engine",
      "loom::precision_t<Name>: unknown precision name. Allowed: " LOOM_DETAIL_PRECISION_NAMES);
};
template <>
struct select_precision<"32-true"> {
  using type = precision::Fp32;
};
template <>
struct select_precision<"32"> {
  using type = precision::Fp32;
};
template <>
struct select_precision<"64-true"> {
  using type = precision::Fp64;
};
template <>
struct select_precision<"64"> {
  using type = precision::Fp64;
};
template <>
struct select_precision<"16-true"> {
  using type = precision::Fp16True;
};
template <>
struct select_precision<"bf16-true"> {
  using type = precision::Bf16True;
};
template <>
struct select_precision<"16-mixed"> {
  using type = precision::Fp16Mixed;
};
template <>
struct select_precision<"bf16-mixed"> {
  using type = precision::Bf16Mixed;
};
template <>
struct select_precision<"fp8-mixed"> {
  using type = precision::Fp8Mixed;
};
// The discouraged aliases. At run time with_precision warns about them; at compile time no
// compiler reliably reports a [[deprecated]] reached through an alias template, so they are
// accepted silently here.
template <>
struct select_precision<"16"> {
  using type = precision::Fp16Mixed;
};
template <>
struct select_precision<"bf16"> {
  using type = precision::Bf16Mixed;
};

}  // namespace loom::detail
