// expect-error: loom::precision_t<Name>: unknown precision name. Allowed: .?"32-true
#include <loom/precision/select.hpp>
#ifdef LOOM_FAIL
using P = loom::precision_t<"fp16">;
#else
using P = loom::precision_t<"16-mixed">;
#endif
static_assert(sizeof(P) > 0);
