#pragma once
// A counting CPU allocator for the memory benchmarks: installed in front of c10's, it counts the
// bytes the CPU allocator holds and their peak, and can refuse to hold more than a limit (a
// rank's memory limit, as a cgroup would set it, without the processes' other mappings).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

namespace loom::bench {

/// A CPU allocator (c10's alloc_cpu and free_cpu) that counts the bytes it holds and their
/// peak. The data pointer is the context, as c10's raw allocation needs.
class CountingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t n) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (limit_ > 0 && held_ + static_cast<int64_t>(n) > limit_) {
        TORCH_CHECK_WITH(OutOfMemoryError, false, "CountingAllocator: ", n,
                         " bytes more would exceed the limit of ", limit_, " bytes (", held_,
                         " held)");
      }
    }
    void* p = c10::alloc_cpu(n);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      sizes_[p] = n;
      held_ += static_cast<int64_t>(n);
      peak_ = std::max(peak_, held_);
    }
    return {p, p, &release, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  int64_t held() {
    std::lock_guard<std::mutex> lock(mutex_);
    return held_;
  }
  int64_t peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    return peak_;
  }
  /// Allocations beyond `bytes` held in all fail with c10::OutOfMemoryError (0: no limit).
  void set_limit(int64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    limit_ = bytes;
  }
  void reset_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    peak_ = held_;
  }

  static CountingAllocator& instance() {
    static CountingAllocator a;
    return a;
  }

 private:
  static void release(void* p) {
    if (p == nullptr) return;
    CountingAllocator& a = instance();
    {
      std::lock_guard<std::mutex> lock(a.mutex_);
      auto it = a.sizes_.find(p);
      if (it != a.sizes_.end()) {
        a.held_ -= static_cast<int64_t>(it->second);
        a.sizes_.erase(it);
      }
    }
    c10::free_cpu(p);
  }

  std::mutex mutex_;
  std::unordered_map<void*, std::size_t> sizes_;
  int64_t held_ = 0, peak_ = 0, limit_ = 0;
};

}  // namespace loom::bench
