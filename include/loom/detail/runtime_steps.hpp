#pragma once
// The work of Runtime's step members that does not depend on the policies' types: the
// several-optimizers argument check and the clip's finiteness check.
#include <cmath>
#include <cstddef>
#include <sstream>
#include <string>

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

}  // namespace loom::detail
