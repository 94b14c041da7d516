// expect-error: loom::devices<...>: name loom::Cpu, loom::Cuda or both
// reject-error: it lacks|must return the same type
// A precision where with_runtime's device list goes: devices<loom::Fp32>.
#include <loom/select.hpp>

int steps() {
  auto fn = [](auto&) { return 1; };
#ifdef LOOM_FAIL
  loom::with_runtime<loom::devices<loom::Fp32>>("cpu", "32-true", fn);
  return 0;
#else
  return loom::with_runtime<loom::devices<loom::Cpu>>("cpu", "32-true", fn);
#endif
}
