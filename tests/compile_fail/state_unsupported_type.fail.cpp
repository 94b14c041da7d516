// expect-error: loom::State: this type cannot be checkpointed; an entry refers to a module
#include <loom/state/entry.hpp>
#include <vector>
#ifdef LOOM_FAIL
using Saved = std::vector<float>;  // no state_dict(), not a tensor, module, number or string
#else
using Saved = double;
#endif
void entry_of(Saved& x) { loom::State state{{"x", x}}; }
