#pragma once
#include <string_view>

#include <loom/precision/uniform.hpp>

namespace loom::precision {

/// "64-true": weights, inputs, activations and gradients in fp64; outputs back in fp32.
///
/// Complex buffers created under module_init_context become complex128 (the default complex
/// dtype follows the default dtype); existing complex buffers are left alone.
struct Fp64 : Uniform<Fp64, c10::kDouble> {
  static constexpr std::string_view precision() { return "64-true"; }
};

}  // namespace loom::precision

namespace loom {
using precision::Fp64;
}  // namespace loom
