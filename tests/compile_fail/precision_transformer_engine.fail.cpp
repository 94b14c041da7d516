// expect-error: .?"transformer-engine.?" precision is not supported by loom
#include <loom/precision/select.hpp>
#ifdef LOOM_FAIL
using P = loom::precision_t<"transformer-engine">;
#else
using P = loom::precision_t<"bf16-mixed">;
#endif
static_assert(sizeof(P) > 0);
