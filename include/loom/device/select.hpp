#pragma once
// Choosing the device policy at run time from a name, as a command-line flag gives it.
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <loom/device/cpu.hpp>
#include <loom/device/cuda.hpp>
#include <loom/error.hpp>

namespace loom {

/// A list of device policies, to limit what with_device and with_runtime compile:
/// loom::devices<loom::Cpu> leaves CUDA out. Each is loom::Cpu or loom::Cuda.
template <class... Devices>
struct devices {};

}  // namespace loom

namespace loom::device {

/// The shipped device policies, as parse_device names them.
enum class Kind { Cpu, Cuda };

}  // namespace loom::device

namespace loom::detail {

/// Whether the list `Allowed` (a loom::devices<...>) holds `Device`.
template <class Allowed, class Device>
inline constexpr bool allows_device = false;
template <class... Ds, class Device>
inline constexpr bool allows_device<devices<Ds...>, Device> = (std::is_same_v<Ds, Device> || ...);

/// Whether `List` is a loom::devices<...> of one or more of loom::Cpu and loom::Cuda.
template <class List>
inline constexpr bool is_device_list = false;
template <class... Ds>
inline constexpr bool is_device_list<devices<Ds...>> = sizeof...(Ds) > 0 &&
                                                       ((std::is_same_v<Ds, device::Cpu> ||
                                                         std::is_same_v<Ds, device::Cuda>)&&...);
#define LOOM_DETAIL_DEVICE_LIST_MESSAGE                                                  \
  "loom::devices<...>: name loom::Cpu, loom::Cuda or both, as loom::devices<loom::Cpu> " \
  "(CUDA left out)"

/// The names a device list accepts, as the errors print them: "cpu", "cuda", "gpu" or "auto".
inline std::string device_names(bool cpu, bool cuda) {
  std::string names = cpu ? "\"cpu\"" : "";
  if (cuda) names += cpu ? ", \"cuda\", \"gpu\"" : "\"cuda\", \"gpu\"";
  return names + " or \"auto\"";
}

/// parse_device among the kinds allowed: "auto" is Cuda when Cuda is allowed and available,
/// else Cpu when Cpu is allowed; a name of a kind left out throws, listing those allowed.
inline device::Kind parse_device_among(std::string_view name, bool cpu, bool cuda) {
  std::string lower(name);
  for (char& c : lower) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  device::Kind kind;
  if (lower == "cpu") {
    kind = device::Kind::Cpu;
  } else if (lower == "cuda" || lower == "gpu") {
    kind = device::Kind::Cuda;
  } else if (lower == "auto") {
    return cuda && (!cpu || device::Cuda::is_available()) ? device::Kind::Cuda : device::Kind::Cpu;
  } else {
    throw Error("loom::device::parse_device: unknown device \"" + std::string(name) +
                "\"; expected " + device_names(cpu, cuda));
  }
  if (kind == device::Kind::Cpu ? cpu : cuda) return kind;
  throw Error("loom: device \"" + std::string(name) +
              "\" is not among the devices compiled in (loom::devices<...>); allowed: " +
              device_names(cpu, cuda));
}

}  // namespace loom::detail

namespace loom::device {

/// The device a name selects: "cpu"; "cuda" or its alias "gpu"; "auto", which is Cuda if
/// Cuda::is_available(), else Cpu. Case is ignored. Any other name throws loom::Error
/// quoting it.
inline Kind parse_device(std::string_view name) {
  return detail::parse_device_among(name, true, true);
}

/// Calls `fn(Cpu{})` or `fn(Cuda{})`, as parse_device(name) selects, and returns its result:
/// the one place where a run-time name becomes a compile-time policy. Both calls must return
/// the same type. Cuda is built from `cuda` (by default: LOCAL_RANK's device, TF32 unchanged).
///
///   return loom::device::with_device(flag, [&](auto device) {
///     loom::Runtime<decltype(device), loom::Fp32> rt(device);
///     return train(rt);
///   });
///
/// `Allowed`, a loom::devices<...>, limits the devices compiled (both by default):
/// with_device<loom::devices<loom::Cpu>>(flag, fn) compiles fn for the CPU only; "auto" is
/// then "cpu", and "cuda" throws loom::Error listing the names allowed.
template <class Allowed = devices<Cpu, Cuda>, class F>
decltype(auto) with_device(std::string_view name, F&& fn, const CudaOptions& cuda = {}) {
  static_assert(detail::is_device_list<Allowed>, LOOM_DETAIL_DEVICE_LIST_MESSAGE);
  constexpr bool cpu = detail::allows_device<Allowed, Cpu>;
  constexpr bool gpu = detail::allows_device<Allowed, Cuda>;
  if constexpr (cpu && gpu) {
    using R = std::invoke_result_t<F&, Cpu>;
    static_assert(std::is_same_v<R, std::invoke_result_t<F&, Cuda>>,
                  "loom::device::with_device(name, fn): fn(loom::Cpu) and fn(loom::Cuda) must "
                  "return the same type (docs/data-path.md)");
    if (parse_device(name) == Kind::Cuda) return static_cast<R>(fn(Cuda(cuda)));
    return static_cast<R>(fn(Cpu()));
  } else if constexpr (cpu) {
    (void)detail::parse_device_among(name, true, false);  // throws unless it names the CPU
    return fn(Cpu());
  } else if constexpr (gpu) {
    (void)detail::parse_device_among(name, false, true);
    return fn(Cuda(cuda));
  }
}

}  // namespace loom::device
