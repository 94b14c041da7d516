#pragma once
// loom::is_default(&P::member): whether a policy's member is inherited from a loom Defaults
// base, to catch a misspelt override at compile time (Hana's is_default, for member functions).
//
//   struct PureBf16 : loom::precision::Defaults<PureBf16> {
//     at::Tensor convert_inputs(const at::Tensor& t) const;   // misspelt: the default stays
//   };
//   static_assert(!loom::is_default(&PureBf16::convert_input));  // fails, as it should
#include <loom/detail/meta.hpp>

namespace loom {

/// True when `member` (written `&P::name`) is declared in a loom Defaults base, so P inherits
/// it unchanged; false when P, or a class between P and the base, declares its own. For
/// members that are neither overloaded nor templates (a static member gives a plain function
/// pointer, which names no class: it does not compile here).
template <class M, class C>
constexpr bool is_default(M C::*member) {
  (void)member;
  return detail::is_defaults_base<C>();
}

}  // namespace loom
