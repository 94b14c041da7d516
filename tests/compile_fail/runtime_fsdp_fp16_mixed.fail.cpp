// expect-error: loom::Fsdp refuses 16-mixed
// reject-error: it lacks
// 16-mixed under Fsdp: refused at compile time (its loss scaler's inf check is per rank).
#include <loom/device/cpu.hpp>
#include <loom/dist/fsdp.hpp>
#include <loom/precision/mixed.hpp>
#include <loom/runtime.hpp>
#ifdef LOOM_FAIL
using R = loom::Runtime<loom::Cpu, loom::Fp16Mixed, loom::Fsdp>;
#else
using R = loom::Runtime<loom::Cpu, loom::Bf16Mixed, loom::Fsdp>;
#endif
static_assert(sizeof(R) > 0);
