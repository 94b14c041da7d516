// The one translation unit that includes ProcessGroupNCCL.hpp; compiled with LOOM_DIST_NCCL
// when NCCL's header (from the torch wheel's nvidia-nccl package) was found.
#include <string>

#include <loom/error.hpp>

#include "backends.hpp"

#if LOOM_DIST_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace loom::dist::detail {

bool has_nccl() { return LOOM_DIST_NCCL != 0; }

c10::intrusive_ptr<c10d::Backend> make_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                            int world_size, std::chrono::milliseconds timeout,
                                            c10::Device device) {
#if LOOM_DIST_NCCL
  c10::cuda::set_device(device.index());
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, options);
#else
  (void)store, (void)rank, (void)world_size, (void)timeout, (void)device;
  throw Error(
      "loom::Ddp: this loom::dist was built without NCCL's headers, so it has no nccl "
      "backend; rebuild it with the torch wheel's nvidia-nccl package present, or pass "
      "DdpOptions::backend = \"gloo\"");
#endif
}

}  // namespace loom::dist::detail
