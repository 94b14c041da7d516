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

/// A ProcessGroupNCCL on `store` for `device` (the current CUDA device is set first); throws
/// loom::Error when loom::dist was built without NCCL.
c10::intrusive_ptr<c10d::Backend> make_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                            int world_size, std::chrono::milliseconds timeout,
                                            c10::Device device);

/// Whether make_nccl can make one (loom::dist was built with NCCL's headers).
bool has_nccl();

}  // namespace loom::dist::detail
