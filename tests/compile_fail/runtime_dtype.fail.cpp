// expect-error: the Precision argument is an element type or a dtype \(such as c10::Half or torch::Dtype\), not a precision policy. Common mistake
// reject-error: it lacks
#include <torch/types.h>
#include <loom/device/cpu.hpp>
#include <loom/precision/half.hpp>
#include <loom/runtime.hpp>
#ifdef LOOM_FAIL
using R = loom::Runtime<loom::Cpu, torch::Dtype>;
#else
using R = loom::Runtime<loom::Cpu, loom::Bf16True>;
#endif
static_assert(sizeof(R) > 0);
