#pragma once
// Choosing the device policy at run time from a name, as a command-line flag gives it.
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <loom/device/cpu.hpp>
#include <loom/device/cuda.hpp>
#include <loom/error.hpp>

namespace loom::device {

/// The shipped device policies, as parse_device names them.
enum class Kind { Cpu, Cuda };

/// The device a name selects: "cpu"; "cuda" or its alias "gpu"; "auto", which is Cuda if
/// Cuda::is_available(), else Cpu. Case is ignored. Any other name throws loom::Error
/// quoting it.
inline Kind parse_device(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  if (lower == "cpu") return Kind::Cpu;
  if (lower == "cuda" || lower == "gpu") return Kind::Cuda;
  if (lower == "auto") return Cuda::is_available() ? Kind::Cuda : Kind::Cpu;
  throw Error("loom::device::parse_device: unknown device \"" + std::string(name) +
              "\"; expected \"cpu\", \"cuda\", \"gpu\" or \"auto\"");
}

/// Calls `fn(Cpu{})` or `fn(Cuda{})`, as parse_device(name) selects, and returns its result:
/// the one place where a run-time name becomes a compile-time policy. Both calls must return
/// the same type. Cuda is built from `cuda` (by default: LOCAL_RANK's device, TF32 unchanged).
///
///   return loom::device::with_device(flag, [&](auto device) {
///     loom::Runtime<decltype(device), loom::Fp32> rt(device);
///     return train(rt);
///   });
template <class F>
decltype(auto) with_device(std::string_view name, F&& fn, const CudaOptions& cuda = {}) {
  using R = std::invoke_result_t<F&, Cpu>;
  static_assert(std::is_same_v<R, std::invoke_result_t<F&, Cuda>>,
                "loom::device::with_device(name, fn): fn(loom::Cpu) and fn(loom::Cuda) must "
                "return the same type (docs/data-path.md)");
  if (parse_device(name) == Kind::Cuda) return static_cast<R>(fn(Cuda(cuda)));
  return static_cast<R>(fn(Cpu()));
}

}  // namespace loom::device
