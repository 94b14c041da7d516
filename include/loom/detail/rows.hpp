#pragma once
// The machinery behind every policy concept. A concept is the conjunction of a list of row
// concepts, and Runtime's diagnostics are one static_assert per row of the same list, so each
// requirement is written once: its row concept, its list entry, its docs line.
//
// A list is a macro LOOM_DETAIL_<FAMILY>_ROWS(X, ...) that expands to X(..., row, "text") once
// per row, where `row` is a concept in loom::detail and "text" names what a policy lacks
// without it. The two callbacks below turn a list into a conjunction or into diagnostics:
//
//   concept PrecisionPolicy = true LOOM_DETAIL_PRECISION_ROWS(LOOM_DETAIL_ROW_AND, P);
//   LOOM_DETAIL_PRECISION_ROWS(LOOM_DETAIL_ROW_ASSERT, P, "...: it lacks ", " (page)")
#include <concepts>

/// One conjunct of a concept: `&& loom::detail::row<T>`.
#define LOOM_DETAIL_ROW_AND(T, row, text) &&::loom::detail::row<T>

/// One diagnostic: a static_assert that T satisfies `row`, saying prefix, text and suffix.
#define LOOM_DETAIL_ROW_ASSERT(T, prefix, suffix, row, text) \
  static_assert(::loom::detail::row<T>, prefix text suffix);

/// `name<T>`: one static_assert per row of ROWS and of Checkpointable's rows, each saying
/// `lacks`, the row's text and `page`; `name<skip_checks>` asserts nothing.
#define LOOM_DETAIL_ROWS_CHECK(name, ROWS, lacks, page)                     \
  template <class T>                                                        \
  struct name {                                                             \
    ROWS(LOOM_DETAIL_ROW_ASSERT, T, lacks, page)                            \
    LOOM_DETAIL_CHECKPOINTABLE_ROWS(LOOM_DETAIL_ROW_ASSERT, T, lacks, page) \
    static constexpr bool value = true;                                     \
  };                                                                        \
  template <>                                                               \
  struct name<::loom::detail::skip_checks> {                                \
    static constexpr bool value = true;                                     \
  };

namespace loom::detail {

/// Stands in for a policy argument whose row checks must not run: after an out-of-order or
/// known-mistake error has said what is wrong, a cascade of "it lacks" errors would only hide it.
struct skip_checks {};

/// The row every policy family shares: policies are values, moved into a Runtime.
template <class T>
concept movable = std::move_constructible<T>;

}  // namespace loom::detail
