// The one translation unit that includes ProcessGroupGloo.hpp. Its gloo headers come from the
// build machine's gloo package (headers only): the gloo code itself is the copy inside
// libtorch_cpu, which exports it.
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupWrapper.hpp>

#include "backends.hpp"

namespace loom::dist::detail {

c10::intrusive_ptr<c10d::Backend> make_gloo(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                            int world_size, std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupGloo::Options::create_default(timeout);
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, options);
}

c10::intrusive_ptr<c10d::Backend> wrap_for_debug(const c10::intrusive_ptr<c10d::Backend>& backend,
                                                 const c10::intrusive_ptr<c10d::Store>& store,
                                                 int rank, int world_size,
                                                 std::chrono::milliseconds timeout) {
  return c10::make_intrusive<c10d::ProcessGroupWrapper>(
      backend, make_gloo(store, rank, world_size, timeout));
}

}  // namespace loom::dist::detail
