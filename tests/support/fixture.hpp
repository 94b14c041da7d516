#pragma once
// Reading the parity fixtures that the tests' Python scripts (tests/parity/) write: tokens
// separated by whitespace, numbers as exact hex floats; and comparing tensors bit for bit.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "support/catch.hpp"

namespace loom::testing {

// The fixture's names of dtypes (Python's str(dtype) without "torch.").
inline std::string dtype_name(c10::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "float32";
    case at::kBFloat16:
      return "bfloat16";
    case at::kHalf:
      return "float16";
    case at::kDouble:
      return "float64";
    case at::kLong:
      return "int64";
    case at::kInt:
      return "int32";
    default:
      return c10::toString(t);
  }
}

inline c10::ScalarType dtype_of(const std::string& name) {
  for (auto t : {at::kFloat, at::kBFloat16, at::kHalf, at::kDouble, at::kLong, at::kInt}) {
    if (dtype_name(t) == name) return t;
  }
  FAIL("parity fixture: unknown dtype " << name);
  return at::kFloat;
}

// Whitespace-separated tokens of the fixture, read in order.
class Reader {
 public:
  explicit Reader(const std::string& path) {
    std::ifstream in(path);
    if (!in) FAIL("cannot open the parity fixture " << path);
    std::string token;
    while (in >> token) tokens_.push_back(token);
  }
  std::string word() {
    if (pos_ >= tokens_.size()) FAIL("the parity fixture ends early");
    return tokens_[pos_++];
  }
  void expect(const std::string& w) {
    auto got = word();
    if (got != w) FAIL("parity fixture: expected '" << w << "', got '" << got << "'");
  }
  int64_t integer() { return std::stoll(word()); }
  double number() {  // hex floats, inf and nan, exactly
    auto w = word();
    char* end = nullptr;
    double v = std::strtod(w.c_str(), &end);
    if (end == w.c_str() || *end != '\0') FAIL("parity fixture: not a number: " << w);
    return v;
  }
  std::vector<double> numbers(int64_t n) {
    std::vector<double> v;
    for (int64_t i = 0; i < n; ++i) v.push_back(number());
    return v;
  }

 private:
  std::vector<std::string> tokens_;
  std::size_t pos_ = 0;
};

inline at::Tensor make(const std::vector<double>& values, at::IntArrayRef shape,
                       c10::ScalarType dtype) {
  auto t = at::tensor(values, at::TensorOptions(at::kDouble));  // exact: f32 values fit
  return t.to(dtype).reshape(shape).contiguous();
}

// How many elements differ in their bits (either may be on a device: compared on the host).
inline int64_t bit_mismatches(const at::Tensor& actual, const at::Tensor& expected) {
  auto a = actual.detach().cpu().contiguous();
  auto e = expected.detach().cpu().contiguous();
  REQUIRE(a.scalar_type() == e.scalar_type());
  REQUIRE(a.numel() == e.numel());
  const auto size = a.element_size();
  const auto* pa = static_cast<const unsigned char*>(a.data_ptr());
  const auto* pe = static_cast<const unsigned char*>(e.data_ptr());
  int64_t bad = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (std::memcmp(pa + i * size, pe + i * size, static_cast<std::size_t>(size)) != 0) ++bad;
  }
  return bad;
}

}  // namespace loom::testing
