// expect-error: loom::precision::Bf16Mixed: `bf16-mixed` does not use a scaler
#include <loom/precision/mixed.hpp>
#ifdef LOOM_FAIL
loom::precision::Bf16Mixed p{loom::amp::GradScalerOptions{}};
#else
loom::precision::Fp16Mixed p{loom::amp::GradScalerOptions{}};
#endif
