// Replaces the program's operator new and delete to count each thread's allocations
// (count_new.hpp). In a translation unit of its own: a compiler that saw these bodies inlined
// beside the standard library's would pair new and free as mismatched.
#include "published/count_new.hpp"

#include <cstddef>
#include <cstdlib>
#include <new>

namespace {
thread_local int64_t allocations = 0;
}  // namespace

int64_t loom::testing::heap_allocations() { return allocations; }

void* operator new(std::size_t n) {
  ++allocations;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
