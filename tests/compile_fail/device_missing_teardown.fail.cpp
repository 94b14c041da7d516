// expect-error: the Device argument does not model DevicePolicy: it lacks `void teardown\(\)`
// A custom device written without the Defaults base forgets the teardown every policy has.
#include <loom/precision/fp32.hpp>
#include <loom/runtime.hpp>

#include "support/archetypes.hpp"
#ifdef LOOM_FAIL
using D = loom::testing::DeviceArchetype<loom::testing::d_has_teardown>;
#else
using D = loom::testing::DeviceArchetype<-1>;
#endif
static_assert(sizeof(loom::Runtime<D, loom::Fp32>) > 0);
