#pragma once
#include <string_view>

#include <loom/precision/defaults.hpp>

namespace loom::precision {

/// "32-true": weights, activations and gradients in fp32; every hook is the default.
struct Fp32 : Defaults<Fp32> {
  static constexpr std::string_view precision() { return "32-true"; }
};

}  // namespace loom::precision

namespace loom {
using precision::Fp32;
}  // namespace loom
