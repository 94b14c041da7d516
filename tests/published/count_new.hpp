#pragma once
// The calling thread's heap allocations through operator new, which count_new.cpp replaces in
// the executable that links it (not the ThreadSanitizer build: its runtime defines them).
#include <cstdint>

namespace loom::testing {

/// How many times this thread has called operator new so far.
int64_t heap_allocations();

}  // namespace loom::testing
