// expect-error: the Strategy argument is loom::DdpOptions, not a strategy policy. Common mistake
// reject-error: it lacks
// The options struct where the policy goes: Runtime<Cpu, Fp32, DdpOptions>.
#include <loom/device/cpu.hpp>
#include <loom/dist/ddp.hpp>
#include <loom/precision/fp32.hpp>
#include <loom/runtime.hpp>
#ifdef LOOM_FAIL
using R = loom::Runtime<loom::Cpu, loom::Fp32, loom::DdpOptions>;
#else
using R = loom::Runtime<loom::Cpu, loom::Fp32, loom::Ddp>;
#endif
static_assert(sizeof(R) > 0);
