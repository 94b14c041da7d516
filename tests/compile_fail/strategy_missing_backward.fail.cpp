// expect-error: does not model StrategyPolicy: it lacks `void backward\(const torch::Tensor& loss, Step&& step\)` that calls step\(\)
// A strategy written without the Defaults base forgets the hook around the backward pass.
#include <loom/device/cpu.hpp>
#include <loom/precision/fp32.hpp>
#include <loom/runtime.hpp>

#include "support/archetypes.hpp"
#ifdef LOOM_FAIL
using S = loom::testing::StrategyArchetype<loom::testing::s_strategy_has_backward>;
#else
using S = loom::testing::StrategyArchetype<-1>;
#endif
static_assert(sizeof(loom::Runtime<loom::Cpu, loom::Fp32, S>) > 0);
