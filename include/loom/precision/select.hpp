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
//   "fp8-mixed"            Fp8Mixed     "transformer-engine" is refused, naming it
// Matching is exact and case-sensitive; anything else is an error listing the names. The list
// itself, names and policies, is detail/precision_select.hpp's precision_name_list.
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <c10/util/Exception.h>

#include <loom/detail/precision_names.hpp>
#include <loom/detail/precision_select.hpp>
#include <loom/error.hpp>
#include <loom/precision/fp32.hpp>
#include <loom/precision/fp64.hpp>
#include <loom/precision/fp8.hpp>
#include <loom/precision/half.hpp>
#include <loom/precision/mixed.hpp>

namespace loom {

namespace precision {

/// The names loom accepts, canonical ones first.
inline constexpr std::string_view allowed_names = LOOM_DETAIL_PRECISION_NAMES;

}  // namespace precision

/// The precision policy Lightning's name selects, at compile time: precision_t<"bf16-mixed">
/// is loom::Bf16Mixed; precision_t<64> is loom::Fp64.
template <detail::PrecisionName S>
using precision_t = typename detail::select_precision<S>::type;

/// What with_precision builds a policy from, for the precisions that take options: the
/// GradScaler's for 16-mixed, the fp8 recipe for fp8-mixed. The others ignore it (their
/// policies have nothing to configure).
struct PrecisionOptions {
  amp::GradScalerOptions grad_scaler{};
  fp8::LinearRecipe fp8{};
};

/// A list of precision policies, to limit what with_precision and with_runtime compile:
/// loom::precisions<loom::Fp32, loom::Bf16Mixed>. Each is one of the policies above.
template <class... Policies>
struct precisions {};

namespace detail {

/// The names with_precision<Allowed> accepts, as its errors print them.
template <class Allowed>
std::string allowed_precision_names() {
  if constexpr (std::is_same_v<Allowed, all_precisions>) {
    return LOOM_DETAIL_PRECISION_NAMES;
  } else {
    return std::string(names_text<Allowed>(precision_name_list{}).view());
  }
}

/// fn's result for the first policy of `Allowed`, checked to be the same for every other.
template <class Fn, class Allowed>
struct precision_result_of;
template <class Fn, class P, class... Ps>
struct precision_result_of<Fn, precisions<P, Ps...>> {
  using type = std::invoke_result_t<Fn, P>;
  static_assert((std::is_same_v<type, std::invoke_result_t<Fn, Ps>> && ...),
                "loom::with_precision(name, fn): fn must return the same type for every "
                "precision");
};
template <class Fn, class Allowed>
using precision_result = typename precision_result_of<Fn, Allowed>::type;

/// The policy `P`, built from the options that configure it.
template <class P>
P make_precision(const PrecisionOptions& options) {
  if constexpr (std::is_same_v<P, precision::Fp16Mixed>) {
    return P(options.grad_scaler);
  } else if constexpr (std::is_same_v<P, precision::Fp8Mixed>) {
    return P(options.fp8);
  } else {
    return P{};
  }
}

/// with_precision's walk down precision_name_list: the first row named `name` whose policy
/// `Allowed` holds calls fn; a row named `name` outside it, or no row, throws.
template <class R, class Allowed, class Fn>
R dispatch_precision(precision_name_table<>, std::string_view name, Fn&&, const PrecisionOptions&) {
  if (name.starts_with("transformer-engine")) {
    throw Error("loom: precision \"" + std::string(name) +
                "\" is not supported by loom; its native alternative is \"fp8-mixed\" "
                "(fp8 linear layers on at::_scaled_mm, docs/fp8.md)");
  }
  throw Error("loom: unknown precision \"" + std::string(name) +
              "\"; allowed: " + allowed_precision_names<Allowed>());
}
template <class R, class Allowed, class Fn, class Row, class... Rows>
R dispatch_precision(precision_name_table<Row, Rows...>, std::string_view name, Fn&& fn,
                     const PrecisionOptions& options) {
  using P = typename Row::policy;
  if (name == Row::name()) {
    if constexpr (allows_precision<Allowed, P>) {
      if constexpr (Row::use == NameUse::Discouraged) {
        TORCH_WARN("loom: precision \"", std::string(name), "\" is discouraged, use \"",
                   std::string(P::precision()), "\"");
      }
      return std::forward<Fn>(fn)(make_precision<P>(options));
    } else {
      throw Error("loom: precision \"" + std::string(name) +
                  "\" is not among the precisions compiled in (loom::precisions<...>); "
                  "allowed: " +
                  allowed_precision_names<Allowed>());
    }
  }
  return dispatch_precision<R, Allowed>(precision_name_table<Rows...>{}, name, std::forward<Fn>(fn),
                                        options);
}

}  // namespace detail

/// Calls `fn(policy)` with the policy of the precision `name` selects, built from `options`
/// (Fp16Mixed(options.grad_scaler), Fp8Mixed(options.fp8); the others default-constructed),
/// and returns fn's result; `fn` is generic, so every branch is compiled, and must return the
/// same type for each. Aliases warn (TORCH_WARN); an unknown name throws loom::Error listing
/// the allowed names.
///
/// `Allowed`, a loom::precisions<...>, limits the policies compiled (all by default): a name
/// of a policy outside it throws loom::Error listing the names of those in it.
///
///   loom::with_precision<loom::precisions<loom::Fp32, loom::Bf16Mixed>>(flag, fn);
template <class Allowed = detail::all_precisions, class Fn>
decltype(auto) with_precision(std::string_view name, Fn&& fn,
                              const PrecisionOptions& options = {}) {
  static_assert(detail::is_precision_list<Allowed>, LOOM_DETAIL_PRECISION_LIST_MESSAGE);
  if constexpr (detail::is_precision_list<Allowed>) {
    using R = detail::precision_result<Fn, Allowed>;
    return detail::dispatch_precision<R, Allowed>(detail::precision_name_list{}, name,
                                                  std::forward<Fn>(fn), options);
  }
}

/// with_precision for Lightning's integer forms: 16, 32 or 64.
template <class Allowed = detail::all_precisions, class Fn>
decltype(auto) with_precision(int bits, Fn&& fn, const PrecisionOptions& options = {}) {
  if (bits != 16 && bits != 32 && bits != 64) {
    throw Error("loom: unknown precision " + std::to_string(bits) +
                "; allowed: " + detail::allowed_precision_names<Allowed>());
  }
  return with_precision<Allowed>(std::to_string(bits), std::forward<Fn>(fn), options);
}

}  // namespace loom
