#pragma once
// Choosing a whole runtime from the two strings a command line gives:
//
//   return loom::with_runtime(device_flag, precision_flag, [&](auto& rt) { return train(rt); });
//
// calls train with a loom::Runtime<Device, Precision> for the named pair. Every pair is
// compiled (2 devices x 6 precisions), so fn must return the same type for all of them.
// with_runtime<loom::Ddp>(...) gives each runtime that strategy (default-constructed).
#include <string_view>
#include <type_traits>
#include <utility>

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

/// Calls `fn(rt)` with a `Runtime<D, P, Strategy>` for the device `device_name` selects (see
/// device::parse_device) and the precision `precision_name` selects (see with_precision),
/// built from `options`, and returns fn's result. Unknown names throw loom::Error listing the
/// allowed ones; naming "cuda" without a usable GPU throws loom::Error from Cuda's constructor.
template <class Strategy = dist::SingleProcess, class Fn>
decltype(auto) with_runtime(std::string_view device_name, std::string_view precision_name, Fn&& fn,
                            const RuntimeOptions& options = {}) {
  const device::Kind kind = device::parse_device(device_name);  // before a precision warning
  auto run = [&](auto device) -> decltype(auto) {
    return with_precision(
        precision_name,
        [&](auto precision) -> decltype(auto) {
          Runtime<decltype(device), decltype(precision), Strategy> rt(
              std::move(device), std::move(precision), Strategy());
          return fn(rt);
        },
        options.precision);
  };
  using R = decltype(run(device::Cpu()));
  static_assert(std::is_same_v<R, decltype(run(device::Cuda()))>,
                "loom::with_runtime(device, precision, fn): fn must return the same type for "
                "every device and precision");
  if (kind == device::Kind::Cuda) return static_cast<R>(run(device::Cuda(options.cuda)));
  return static_cast<R>(run(device::Cpu()));
}

}  // namespace loom
