// loom::amp::GradScaler against torch.amp.GradScaler("cpu"), bitwise.
//
// tests/parity/grad_scaler_parity.py drives torch's scaler and SGD through a fixed gradient
// sequence (with injected inf/nan and an overflow) and writes inputs and results as exact hex
// floats. This test replays the same inputs through loom and compares, after every step, the
// applied/skipped decision, the scale and the growth tracker, then the final parameters bit for
// bit. Hidden ([.]): ctest runs it as amp.grad_scaler_parity after the fixture
// amp.grad_scaler_parity.generate, with LOOM_GRAD_SCALER_PARITY_FILE set.
#include "support/catch.hpp"
#include "support/fixture.hpp"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/optim/sgd.h>

#include <loom/amp/grad_scaler.hpp>
#include <loom/optim/adam.hpp>

using loom::testing::bit_mismatches;
using loom::testing::make;
using loom::testing::Reader;

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

  const auto optimizer = in.word();  // "sgd": torch::optim::SGD; "adam_fused": loom::optim::Adam
  REQUIRE((optimizer == "sgd" || optimizer == "adam_fused"));
  const double lr = in.number();
  const double momentum = optimizer == "sgd" ? in.number() : 0.0;
  const double weight_decay = optimizer == "sgd" ? in.number() : 0.0;

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
  std::unique_ptr<torch::optim::Optimizer> optimizer_ptr;
  if (optimizer == "sgd") {
    optimizer_ptr = std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(lr).momentum(momentum).weight_decay(weight_decay));
  } else {
    optimizer_ptr = std::make_unique<loom::optim::Adam>(params, loom::optim::AdamOptions(lr));
  }
  auto& opt = *optimizer_ptr;

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
    const bool applied = scaler.step(opt).applied();
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
  std::cout << "grad_scaler_parity (" << optimizer << "): " << steps << " steps, skipped ["
            << skipped_list.str() << " ], final scale " << scaler.get_scale() << ", tracker "
            << scaler.get_growth_tracker() << ", parameter bit mismatches " << mismatches
            << "\n  scale after each step:" << trace.str() << '\n';
}
