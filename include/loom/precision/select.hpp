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
// Matching is exact and case-sensitive; anything else is an error listing the names.
#include <string>
#include <string_view>
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

/// Calls `fn(policy)` with the policy of the precision `name` selects, built from `options`
/// (Fp16Mixed(options.grad_scaler), Fp8Mixed(options.fp8); the others default-constructed),
/// and returns fn's result; `fn` is generic, so every branch is compiled. Aliases warn
/// (TORCH_WARN); an unknown name throws loom::Error listing the allowed names.
template <class Fn>
decltype(auto) with_precision(std::string_view name, Fn&& fn,
                              const PrecisionOptions& options = {}) {
  auto alias = [&](std::string_view canonical) {
    TORCH_WARN("loom: precision \"", std::string(name), "\" is discouraged, use \"",
               std::string(canonical), "\"");
  };
  auto fp16_mixed = [&] { return precision::Fp16Mixed(options.grad_scaler); };
  if (name == "32-true" || name == "32") return std::forward<Fn>(fn)(precision::Fp32{});
  if (name == "64-true" || name == "64") return std::forward<Fn>(fn)(precision::Fp64{});
  if (name == "16-true") return std::forward<Fn>(fn)(precision::Fp16True{});
  if (name == "bf16-true") return std::forward<Fn>(fn)(precision::Bf16True{});
  if (name == "16-mixed") return std::forward<Fn>(fn)(fp16_mixed());
  if (name == "bf16-mixed") return std::forward<Fn>(fn)(precision::Bf16Mixed{});
  if (name == "fp8-mixed") return std::forward<Fn>(fn)(precision::Fp8Mixed(options.fp8));
  if (name == "16") {
    alias("16-mixed");
    return std::forward<Fn>(fn)(fp16_mixed());
  }
  if (name == "bf16") {
    alias("bf16-mixed");
    return std::forward<Fn>(fn)(precision::Bf16Mixed{});
  }
  if (name.starts_with("transformer-engine")) {
    throw Error("loom: precision \"" + std::string(name) +
                "\" is not supported by loom; its native alternative is \"fp8-mixed\" "
                "(fp8 linear layers on at::_scaled_mm, docs/fp8.md)");
  }
  throw Error("loom: unknown precision \"" + std::string(name) +
              "\"; allowed: " LOOM_DETAIL_PRECISION_NAMES);
}

/// with_precision for Lightning's integer forms: 16, 32 or 64.
template <class Fn>
decltype(auto) with_precision(int bits, Fn&& fn, const PrecisionOptions& options = {}) {
  if (bits != 16 && bits != 32 && bits != 64) {
    throw Error("loom: unknown precision " + std::to_string(bits) +
                "; allowed: " LOOM_DETAIL_PRECISION_NAMES);
  }
  return with_precision(std::to_string(bits), std::forward<Fn>(fn), options);
}

}  // namespace loom
