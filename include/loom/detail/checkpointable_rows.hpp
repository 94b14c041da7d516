#pragma once
// The rows of loom::Checkpointable (concepts/checkpointable.hpp), shared by every policy family.
#include <concepts>

#include <loom/detail/rows.hpp>
#include <loom/state_dict.hpp>

namespace loom::detail {

template <class T>
concept has_state_dict = requires(const T& t) {
  { t.state_dict() } -> std::same_as<StateDict>;
};
template <class T>
concept has_load_state_dict = requires(T& t, const StateDict& sd) {
  { t.load_state_dict(sd) } -> std::same_as<void>;
};
template <class T>
concept has_teardown = requires(T& t) {
  { t.teardown() } -> std::same_as<void>;
};

// clang-format off
#define LOOM_DETAIL_CHECKPOINTABLE_ROWS(X, ...)                                        \
  X(__VA_ARGS__, has_state_dict, "`loom::StateDict state_dict() const`")               \
  X(__VA_ARGS__, has_load_state_dict, "`void load_state_dict(const loom::StateDict&)`") \
  X(__VA_ARGS__, has_teardown, "`void teardown()`")
// clang-format on

}  // namespace loom::detail
