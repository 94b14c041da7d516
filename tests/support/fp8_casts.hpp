#pragma once
// The fp8 casts the tests check (on the CPU against the formula, on a GPU against the CPU):
// every input dtype given, contiguous and transposed, under tensor-wise and row-wise scales,
// to float8_e4m3fn and float8_e5m2.
#include <initializer_list>
#include <sstream>
#include <string>

#include <ATen/ATen.h>

#include <loom/fp8/scaled_mm.hpp>

namespace loom::testing {

/// Calls f(t, scaling, format, name) for every case above of the matrix `base`; `name` says
/// which, for INFO.
template <class F>
void for_each_fp8_cast(const at::Tensor& base, std::initializer_list<at::ScalarType> dtypes,
                       F&& f) {
  for (const auto dtype : dtypes) {
    for (const bool transposed : {false, true}) {
      const at::Tensor t = transposed ? base.to(dtype).t() : base.to(dtype);
      for (const auto s : {fp8::Scaling::Tensorwise, fp8::Scaling::Rowwise}) {
        for (const auto format : {c10::kFloat8_e4m3fn, c10::kFloat8_e5m2}) {
          std::ostringstream name;
          name << c10::toString(dtype) << (transposed ? ", transposed, " : ", ")
               << (s == fp8::Scaling::Tensorwise ? "tensor-wise, " : "row-wise, ")
               << c10::toString(format);
          f(t, s, format, name.str());
        }
      }
    }
  }
}

}  // namespace loom::testing
