// expect-error: the Precision argument does not model PrecisionPolicy: it lacks `loom::StateDict state_dict\(\) const`
// A custom policy written without the Defaults base forgets a Checkpointable member.
#include <loom/device/cpu.hpp>
#include <loom/runtime.hpp>

#include "support/archetypes.hpp"
#ifdef LOOM_FAIL
using P = loom::testing::PrecisionArchetype<loom::testing::p_has_state_dict>;
#else
using P = loom::testing::PrecisionArchetype<-1>;
#endif
static_assert(sizeof(loom::Runtime<loom::Cpu, P>) > 0);
