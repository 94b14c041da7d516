// expect-error: loom::Runtime: the policy arguments are out of order; the device policy comes first
// reject-error: it lacks|Common mistake
// The strategy written second, where the precision goes.
#include <loom/device/cpu.hpp>
#include <loom/dist/single_process.hpp>
#include <loom/precision/fp32.hpp>
#include <loom/runtime.hpp>
#ifdef LOOM_FAIL
using R = loom::Runtime<loom::Cpu, loom::SingleProcess, loom::Fp32>;
#else
using R = loom::Runtime<loom::Cpu, loom::Fp32, loom::SingleProcess>;
#endif
static_assert(sizeof(R) > 0);
