#pragma once
// Choosing a whole runtime from the two strings a command line gives:
//
//   return loom::with_runtime(device_flag, precision_flag, [&](auto& rt) { return train(rt); });
//
// calls train with a loom::Runtime<Device, Precision, Strategy> for the named pair (one process
// unless a strategy is given below). Every pair is compiled (2 devices x 7 precisions), so fn
// must return the same type for all of them.
// Template arguments, in any order, each at most once, change that:
//
//   with_runtime<loom::Ddp>(...)                    each runtime has that strategy
//                                                   (default-constructed)
//   with_runtime<loom::devices<loom::Cpu>,          only these pairs are compiled (1 x 2
//                loom::precisions<loom::Fp32,       here); other names throw loom::Error
//                                 loom::Bf16Mixed>>(...)   listing the allowed ones
//
// and with_runtime(device, precision, fn, options, loom::Ddp(ddp_options)) moves a strategy
// instance, built with its options, into the runtime.
#include <cstddef>
#include <string_view>
#include <type_traits>
#include <utility>

#include <loom/concepts/strategy.hpp>
#include <loom/detail/meta.hpp>
#include <loom/device/select.hpp>
#include <loom/dist/single_process.hpp>
#include <loom/precision/select.hpp>
#include <loom/runtime.hpp>

