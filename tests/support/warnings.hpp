#pragma once
// Capturing LibTorch warnings (TORCH_WARN) in tests.
#include <string>
#include <vector>

#include <c10/util/Exception.h>

namespace loom::testing {

/// Collects the TORCH_WARN messages raised on this thread while it is alive.
struct WarningCatcher : c10::WarningHandler {
  std::vector<std::string> messages;
  c10::WarningUtils::WarningHandlerGuard guard{this};
  void process(const c10::Warning& w) override { messages.push_back(w.msg()); }
};

}  // namespace loom::testing
