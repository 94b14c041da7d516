#pragma once
// Counting the host reads of tensor values that the code under test makes.
#include <string>

#include <ATen/record_function.h>

namespace loom::testing {

/// Counts the host reads of tensor values (`aten::item`, `aten::_local_scalar_dense`) that the
/// code under test makes itself, in this thread, while alive: calls at the top level, not
/// those inside another ATen op. (On the CPU the fused Adam kernel reads each parameter's step
/// count, a CPU tensor, inside the kernel; that is not a wait for any device, and on CUDA the
/// kernel reads the count on the device.)
class SyncCounter {
 public:
  SyncCounter() {
    handle_ = at::addThreadLocalCallback(
        at::RecordFunctionCallback(
            [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
              const std::string name = fn.name();
              if (depth() == 0 && (name == "aten::item" || name == "aten::_local_scalar_dense")) {
                ++count();
              }
              ++depth();
              return nullptr;
            },
            [](const at::RecordFunction&, at::ObserverContext*) { --depth(); })
            .scopes({at::RecordScope::FUNCTION}));
    count() = 0;
    depth() = 0;
  }
  ~SyncCounter() { at::removeCallback(handle_); }
  SyncCounter(const SyncCounter&) = delete;
  SyncCounter& operator=(const SyncCounter&) = delete;

  static int& count() {
    thread_local int n = 0;
    return n;
  }
  static int& depth() {
    thread_local int n = 0;
    return n;
  }

 private:
  at::CallbackHandle handle_;
};

}  // namespace loom::testing
