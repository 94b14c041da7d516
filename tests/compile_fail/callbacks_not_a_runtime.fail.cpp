// expect-error: loom::WithCallbacks<Runtime, Callbacks...>: the first argument must be a loom::Runtime
#include <loom/callbacks.hpp>
#include <loom/device/cpu.hpp>
#include <loom/precision/fp32.hpp>

struct Quiet {};  // a callback that takes no event
#ifdef LOOM_FAIL
using R = loom::WithCallbacks<loom::Cpu, Quiet>;  // a device policy where the runtime goes
#else
using R = loom::WithCallbacks<loom::Runtime<loom::Cpu, loom::Fp32>, Quiet>;
#endif
static_assert(sizeof(R) > 0);  // instantiates the class, and with it the checks