namespace loom {

/// What with_runtime builds the policies from: the Cuda device's options (used when the name
/// selects CUDA) and the precision's (used by the precisions that take options).
struct RuntimeOptions {
  device::CudaOptions cuda{};
  PrecisionOptions precision{};
};

namespace detail {

template <class T>
struct is_device_choice : std::bool_constant<is_specialization_of<T, devices>> {};
template <class T>
struct is_precision_choice : std::bool_constant<is_specialization_of<T, precisions>> {};
template <class T>
struct is_strategy_choice
    : std::bool_constant<!is_device_choice<T>::value && !is_precision_choice<T>::value> {};

/// The first of `Ts` that `Pred` accepts, else `Default`.
template <template <class> class Pred, class Default, class... Ts>
struct first_where {
  using type = Default;
};
template <template <class> class Pred, class Default, class T, class... Ts>
struct first_where<Pred, Default, T, Ts...>
    : std::conditional_t<Pred<T>::value, std::type_identity<T>, first_where<Pred, Default, Ts...>> {
};

/// with_runtime's template arguments: a loom::devices<...>, a loom::precisions<...> and a
/// strategy, in any order, each at most once; what is not given is every device, every
/// precision, one process.
template <class... Choices>
struct runtime_choices {
  static constexpr int device_lists = (0 + ... + int(is_device_choice<Choices>::value));
  static constexpr int precision_lists = (0 + ... + int(is_precision_choice<Choices>::value));
  static constexpr int strategies = (0 + ... + int(is_strategy_choice<Choices>::value));
  static_assert(device_lists <= 1 && precision_lists <= 1 && strategies <= 1,
                "loom::with_runtime<...>: give at most one loom::devices<...>, one "
                "loom::precisions<...> and one strategy");
  using device_list =
      typename first_where<is_device_choice, devices<device::Cpu, device::Cuda>, Choices...>::type;
  using precision_list =
      typename first_where<is_precision_choice, all_precisions, Choices...>::type;
  using strategy = typename first_where<is_strategy_choice, dist::SingleProcess, Choices...>::type;
  static_assert(is_device_list<device_list>, LOOM_DETAIL_DEVICE_LIST_MESSAGE);
  static_assert(is_precision_list<precision_list>, LOOM_DETAIL_PRECISION_LIST_MESSAGE);
  static constexpr bool valid = device_lists <= 1 && precision_lists <= 1 && strategies <= 1 &&
                                is_device_list<device_list> && is_precision_list<precision_list>;
};

/// Instantiates Runtime<D, P, S> for every P of the list: done before fn is called on them, as
/// GCC 12 with -ftime-report stops with an internal error when a Runtime is first instantiated
/// by the argument lookup of a call inside fn.
template <class S, class D, class... Ps>
struct complete_runtimes {
  static constexpr std::size_t size = (sizeof(Runtime<D, Ps, S>) + ...);
};

/// fn's result for one runtime; whether it is the same for every pair of the lists.
template <class Fn, class D, class P, class S>
using runtime_result = decltype(std::declval<Fn&>()(std::declval<Runtime<D, P, S>&>()));
template <class R, class Fn, class S, class D, class... Ps>
inline constexpr bool same_result_on_device = (std::is_same_v<R, runtime_result<Fn, D, Ps, S>> &&
                                               ...);
template <class Fn, class S, class Devices, class Precisions>
inline constexpr bool same_runtime_result = false;
template <class Fn, class S, class D, class... Ds, class P, class... Ps>
inline constexpr bool same_runtime_result<Fn, S, devices<D, Ds...>, precisions<P, Ps...>> =
    complete_runtimes<S, D, P, Ps...>::size > 0 &&
    ((complete_runtimes<S, Ds, P, Ps...>::size > 0) && ...) &&
    same_result_on_device<runtime_result<Fn, D, P, S>, Fn, S, D, P, Ps...> &&
    (same_result_on_device<runtime_result<Fn, D, P, S>, Fn, S, Ds, P, Ps...> && ...);

template <class List>
struct first_of;
template <template <class...> class List, class T, class... Ts>
struct first_of<List<T, Ts...>> {
  using type = T;
};
template <class Devices>
using first_device = typename first_of<Devices>::type;
template <class Precisions>
using first_precision = typename first_of<Precisions>::type;

/// The runtime for the named pair among the lists, its strategy from `make_strategy()`.
template <class Devices, class Precisions, class Strategy, class Fn, class MakeStrategy>
decltype(auto) select_runtime(std::string_view device_name, std::string_view precision_name, Fn& fn,
                              const RuntimeOptions& options, MakeStrategy& make_strategy) {
  if constexpr (!StrategyPolicy<Strategy>) {
    // The strategy's diagnostic, as Runtime gives it (once, for one pair), and nothing after.
    static_assert(sizeof(Runtime<first_device<Devices>, first_precision<Precisions>, Strategy>));
  } else {
    static_assert(same_runtime_result<Fn, Strategy, Devices, Precisions>,
                  "loom::with_runtime(device, precision, fn): fn must return the same type for "
                  "every device and precision");
    return device::with_device<Devices>(
        device_name,
        [&](auto device) -> decltype(auto) {
          return with_precision<Precisions>(
              precision_name,
              [&](auto precision) -> decltype(auto) {
                Runtime<decltype(device), decltype(precision), Strategy> rt(
                    std::move(device), std::move(precision), make_strategy());
                return fn(rt);
              },
              options.precision);
        },
        options.cuda);
  }
}

}  // namespace detail

/// Calls `fn(rt)` with a `Runtime<D, P, Strategy>` for the device `device_name` selects (see
/// device::parse_device) and the precision `precision_name` selects (see with_precision),
/// built from `options`, and returns fn's result. Unknown names throw loom::Error listing the
/// allowed ones; naming "cuda" without a usable GPU throws loom::Error from Cuda's constructor.
///
/// `Choices`, in any order, each at most once: a strategy (default dist::SingleProcess,
/// default-constructed), a loom::devices<...> and a loom::precisions<...> limiting the pairs
/// compiled (default: all); a name outside them throws loom::Error listing those allowed.
template <class... Choices, class Fn>
decltype(auto) with_runtime(std::string_view device_name, std::string_view precision_name, Fn&& fn,
                            const RuntimeOptions& options = {}) {
  using C = detail::runtime_choices<Choices...>;
  if constexpr (C::valid) {
    using Strategy = typename C::strategy;
    auto make_strategy = [] { return Strategy(); };
    return detail::select_runtime<typename C::device_list, typename C::precision_list, Strategy>(
        device_name, precision_name, fn, options, make_strategy);
  }
}

/// with_runtime with a strategy instance, built with its options and moved into the runtime:
///
///   loom::DdpOptions ddp_options;
///   ddp_options.find_unused_parameters = true;
///   loom::with_runtime(device, precision, fn, {}, loom::Ddp(ddp_options));
///
/// `Choices` may limit the devices and precisions as above; a strategy among them must be
/// `Strategy` itself.
template <class... Choices, class Fn, class Strategy>
decltype(auto) with_runtime(std::string_view device_name, std::string_view precision_name, Fn&& fn,
                            const RuntimeOptions& options, Strategy strategy) {
  using C = detail::runtime_choices<Choices...>;
  static_assert(C::strategies == 0 || std::is_same_v<typename C::strategy, Strategy>,
                "loom::with_runtime<S>(device, precision, fn, options, strategy): the strategy "
                "instance is not an S; give the strategy once, as the instance");
  if constexpr (C::valid) {
    auto make_strategy = [&] { return std::move(strategy); };
    return detail::select_runtime<typename C::device_list, typename C::precision_list, Strategy>(
        device_name, precision_name, fn, options, make_strategy);
  }
}

}  // namespace loom
