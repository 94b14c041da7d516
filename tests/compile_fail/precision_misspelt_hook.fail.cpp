// expect-error: DelayedScales::max_reduced_before_step is inherited: the override is misspelt
// A custom delayed-scaling precision that misspells the hook the runtime all-reduces across
// ranks (here the old name, amaxes_to_reduce) compiles and keeps the empty default; under Ddp
// its ranks' scales would drift apart. loom::is_default catches it next to the policy.
#include <string_view>

#include <ATen/core/Tensor.h>

#include <loom/is_default.hpp>
#include <loom/precision/mixed.hpp>

struct DelayedScales : loom::precision::Mixed<DelayedScales, c10::kBFloat16> {
  static constexpr std::string_view precision() { return "delayed-bf16"; }
#ifdef LOOM_FAIL
  at::Tensor amaxes_to_reduce() const { return amax_; }
#else
  at::Tensor max_reduced_before_step() const { return amax_; }
#endif
  at::Tensor amax_;
};
static_assert(loom::PrecisionPolicy<DelayedScales>);
static_assert(!loom::is_default(&DelayedScales::max_reduced_before_step),
              "DelayedScales::max_reduced_before_step is inherited: the override is misspelt");
