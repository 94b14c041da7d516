#pragma once
#include <string_view>

#include <loom/dist/defaults.hpp>

namespace loom::dist {

/// "single_device" (Lightning's name for it): one process, no collectives. Runtime's default
/// Strategy: `Runtime<Cpu, Fp32>` is `Runtime<Cpu, Fp32, SingleProcess>`, the same empty type.
struct SingleProcess : Defaults<SingleProcess> {
  static constexpr std::string_view strategy() { return "single_device"; }
};

}  // namespace loom::dist

namespace loom {
using dist::SingleProcess;
}  // namespace loom
