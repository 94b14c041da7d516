#pragma once
#include <cstdio>
#include <exception>
#include <string_view>

namespace loom::dist {

/// Writes `line` and a newline to standard output on rank 0 only (any loom::Collectives:
/// rt.strategy()), and flushes, so lines from a run of many processes come once and in time.
template <class Strategy>
void rank_zero_print(const Strategy& strategy, std::string_view line) {
  if (!strategy.is_global_zero()) return;
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

/// The scope rank_zero_first() returns: rank 0 (with `local`, each machine's local rank 0)
/// runs it first, every other rank waits at its start until those have left it. Each rank
/// meets the others in one barrier: the first ones at the scope's end, the others at its
/// start. A scope left by an exception skips its barrier (the others then fail when the
/// strategy's timeout ends, with a loom::Error); a failed barrier at the end throws from the
/// destructor.
template <class Strategy>
class RankZeroFirst {
 public:
  RankZeroFirst(Strategy& strategy, bool local)
      : strategy_(strategy),
        first_((local ? strategy.local_rank() : strategy.rank()) == 0),
        exceptions_(std::uncaught_exceptions()) {
    if (!first_) wait();
  }
  RankZeroFirst(const RankZeroFirst&) = delete;
  RankZeroFirst& operator=(const RankZeroFirst&) = delete;
  ~RankZeroFirst() noexcept(false) {
    if (first_ && std::uncaught_exceptions() == exceptions_) wait();
  }

 private:
  void wait() { strategy_.barrier("rank_zero_first"); }

  Strategy& strategy_;
  bool first_;
  int exceptions_;
};

/// Fabric's rank_zero_first(): what rank 0 does in the scope (download a dataset, build a
/// cache) is done when the other ranks enter it.
///
///   {
///     auto first = loom::dist::rank_zero_first(rt.strategy());
///     prepare_data(dir);  // rank 0 first, then the others
///   }
template <class Strategy>
[[nodiscard]] RankZeroFirst<Strategy> rank_zero_first(Strategy& strategy, bool local = false) {
  return RankZeroFirst<Strategy>(strategy, local);
}

}  // namespace loom::dist
