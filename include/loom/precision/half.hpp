#pragma once
#include <string_view>

#include <loom/precision/uniform.hpp>

namespace loom::precision {

/// "16-true": everything in fp16, optimizer state included; no loss scaling. Slow on the CPU
/// (warns once there): prefer "bf16-true" or "bf16-mixed" on a CPU.
struct Fp16True : Uniform<Fp16True, c10::kHalf> {
  static constexpr std::string_view precision() { return "16-true"; }
};

/// "bf16-true": everything in bf16, optimizer state included.
struct Bf16True : Uniform<Bf16True, c10::kBFloat16> {
  static constexpr std::string_view precision() { return "bf16-true"; }
};

}  // namespace loom::precision

namespace loom {
using precision::Bf16True;
using precision::Fp16True;
}  // namespace loom
