// expect-error: the Precision argument does not model PrecisionPolicy: it lacks `void convert_module\(torch::nn::Module&\)`
// A custom policy written without the Defaults base forgets one member.
#include <loom/device/cpu.hpp>
#include <loom/runtime.hpp>

#include "support/archetypes.hpp"
#ifdef LOOM_FAIL
using P = loom::testing::PrecisionArchetype<loom::testing::p_precision_has_convert_module>;
#else
using P = loom::testing::PrecisionArchetype<-1>;
#endif
static_assert(sizeof(loom::Runtime<loom::Cpu, P>) > 0);
