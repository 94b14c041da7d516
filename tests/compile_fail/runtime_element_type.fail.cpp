// expect-error: the Precision argument is an element type or a dtype \(such as c10::Half or torch::Dtype\), not a precision policy. Common mistake
// reject-error: it lacks
#include <c10/util/Half.h>
#include <loom/device/cpu.hpp>
#include <loom/precision/mixed.hpp>
#include <loom/runtime.hpp>
#ifdef LOOM_FAIL
using R = loom::Runtime<loom::Cpu, c10::Half>;
#else
using R = loom::Runtime<loom::Cpu, loom::Fp16Mixed>;
#endif
static_assert(sizeof(R) > 0);
