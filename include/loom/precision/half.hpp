#pragma once
#include <string_view>

#include <loom/precision/uniform.hpp>

namespace loom::precision {

/// "16-true": everything in fp16, optimizer state included; no loss scaling.
struct Fp16True : Uniform<c10::kHalf> {
  static constexpr std::string_view precision() { return "16-true"; }
};

/// "bf16-true": everything in bf16, optimizer state included.
struct Bf16True : Uniform<c10::kBFloat16> {
  static constexpr std::string_view precision() { return "bf16-true"; }
};

}  // namespace loom::precision
