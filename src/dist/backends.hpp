#pragma once
// The process-group backends, each in its own translation unit: ProcessGroupGloo's header
// needs gloo's headers and ProcessGroupNCCL's needs NCCL's, so only gloo.cpp and nccl.cpp
// include them. Internal to the loom::dist library.
#include <chrono>

#include <c10/core/Device.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace loom::dist::detail {

/// A ProcessGroupGloo on `store`: devices from GLOO_SOCKET_IFNAME, else the default device.
c10::intrusive_ptr<c10d::Backend> make_gloo(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                            int world_size, std::chrono::milliseconds timeout);

/// c10d's ProcessGroupWrapper around `backend`, as Python's init_process_group builds it under
/// TORCH_DISTRIBUTED_DEBUG=DETAIL: before each collective, a helper ProcessGroupGloo on
/// `store` runs a monitored barrier and compares the collective's fingerprint (operation,
/// sequence number, shapes, dtypes) across the ranks, so that ranks calling different
/// collectives fail at once on every rank, naming both.
c10::intrusive_ptr<c10d::Backend> wrap_for_debug(const c10::intrusive_ptr<c10d::Backend>& backend,
                                                 const c10::intrusive_ptr<c10d::Store>& store,
                                                 int rank, int world_size,
                                                 std::chrono::milliseconds timeout);

/// A ProcessGroupNCCL on `store` for `device` (the current CUDA device is set first); throws
/// loom::Error when loom::dist was built without NCCL.
c10::intrusive_ptr<c10d::Backend> make_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                            int world_size, std::chrono::milliseconds timeout,
                                            c10::Device device);

/// Whether make_nccl can make one (loom::dist was built with NCCL's headers).
bool has_nccl();

}  // namespace loom::dist::detail
