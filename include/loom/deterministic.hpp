#pragma once
// loom::configure_deterministic_mode and loom::DeterministicMode: Composer's deterministic mode
// (deterministic algorithms, cuDNN flags, the cuBLAS workspace variable) for LibTorch.
#include <cstdlib>
#include <optional>
#include <string>

#include <ATen/Context.h>

#include <loom/error.hpp>

namespace loom {

/// The process-wide settings deterministic mode changes, as they are now or were before.
struct DeterministicSettings {
  bool algorithms = false;            ///< at::globalContext().deterministicAlgorithms()
  bool algorithms_warn_only = false;  ///< ...WarnOnly(): warn instead of throwing
  bool cudnn_deterministic = false;   ///< torch.backends.cudnn.deterministic
  bool cudnn_benchmark = false;       ///< torch.backends.cudnn.benchmark
  /// CUBLAS_WORKSPACE_CONFIG, or nullopt where it is not set.
  std::optional<std::string> cublas_workspace_config;

  /// The settings of this process now.
  static DeterministicSettings current() {
    auto& ctx = at::globalContext();
    DeterministicSettings s;
    s.algorithms = ctx.deterministicAlgorithms();
    s.algorithms_warn_only = ctx.deterministicAlgorithmsWarnOnly();
    s.cudnn_deterministic = ctx.deterministicCuDNN();
    s.cudnn_benchmark = ctx.benchmarkCuDNN();
    if (const char* v = std::getenv("CUBLAS_WORKSPACE_CONFIG")) s.cublas_workspace_config = v;
    return s;
  }

  /// Makes these the settings of this process.
  void apply() const {
    auto& ctx = at::globalContext();
    ctx.setDeterministicAlgorithms(algorithms, algorithms_warn_only);
    ctx.setDeterministicCuDNN(cudnn_deterministic);
    ctx.setBenchmarkCuDNN(cudnn_benchmark);
    const int rc = cublas_workspace_config
                       ? ::setenv("CUBLAS_WORKSPACE_CONFIG", cublas_workspace_config->c_str(), 1)
                       : ::unsetenv("CUBLAS_WORKSPACE_CONFIG");
    if (rc != 0) throw Error("loom: cannot set CUBLAS_WORKSPACE_CONFIG");
  }

  friend bool operator==(const DeterministicSettings&, const DeterministicSettings&) = default;
};

/// What deterministic mode sets: Composer's configure_deterministic_mode(), which is
///   torch.use_deterministic_algorithms(True)
///   torch.backends.cudnn.deterministic = True
///   torch.backends.cudnn.benchmark = False
///   os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
/// `warn_only` makes an op without a deterministic implementation warn instead of throw.
inline DeterministicSettings deterministic_settings(bool warn_only = false) {
  return {.algorithms = true,
          .algorithms_warn_only = warn_only,
          .cudnn_deterministic = true,
          .cudnn_benchmark = false,
          .cublas_workspace_config = ":4096:8"};
}

/// Turns deterministic mode on for the rest of the process and returns the settings it
/// replaced (give them to apply() to turn it off). An op with no deterministic implementation
/// then throws (`put_ does not have a deterministic implementation, ...`), or warns with
/// `warn_only`; new tensors from `at::empty` are filled (NaN, or the largest integer), as
/// LibTorch does in this mode. Call it before the first CUDA matrix product: cuBLAS reads
/// CUBLAS_WORKSPACE_CONFIG when it makes a handle. Its cost is measured in
/// docs/toolbox.md.
inline DeterministicSettings configure_deterministic_mode(bool warn_only = false) {
  auto before = DeterministicSettings::current();
  deterministic_settings(warn_only).apply();
  return before;
}

/// Deterministic mode for a scope (RAII): on from construction, the settings before it back at
/// destruction. The settings are process-wide: scopes on several threads at once see each
/// other's.
class DeterministicMode {
 public:
  explicit DeterministicMode(bool warn_only = false)
      : before_(configure_deterministic_mode(warn_only)) {}
  ~DeterministicMode() noexcept {
    try {
      before_.apply();
    } catch (...) {  // setenv fails only without memory; keep the destructor noexcept
    }
  }
  DeterministicMode(const DeterministicMode&) = delete;
  DeterministicMode& operator=(const DeterministicMode&) = delete;

  /// The settings this scope replaced.
  const DeterministicSettings& before() const noexcept { return before_; }

 private:
  DeterministicSettings before_;
};

}  // namespace loom
