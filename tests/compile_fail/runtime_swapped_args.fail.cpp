// expect-error: loom::Runtime: the policy arguments are out of order; the device policy comes first
// reject-error: it lacks|Common mistake
#include <loom/device/cpu.hpp>
#include <loom/precision/fp32.hpp>
#include <loom/runtime.hpp>
#ifdef LOOM_FAIL
using R = loom::Runtime<loom::precision::Fp32, loom::device::Cpu>;
#else
using R = loom::Runtime<loom::device::Cpu, loom::precision::Fp32>;
#endif
static_assert(sizeof(R) > 0);  // instantiates the class, and with it the checks
