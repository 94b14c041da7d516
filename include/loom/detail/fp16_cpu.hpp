#pragma once
// The one warning fp16 precisions give on the CPU: real fp16, but slow for convolutions there.
#include <string>
#include <string_view>

#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>

namespace loom::detail {

/// Warns once per process (TORCH_WARN_ONCE) when an fp16 precision runs on the CPU, naming
/// bf16-mixed; the precision is still used as asked (no silent switch).
inline void warn_if_fp16_on_cpu(std::string_view precision, c10::DeviceType device) {
  if (device != c10::kCPU) return;
  TORCH_WARN_ONCE("loom: precision \"", std::string(precision),
                  "\" on the CPU computes in real fp16, which LibTorch's CPU kernels run slowly "
                  "(convolutions most of all: see docs/precision.md); on a CPU prefer \"32-true\", "
                  "or \"bf16-mixed\" where the CPU has native bf16 (AVX-512 BF16, AMX)");
}

}  // namespace loom::detail
