// expect-error: loom::precisions<...>: name one or more of loom's precision policies
// reject-error: it lacks|must return the same type
// A dtype where with_runtime's precision list goes: precisions<c10::BFloat16>.
#include <loom/select.hpp>

int steps() {
  auto fn = [](auto&) { return 1; };
#ifdef LOOM_FAIL
  loom::with_runtime<loom::precisions<loom::Fp32, c10::BFloat16>>("cpu", "32-true", fn);
  return 0;
#else
  return loom::with_runtime<loom::precisions<loom::Fp32, loom::Bf16Mixed>>("cpu", "32-true", fn);
#endif
}
