#pragma once
#include <concepts>
#include <type_traits>

namespace loom {

/// What a policy's context member must return: an RAII scope, entered on construction.
///
///   expression                     holds
///   std::destructible<G>           leaving the scope cannot throw
///   !std::copy_constructible<G>    a scope cannot be duplicated
///   !std::is_copy_assignable_v<G>  nor overwritten
///
/// Guards are returned by value (guaranteed elision) and kept in a named local:
///   { [[maybe_unused]] auto guard = p.forward_context(dt); ... }
/// Models: NullGuard, DefaultDtypeGuard<Dtype>, amp::AutocastGuard.
/// Page: docs/concepts/scope_guard.md
template <class G>
concept ScopeGuard = std::is_object_v<G> && std::destructible<G> && !std::copy_constructible<G> &&
                     !std::is_copy_assignable_v<G>;

}  // namespace loom
