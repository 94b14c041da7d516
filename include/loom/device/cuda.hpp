#pragma once
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <loom/detail/env.hpp>
#include <loom/device/cuda_prefetch.hpp>
#include <loom/device/defaults.hpp>
#include <loom/device/prefetch.hpp>
#include <loom/device/rng.hpp>
#include <loom/error.hpp>
#include <loom/state_dict.hpp>
#include <loom/state_reader.hpp>

namespace loom::device {

/// Whether a Cuda policy sets TensorFloat-32 for float32 matmuls (cuBLAS) and convolutions
/// (cuDNN). The flags are process-global; Unchanged leaves whatever was set before.
enum class Tf32 { Unchanged, Enabled, Disabled };

/// What a Cuda policy is built from: which device, and what to do with TF32. The defaults
/// give LOCAL_RANK's device (else 0) and leave TF32 as it is.
struct CudaOptions {
  std::optional<c10::DeviceIndex> index;
  Tf32 tf32 = Tf32::Unchanged;
};

/// One CUDA device: non-blocking copies from pinned memory, the nccl backend, and the
/// device's RNG as state. Holds its index and its TF32 choice.
///
///   loom::Cuda gpu;          // LOCAL_RANK's device, else device 0
///   loom::Cuda second(1);    // device 1, whatever LOCAL_RANK says
///   loom::Runtime<loom::Cuda, loom::Fp32> rt(loom::Cuda(0, loom::device::Tf32::Enabled));
class Cuda : public Defaults<Cuda> {
 public:
  static constexpr c10::DeviceType device_type() { return c10::kCUDA; }
  static constexpr std::string_view name() { return "cuda"; }
  static constexpr std::string_view ddp_backend() { return "nccl"; }

  /// Device `index` if given (0 included), else LOCAL_RANK, else 0. Throws loom::Error when
  /// LOCAL_RANK is not a number, CUDA is not usable, or the index is out of range. Sets the
  /// TF32 flags only when asked to.
  explicit Cuda(std::optional<c10::DeviceIndex> index = {}, Tf32 tf32 = Tf32::Unchanged)
      : index_(index ? *index : local_rank()), tf32_(tf32) {
    const c10::DeviceIndex count = c10::cuda::device_count();
    if (count <= 0) {
      throw Error(
          "loom::device::Cuda: CUDA is not available (no CUDA device or driver was "
          "found); use loom::Cpu, or select the device with \"auto\"");
    }
    if (index_ < 0 || index_ >= count) {
      throw Error("loom::device::Cuda: device index " + std::to_string(index_) +
                  " is out of range: this process sees " + std::to_string(count) +
                  " CUDA device(s)");
    }
    if (tf32 != Tf32::Unchanged) {
      const bool on = tf32 == Tf32::Enabled;
      at::globalContext().setAllowTF32CuBLAS(on);
      at::globalContext().setAllowTF32CuDNN(on);
    }
  }

  /// Cuda(options.index, options.tf32).
  explicit Cuda(const CudaOptions& options) : Cuda(options.index, options.tf32) {}

  /// LOCAL_RANK as a device index: 0 when unset; anything but a whole number >= 0 is an error
  /// (torchrun sets it; a typo must not silently pick device 0).
  static c10::DeviceIndex local_rank() {
    return static_cast<c10::DeviceIndex>(detail::parse_env_index(std::getenv("LOCAL_RANK"),
                                                                 "loom::device::Cuda", "LOCAL_RANK",
                                                                 32767)
                                             .value_or(0));
  }

  /// True if this process sees at least one CUDA device; never throws.
  static bool is_available() noexcept { return c10::cuda::device_count() > 0; }

  /// The torch device, with its index.
  c10::Device device() const { return c10::Device(c10::kCUDA, index_); }
  c10::DeviceIndex index() const noexcept { return index_; }
  Tf32 tf32() const noexcept { return tf32_; }

  /// Makes this device current on the calling thread and checks it; may be called again.
  /// The current device is per host thread: call it on each thread that launches kernels.
  void prepare() {
    c10::cuda::set_device(index_);
    const c10::DeviceIndex now = c10::cuda::current_device();
    if (now != index_) {
      throw Error("loom::device::Cuda::prepare: asked for device " + std::to_string(index_) +
                  ", but the current device is " + std::to_string(now));
    }
  }

  /// The tensor on this device; non-blocking only from pinned memory, where it is
  /// asynchronous (from pageable memory the copy is synchronous anyway).
  at::Tensor tensor_to_device(const at::Tensor& t) const {
    return t.to(device(), /*non_blocking=*/t.is_pinned());
  }

  using Defaults<Cuda>::dataloader_to_device;

  /// A view of `source` whose batches are pinned, copied on a side stream and passed through
  /// `fn` there by a producer thread, `prefetch.depth` batches ahead (device/cuda_prefetch.hpp).
  template <class Source, class Fn>
  auto dataloader_to_device(Source& source, Fn fn, Prefetch prefetch) const {
    auto move = [self = *this](const at::Tensor& t) { return self.tensor_to_device(t); };
    using Stage = CudaStage<decltype(move)>;
    return PrefetchLoader<Source, Stage, Fn>(source, Stage(index_, std::move(move)), std::move(fn),
                                             prefetch);
  }

  /// {"torch": the CPU generator's state, "torch.cuda": this device's CUDA generator's}, as
  /// Python's torch.get_rng_state() and torch.cuda.get_rng_state(index) (uint8 tensors).
  StateDict state_dict() const {
    return {{"torch", get_rng_state()}, {"torch.cuda", get_rng_state(device())}};
  }

  /// Restores both generators (either may be absent: a state saved by loom::Cpu has no
  /// "torch.cuda"); a state of another size (another torch version's format) is skipped with
  /// a warning, so that a checkpoint still loads.
  void load_state_dict(const StateDict& state) {
    static constexpr const char* owner = "loom::device::Cuda::load_state_dict";
    state::Reader r(std::string(owner), state);
    const auto cpu = r.optional_tensor("torch");
    const auto cuda = r.optional_tensor("torch.cuda");
    r.finish();
    if (cpu) set_rng_state(*cpu, c10::Device(c10::kCPU), owner);
    if (cuda) set_rng_state(*cuda, device(), owner);
  }

  /// Waits for all work queued on this device.
  void synchronize() const {
    c10::cuda::CUDAGuard guard(index_);
    c10::cuda::device_synchronize();
  }

  /// Waits for the device, then returns the caching allocator's free blocks to the driver.
  void teardown() {
    synchronize();
    c10::cuda::CUDACachingAllocator::emptyCache();
  }

 private:
  c10::DeviceIndex index_;
  Tf32 tf32_;
};

}  // namespace loom::device

namespace loom {
using device::Cuda;
}  // namespace loom
