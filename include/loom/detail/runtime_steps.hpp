#pragma once
// The work of Runtime's step members that does not depend on the policies' types: the
// several-optimizers argument check, the clip's finiteness check and the count of forward
// scopes behind the warning about a model called directly.
#include <cmath>
#include <cstddef>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

#include <c10/util/Exception.h>

#include <loom/error.hpp>
#include <loom/step_result.hpp>

namespace loom::detail {

/// rt.optimizer_step({o1, o2}): a loom::Error for an empty list or an optimizer named twice.
inline void check_distinct(Optimizers optimizers) {
  if (optimizers.empty()) throw Error("loom::Runtime::optimizer_step: no optimizers given");
  for (std::size_t i = 0; i < optimizers.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      if (&optimizers[i].get() == &optimizers[j].get()) {
        std::string what = "loom::Runtime::optimizer_step: optimizer ";
        what.append(std::to_string(i)).append(" is optimizer ").append(std::to_string(j));
        throw Error(what.append(" again; each steps once per step"));
      }
    }
  }
}

/// rt.clip_gradients(..., error_if_nonfinite = true): reads the norm (one sync) and refuses a
/// non-finite one, with Python's clip_grad_norm_ wording.
inline void check_finite_norm(const GradNorm& norm, double norm_type) {
  const double n = norm.value();
  if (!std::isfinite(n)) {
    std::ostringstream what;
    what << "loom::Runtime::clip_gradients: the total norm of order " << norm_type
         << " of the gradients is non-finite ("
         << (std::isnan(n) ? "nan"
             : n > 0       ? "inf"
                           : "-inf")
         << "), so it cannot be clipped; without error_if_nonfinite the gradients are scaled by "
            "the non-finite norm and the run goes on";
    throw Error(what.str());
  }
}

/// Under a precision whose forward runs in autocast (the -mixed ones): whether a forward scope
/// (rt.forward, rt.forward_context) opened since the last optimizer step, so that a backward
/// after a direct model call (autocast off) is warned about, once. Two flags: they fit in the
/// runtime's padding.
struct ForwardCount {
  bool opened_since_step = false;
  bool warned = false;
  void opened() { opened_since_step = true; }
  void stepped() { opened_since_step = false; }
  bool first_direct_backward() { return !opened_since_step && !std::exchange(warned, true); }
};

/// The other precisions: nothing to count.
struct NoForwardCount {
  void opened() {}
  void stepped() {}
  bool first_direct_backward() { return false; }
};

/// rt.backward's warning when ForwardCount::first_direct_backward() holds.
inline void warn_direct_backward(std::string_view precision) {
  TORCH_WARN(
      "loom::Runtime::backward: no rt.forward ran since the last optimizer step, so the model "
      "was called directly and ",
      precision,
      "'s autocast was off: the forward ran in the weights' dtype, not the precision's. Call "
      "the model through rt.forward(model, inputs...) (or inside rt.forward_context()); this "
      "warning is given once");
}

}  // namespace loom::detail
