// loom::amp::GradScaler against torch.amp.GradScaler("cpu"), bitwise.
//
// tests/parity/grad_scaler_parity.py drives torch's scaler and SGD through a fixed gradient
// sequence (with injected inf/nan and an overflow) and writes inputs and results as exact hex
// floats. This test replays the same inputs through loom and compares, after every step, the
// applied/skipped decision, the scale and the growth tracker, then the final parameters bit for
// bit. Hidden ([.]): ctest runs it as amp.grad_scaler_parity after the fixture
// amp.grad_scaler_parity.generate, with LOOM_GRAD_SCALER_PARITY_FILE set.
#include "support/catch.hpp"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/optim/sgd.h>

#include <loom/amp/grad_scaler.hpp>

namespace {

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

at::Tensor make(const std::vector<double>& values, at::IntArrayRef shape, c10::ScalarType dtype) {
  auto t = at::tensor(values, at::TensorOptions(at::kDouble));  // exact: f32 values fit
  return t.to(dtype).reshape(shape).contiguous();
}

// How many elements differ in their bits.
int64_t bit_mismatches(const at::Tensor& actual, const at::Tensor& expected) {
  auto a = actual.detach().contiguous();
  auto e = expected.contiguous();
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

}  // namespace

TEST_CASE("GradScaler matches torch.amp.GradScaler bitwise over a fixed run",
          "[.][parity][amp][grad_scaler]") {
  const char* path = std::getenv("LOOM_GRAD_SCALER_PARITY_FILE");
  if (path == nullptr) {
    FAIL(
        "LOOM_GRAD_SCALER_PARITY_FILE is not set; run this test through ctest "
        "(amp.grad_scaler_parity), which generates the fixture first");
  }
  Reader in(path);
  in.expect("loom-grad-scaler-parity");
  REQUIRE(in.integer() == 1);

  in.expect("options");
  loom::amp::GradScalerOptions options;
  options.init_scale = in.number();
  options.growth_factor = in.number();
  options.backoff_factor = in.number();
  options.growth_interval = in.integer();
  loom::amp::GradScaler scaler(options);

  in.expect("sgd");
  const double lr = in.number();
  const double momentum = in.number();
  const double weight_decay = in.number();

  in.expect("params");
  const auto n_params = in.integer();
  std::vector<at::Tensor> params;
  for (int64_t i = 0; i < n_params; ++i) {
    in.expect("param");
    const auto dtype = in.word() == "f64" ? at::kDouble : at::kFloat;
    std::vector<int64_t> shape(static_cast<std::size_t>(in.integer()));
    int64_t numel = 1;
    for (auto& d : shape) numel *= (d = in.integer());
    params.push_back(make(in.numbers(numel), shape, dtype).requires_grad_());
  }
  torch::optim::SGD opt(params,
                        torch::optim::SGDOptions(lr).momentum(momentum).weight_decay(weight_decay));

  in.expect("steps");
  const auto steps = in.integer();
  std::vector<int64_t> skipped;
  std::ostringstream trace;
  for (int64_t step = 0; step < steps; ++step) {
    in.expect("step");
    REQUIRE(in.integer() == step);
    const bool explicit_unscale = in.integer() != 0;
    const auto n_inject = in.integer();
    std::vector<at::Tensor> grads;
    for (int64_t i = 0; i < n_params; ++i) {
      in.expect("grad");
      REQUIRE(in.integer() == i);
      auto& p = params[static_cast<std::size_t>(i)];
      auto first = in.word();
      if (first == "none") {
        grads.emplace_back();
        continue;
      }
      auto values = std::vector<double>{std::strtod(first.c_str(), nullptr)};
      for (auto v : in.numbers(p.numel() - 1)) values.push_back(v);
      grads.push_back(make(values, p.sizes(), p.scalar_type()));
    }

    opt.zero_grad(/*set_to_none=*/true);
    std::vector<at::Tensor> scaled(grads.size());
    for (std::size_t i = 0; i < grads.size(); ++i) {
      if (grads[i].defined()) scaled[i] = scaler.scale(grads[i]);  // as backward would give
    }
    for (int64_t k = 0; k < n_inject; ++k) {
      in.expect("inject");
      const auto i = static_cast<std::size_t>(in.integer());
      const auto index = in.integer();
      const double value = in.number();
      REQUIRE(scaled[i].defined());
      scaled[i].view({-1})[index].fill_(value);
    }
    for (std::size_t i = 0; i < grads.size(); ++i) {
      if (scaled[i].defined()) params[i].mutable_grad() = scaled[i];
    }
    if (explicit_unscale) scaler.unscale_(opt);
    const bool applied = scaler.step(opt);
    scaler.update();

    in.expect("expect");
    const bool torch_applied = in.integer() != 0;
    const double torch_scale = in.number();
    const int64_t torch_tracker = in.integer();
    INFO("step " << step);
    CHECK(applied == torch_applied);
    CHECK(scaler.get_scale() == torch_scale);  // both are f32 values widened to double: exact
    CHECK(scaler.get_growth_tracker() == torch_tracker);
    if (!applied) skipped.push_back(step);
    trace << ' ' << step << (applied ? "" : "(skip)") << ':' << scaler.get_scale();
  }

  int64_t mismatches = 0;
  for (auto& p : params) {
    in.expect("final");
    auto expected = make(in.numbers(p.numel()), p.sizes(), p.scalar_type());
    mismatches += bit_mismatches(p, expected);
  }
  CHECK(mismatches == 0);

  in.expect("state_dict");
  auto sd = scaler.state_dict();
  CHECK(sd.at("scale").toDouble() == in.number());
  CHECK(sd.at("growth_factor").toDouble() == in.number());
  CHECK(sd.at("backoff_factor").toDouble() == in.number());
  CHECK(sd.at("growth_interval").toInt() == in.integer());
  CHECK(sd.at("_growth_tracker").toInt() == in.integer());
  in.expect("end");

  std::ostringstream skipped_list;
  for (auto s : skipped) skipped_list << ' ' << s;
  std::cout << "grad_scaler_parity: " << steps << " steps, skipped [" << skipped_list.str()
            << " ], final scale " << scaler.get_scale() << ", tracker "
            << scaler.get_growth_tracker() << ", parameter bit mismatches " << mismatches
            << "\n  scale after each step:" << trace.str() << '\n';
}
