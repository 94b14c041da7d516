#pragma once
#include <cstdio>
#include <string_view>

namespace loom::dist {

/// Writes `line` and a newline to standard output on rank 0 only (any StrategyPolicy:
/// rt.strategy()), and flushes, so lines from a run of many processes come once and in time.
template <class Strategy>
void rank_zero_print(const Strategy& strategy, std::string_view line) {
  if (!strategy.is_global_zero()) return;
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

}  // namespace loom::dist
