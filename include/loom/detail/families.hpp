#pragma once
// Runtime's policy families, in the order of its parameters: the one list a new family joins.
// Each family names the concept its argument models and the check Runtime runs on it
// (detail/<family>_rows.hpp); the order check and the per-argument checks come from this list.
#include <cstddef>
#include <type_traits>
#include <utility>

#include <loom/concepts/device_policy.hpp>
#include <loom/concepts/precision_policy.hpp>
#include <loom/concepts/strategy.hpp>
#include <loom/detail/rows.hpp>

namespace loom::detail {

template <class... F>
struct family_list {};

struct device_family {
  template <class T>
  static constexpr bool models = DevicePolicy<T>;
  template <class T>
  using check = device_check<T>;
};
struct precision_family {
  template <class T>
  static constexpr bool models = PrecisionPolicy<T>;
  template <class T>
  using check = precision_check<T>;
};

struct strategy_family {
  template <class T>
  static constexpr bool models = StrategyPolicy<T>;
  template <class T>
  using check = strategy_check<T>;
};

/// The families, in Runtime's parameter order.
using families = family_list<device_family, precision_family, strategy_family>;

/// The position of the first family T models, or -1 when it models none.
template <class T, class... F>
constexpr int family_of(family_list<F...>) {
  int position = 0, found = -1;
  ((found = (found < 0 && F::template models<T>) ? position : found, ++position), ...);
  return found;
}

/// True unless some argument models the family of another position in `list`: a policy in
/// the wrong place (Runtime<loom::Fp32, loom::Cpu>).
template <class... Ts, class List = families>
constexpr bool policies_in_order(List list = {}) {
  int position = 0;
  bool ok = true;
  ((ok = ok && (family_of<Ts>(list) < 0 || family_of<Ts>(list) == position), ++position), ...);
  return ok;
}

/// Runs every family's check on the argument at its position, or none (`run` false: the
/// order is wrong, and the order error says it all).
template <bool run, class... F, class... Ts>
constexpr bool check_policies(family_list<F...>, Ts*...) {
  return (F::template check<std::conditional_t<run, Ts, skip_checks>>::value && ...);
}

}  // namespace loom::detail
