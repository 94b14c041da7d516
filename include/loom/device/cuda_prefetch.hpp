#pragma once
// How a batch reaches a CUDA device on PrefetchLoader's producer thread (device/prefetch.hpp):
//
//   producer thread (CUDAGuard: this device; grad off)       consumer thread
//   pin every pageable host leaf (pin_memory)
//   under CUDAStreamGuard(side):
//     [side waits for the consumer stream, only if the
//      source already holds CUDA tensors]
//     move(t) = t.to(device, non_blocking = pinned)
//     fn(batch)                    kernels on the side stream
//     record_stream(consumer) on every CUDA leaf
//     event.record(side)                                    take(): event.block(current stream)
//
// Lifetimes: the yielded tensors were allocated on the side stream and are
// handed to user code, whose lifetimes loom does not own, so each CUDA leaf is marked used on
// the consumer stream (the one current when begin() was called): when the last reference
// goes, the caching allocator reuses the block only after the consumer stream's work queued
// by then has finished, wherever that happens. Pinned staging buffers are protected by the
// caching host allocator's own events. Page: docs/data-path.md
#include <optional>
#include <type_traits>
#include <utility>

#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/core/GradMode.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <loom/batch/walk.hpp>

namespace loom::device {

/// A PrefetchLoader stage that copies on a side stream and hands batches out behind an event.
template <class Move>
class CudaStage {
 public:
  /// A batch whose copies and prefetch_fn kernels were issued on the side stream.
  template <class B>
  struct Ready {
    B batch;
    at::cuda::CUDAEvent done;  // recorded on the side stream after the last kernel
    c10::DeviceIndex index;

    /// The batch, once the consumer thread's current stream waits for the side stream.
    B take() && {
      done.block(c10::cuda::getCurrentCUDAStream(index));
      return std::move(batch);
    }
  };

  /// Per-thread state the producer sets first: the current device, and grad mode off.
  struct Scope {
    explicit Scope(c10::DeviceIndex index) : device(index), grad(false) {}
    c10::cuda::CUDAGuard device;
    c10::AutoGradMode grad;
  };

  CudaStage(c10::DeviceIndex index, Move move) : index_(index), move_(std::move(move)) {}

  /// This stage bound to the calling thread's current stream, with a side stream from the pool.
  CudaStage for_epoch() const {
    CudaStage out = *this;
    out.consumer_.emplace(c10::cuda::getCurrentCUDAStream(index_));
    out.side_.emplace(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index_));
    return out;
  }

  Scope producer_scope() const { return Scope(index_); }

  template <class B, class Fn>
  auto produce(const B& b, Fn& fn) const {
    using Out = std::remove_cvref_t<std::invoke_result_t<Fn&, B>>;
    bool on_device = false;
    auto pinned = batch::map(b, [&](const at::Tensor& t) {
      on_device = on_device || t.is_cuda();
      return t.is_cpu() && !t.is_pinned() ? t.pin_memory() : t;
    });
    c10::cuda::CUDAStreamGuard on_side(*side_);
    if (on_device) {
      // The source's own CUDA tensors may still be written on the consumer stream.
      at::cuda::CUDAEvent written;
      written.record(*consumer_);
      written.block(*side_);
    }
    Out out = fn(batch::map(pinned, move_));
    (void)batch::map(out, [&](const at::Tensor& t) {
      if (t.is_cuda()) t.record_stream(*consumer_);
      return t;
    });
    Ready<Out> ready{std::move(out), at::cuda::CUDAEvent(), index_};
    ready.done.record(*side_);
    return ready;
  }

 private:
  c10::DeviceIndex index_;
  Move move_;
  std::optional<c10::cuda::CUDAStream> consumer_;
  std::optional<c10::cuda::CUDAStream> side_;
};

}  // namespace loom::device
