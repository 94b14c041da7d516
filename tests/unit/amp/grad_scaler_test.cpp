// loom::amp::GradScaler on the CPU: the lazy scale tensor, scaled backward, skipping and
// backing off on inf/nan, growth, misuse errors with torch's texts, state_dict, two optimizers.
#include "support/catch.hpp"

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/optim/sgd.h>

#include <loom/amp/grad_scaler.hpp>
#include <loom/error.hpp>

namespace {

using loom::amp::GradScaler;
using loom::amp::GradScalerOptions;
using Stage = GradScaler::Stage;
using Catch::Matchers::Contains;
using Catch::Matchers::Equals;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

// A parameter with requires_grad, filled with `value`.
at::Tensor param(std::vector<int64_t> shape, double value, c10::ScalarType dtype = at::kFloat) {
  return at::full(shape, value, at::TensorOptions().dtype(dtype)).requires_grad_();
}

void set_grad(at::Tensor& p, const at::Tensor& g) { p.mutable_grad() = g; }

// One iteration with the gradient `g` (already scaled) on every parameter of `opt`.
bool iterate(GradScaler& scaler, torch::optim::SGD& opt, double grad_value) {
  for (auto& p : opt.param_groups()[0].params()) {
    set_grad(p, at::full(p.sizes(), grad_value, p.options().requires_grad(false)));
  }
  const bool applied = scaler.step(opt).applied();
  scaler.update();
  return applied;
}

}  // namespace

TEST_CASE("GradScalerOptions has torch.amp.GradScaler's defaults", "[amp][grad_scaler]") {
  GradScalerOptions o;
  CHECK(o.init_scale == 65536.0);
  CHECK(o.growth_factor == 2.0);
  CHECK(o.backoff_factor == 0.5);
  CHECK(o.growth_interval == 2000);
  CHECK(o.enabled);
  GradScaler scaler;
  CHECK(scaler.options().growth_interval == 2000);
  CHECK(scaler.is_enabled());
}

TEST_CASE("GradScaler rejects options that break the requirements", "[amp][grad_scaler]") {
  auto with = [](auto edit) {
    GradScalerOptions o;
    edit(o);
    return o;
  };
  CHECK_THROWS_WITH(GradScaler(with([](auto& o) { o.growth_factor = 1.0; })),
                    Contains("growth_factor must be > 1"));
  CHECK_THROWS_WITH(GradScaler(with([](auto& o) { o.growth_factor = 0.5; })),
                    Contains("growth_factor must be > 1"));
  CHECK_THROWS_WITH(GradScaler(with([](auto& o) { o.growth_factor = kNan; })),
                    Contains("growth_factor must be > 1"));
  CHECK_THROWS_WITH(GradScaler(with([](auto& o) { o.backoff_factor = 0.0; })),
                    Contains("backoff_factor must be in (0, 1)"));
  CHECK_THROWS_WITH(GradScaler(with([](auto& o) { o.backoff_factor = 1.0; })),
                    Contains("backoff_factor must be in (0, 1)"));
  CHECK_THROWS_WITH(GradScaler(with([](auto& o) { o.backoff_factor = -0.5; })),
                    Contains("backoff_factor must be in (0, 1)"));
  CHECK_THROWS_WITH(GradScaler(with([](auto& o) { o.growth_interval = 0; })),
                    Contains("growth_interval must be >= 1"));
  CHECK_THROWS_AS(GradScaler(with([](auto& o) { o.growth_interval = -3; })), loom::Error);
  // Validated even when disabled (torch checks only enabled scalers; loom always does).
  CHECK_THROWS_AS(GradScaler(with([](auto& o) {
                    o.enabled = false;
                    o.growth_factor = 1.0;
                  })),
                  loom::Error);
  CHECK_NOTHROW(GradScaler(with([](auto& o) {
    o.growth_factor = 1.0001;
    o.backoff_factor = 0.9999;
    o.growth_interval = 1;
  })));
}

TEST_CASE("the scale tensor is created lazily, on the first scaled tensor's device",
          "[amp][grad_scaler]") {
  GradScaler scaler;
  CHECK(scaler.get_scale() == 65536.0);
  CHECK(scaler.get_growth_tracker() == 0);
  CHECK_FALSE(scaler.has_scale_tensor());
  CHECK_FALSE(scaler.scale_device().has_value());
  CHECK(scaler.state_dict().at("scale").toDouble() == 65536.0);
  CHECK_FALSE(scaler.has_scale_tensor());  // state_dict does not create it either

  SECTION("a tensor") {
    auto loss = at::full({}, 0.75);  // () f32
    auto scaled = scaler.scale(loss);
    REQUIRE(scaler.has_scale_tensor());
    REQUIRE(scaler.scale_device().has_value());
    CHECK(*scaler.scale_device() == loss.device());
    CHECK(scaled.scalar_type() == at::kFloat);
    CHECK(scaled.item<float>() == 0.75f * 65536.0f);
    CHECK(scaler.get_scale() == 65536.0);
    CHECK(scaler.get_growth_tracker() == 0);
  }
  SECTION("a vector of tensors") {
    CHECK(scaler.scale(std::vector<at::Tensor>{}).empty());
    CHECK_FALSE(scaler.has_scale_tensor());  // nothing to scale, nothing created
    auto out = scaler.scale(std::vector<at::Tensor>{at::full({2}, 1.5), at::full({}, -2.0)});
    REQUIRE(out.size() == 2);
    CHECK(at::equal(out[0], at::full({2}, 1.5 * 65536)));
    CHECK(out[1].item<float>() == -2.0f * 65536.0f);
    CHECK(*scaler.scale_device() == c10::Device(c10::kCPU));
  }
  SECTION("fp16 outputs keep their dtype") {
    auto out = scaler.scale(at::full({3}, 0.5, at::TensorOptions().dtype(at::kHalf)));  // (3) f16
    CHECK(out.scalar_type() == at::kHalf);
    CHECK(out[0].item<float>() == 32768.0f);
  }
  SECTION("undefined tensors are an error") {
    CHECK_THROWS_WITH(scaler.scale(at::Tensor()), Contains("the tensor is undefined"));
  }
}

TEST_CASE("backward through a scaled loss gives scale x the true gradients", "[amp][grad_scaler]") {
  GradScaler scaler;
  auto w = param({3}, 1.0);
  auto x = at::tensor({0.25f, -1.5f, 3.0f});  // (3) f32
  torch::optim::SGD opt({w}, torch::optim::SGDOptions(0.1));

  auto loss = (w * x).sum();  // () f32
  scaler.scale(loss).backward();
  CHECK(at::equal(w.grad(), x * 65536.0));

  scaler.unscale_(opt);
  CHECK(scaler.stage(opt) == Stage::Unscaled);
  CHECK(at::equal(w.grad(), x));  // exact: 65536 is a power of two
  CHECK(scaler.step(opt));
  CHECK(at::allclose(w, at::ones({3}) - 0.1 * x));
}

TEST_CASE("unscale_ multiplies by the f32 reciprocal computed in f64, per dtype group",
          "[amp][grad_scaler]") {
  GradScaler scaler(GradScalerOptions{.init_scale = 1000.0});
  auto a = param({4}, 0.0);
  auto b = param({2}, 0.0, at::kDouble);
  auto unused = param({5}, 7.0);  // no grad: skipped, stays undefined
  torch::optim::SGD opt({a, b, unused}, torch::optim::SGDOptions(1.0));
  scaler.scale(at::ones({}));

  auto ga = at::tensor({1000.0f, 3.0f, -7.0f, 1e-3f});                  // (4) f32
  auto gb = at::tensor({1000.0, 3.0}, at::TensorOptions(at::kDouble));  // (2) f64
  set_grad(a, ga.clone());
  set_grad(b, gb.clone());
  scaler.unscale_(opt);

  auto inv = at::full({}, 1000.0, at::kFloat).to(at::kDouble).reciprocal().to(at::kFloat);
  CHECK(at::equal(a.grad(), ga * inv));
  CHECK(at::equal(b.grad(), gb * inv));
  CHECK(b.grad().scalar_type() == at::kDouble);
  CHECK_FALSE(unused.grad().defined());
  CHECK(scaler.step(opt));
  CHECK(at::equal(unused, at::full({5}, 7.0)));
}

TEST_CASE("an inf or nan gradient skips the step and halves the scale", "[amp][grad_scaler]") {
  for (const double bad : {kInf, -kInf, kNan}) {
    for (const bool in_f64_group : {false, true}) {
      INFO("bad " << bad << ", in the f64 group " << in_f64_group);
      GradScaler scaler;
      auto w = param({2, 2}, 1.0);
      auto b = param({2}, -1.0, at::kDouble);
      torch::optim::SGD opt({w, b}, torch::optim::SGDOptions(0.5));
      auto w0 = w.detach().clone();
      auto b0 = b.detach().clone();
      scaler.scale(at::ones({}));

      auto gw = at::full({2, 2}, 65536.0);                               // (2, 2) f32
      auto gb = at::full({2}, 65536.0, at::TensorOptions(at::kDouble));  // (2) f64
      (in_f64_group ? gb : gw).view({-1})[1].fill_(bad);
      set_grad(w, gw);
      set_grad(b, gb);

      CHECK_FALSE(scaler.step(opt));
      CHECK(scaler.stage(opt) == Stage::Stepped);
      CHECK(at::equal(w, w0));  // the parameters are untouched
      CHECK(at::equal(b, b0));
      CHECK(scaler.get_scale() == 65536.0);  // only update() changes the scale
      scaler.update();
      CHECK(scaler.get_scale() == 32768.0);
      CHECK(scaler.get_growth_tracker() == 0);
      CHECK(scaler.stage(opt) == Stage::Ready);

      // The next clean step is applied, unscaled by the new scale.
      set_grad(w, at::full({2, 2}, 32768.0));
      set_grad(b, at::full({2}, 32768.0, at::TensorOptions(at::kDouble)));
      CHECK(scaler.step(opt));
      CHECK(at::equal(w, w0 - 0.5));
      CHECK(at::equal(b, b0 - 0.5));
      scaler.update();
      CHECK(scaler.get_growth_tracker() == 1);
    }
  }
}

TEST_CASE("the scale grows after growth_interval clean steps", "[amp][grad_scaler]") {
  SECTION("interval 3") {
    GradScaler scaler(GradScalerOptions{.init_scale = 8.0, .growth_interval = 3});
    auto w = param({2}, 0.0);
    torch::optim::SGD opt({w}, torch::optim::SGDOptions(1.0));
    scaler.scale(at::ones({}));
    std::vector<double> scales;
    std::vector<int64_t> trackers;
    for (int i = 0; i < 7; ++i) {
      CHECK(iterate(scaler, opt, 1.0));
      scales.push_back(scaler.get_scale());
      trackers.push_back(scaler.get_growth_tracker());
    }
    CHECK(scales == std::vector<double>{8, 8, 16, 16, 16, 32, 32});
    CHECK(trackers == std::vector<int64_t>{1, 2, 0, 1, 2, 0, 1});
    // An inf resets the count: two clean steps after it are not enough.
    CHECK_FALSE(iterate(scaler, opt, kInf));
    CHECK(scaler.get_scale() == 16.0);
    CHECK(iterate(scaler, opt, 1.0));
    CHECK(iterate(scaler, opt, 1.0));
    CHECK(scaler.get_scale() == 16.0);
    CHECK(scaler.get_growth_tracker() == 2);
  }
  SECTION("the default interval, 2000") {
    GradScaler scaler;
    auto w = param({1}, 0.0);
    torch::optim::SGD opt({w}, torch::optim::SGDOptions(1e-9));
    scaler.scale(at::ones({}));
    for (int i = 0; i < 1999; ++i) iterate(scaler, opt, 1.0);
    CHECK(scaler.get_scale() == 65536.0);
    CHECK(scaler.get_growth_tracker() == 1999);
    CHECK(iterate(scaler, opt, 1.0));
    CHECK(scaler.get_scale() == 131072.0);
    CHECK(scaler.get_growth_tracker() == 0);
  }
  SECTION("a scale near FLT_MAX never becomes inf") {
    const double big = std::ldexp(1.0, 127);  // 2^127; x2 overflows f32
    GradScaler scaler(GradScalerOptions{.init_scale = big, .growth_interval = 1});
    auto w = param({1}, 0.0);
    torch::optim::SGD opt({w}, torch::optim::SGDOptions(1e-9));
    scaler.scale(at::ones({}));
    for (int i = 0; i < 3; ++i) {
      CHECK(iterate(scaler, opt, 1.0));
      CHECK(scaler.get_scale() == big);
      CHECK(std::isfinite(scaler.get_scale()));
      CHECK(scaler.get_growth_tracker() == 0);
    }
    scaler.update(static_cast<double>(FLT_MAX));
    CHECK(iterate(scaler, opt, 1.0));
    CHECK(scaler.get_scale() == static_cast<double>(FLT_MAX));
  }
  SECTION("no lower bound: the scale may fall below 1") {
    GradScaler scaler(GradScalerOptions{.init_scale = 1.0});
    auto w = param({1}, 0.0);
    torch::optim::SGD opt({w}, torch::optim::SGDOptions(1.0));
    scaler.scale(at::ones({}));
    CHECK_FALSE(iterate(scaler, opt, kNan));
    CHECK_FALSE(iterate(scaler, opt, kNan));
    CHECK(scaler.get_scale() == 0.25);
  }
}

TEST_CASE("misuse raises loom::Error with torch's texts", "[amp][grad_scaler]") {
  GradScaler scaler;
  auto w = param({2}, 0.0);
  torch::optim::SGD opt({w}, torch::optim::SGDOptions(1.0));

  SECTION("before the first scale()") {
    CHECK_THROWS_WITH(scaler.unscale_(opt), Contains("Attempted unscale_ before any scale()"));
    CHECK_THROWS_WITH(scaler.step(opt), Contains("Attempted step before any scale()"));
    CHECK_THROWS_WITH(scaler.update(), Contains("Attempted update before any scale()"));
    CHECK_THROWS_WITH(scaler.update(2.0), Contains("Attempted update before any scale()"));
  }

  scaler.scale(at::ones({}));
  set_grad(w, at::ones({2}));

  SECTION("unscale twice") {
    scaler.unscale_(opt);
    CHECK_THROWS_AS(scaler.unscale_(opt), loom::Error);
    CHECK_THROWS_WITH(scaler.unscale_(opt),
                      Contains("unscale_() has already been called on this optimizer since the "
                               "last update()."));
    CHECK(at::equal(w.grad(), at::full({2}, 1.0 / 65536)));  // unscaled once only
    CHECK(scaler.step(opt));  // the explicit unscale_ is enough for step
  }
  SECTION("unscale after step") {
    scaler.step(opt);
    CHECK_THROWS_WITH(scaler.unscale_(opt), Contains("unscale_() is being called after step()."));
  }
  SECTION("step twice") {
    scaler.step(opt);
    auto w1 = w.detach().clone();
    CHECK_THROWS_WITH(scaler.step(opt),
                      Contains("step() has already been called since the last update()."));
    CHECK(at::equal(w, w1));
    scaler.update();
    CHECK(scaler.step(opt));  // allowed again after update
  }
  SECTION("update without any step or unscale") {
    CHECK_THROWS_WITH(scaler.update(), Contains("No inf checks were recorded prior to update."));
    CHECK(scaler.get_scale() == 65536.0);
  }
  SECTION("step with no gradients") {
    w.mutable_grad() = at::Tensor();
    CHECK_THROWS_WITH(scaler.step(opt),
                      Contains("No inf checks were recorded for this optimizer."));
  }
  SECTION("fp16 gradients") {
    auto h = param({2}, 0.0, at::kHalf);
    torch::optim::SGD half_opt({w, h}, torch::optim::SGDOptions(1.0));
    set_grad(h, at::full({2}, 2.0, at::TensorOptions(at::kHalf)));
    CHECK_THROWS_WITH(scaler.unscale_(half_opt), Contains("Attempting to unscale FP16 gradients."));
    CHECK_THROWS_WITH(scaler.step(half_opt), Contains("Attempting to unscale FP16 gradients."));
    CHECK(scaler.stage(half_opt) == Stage::Ready);
    CHECK(at::equal(w.grad(), at::ones({2})));  // nothing was unscaled before the throw
  }
  SECTION("sparse gradients") {
    auto sparse = at::ones({2}).to_sparse();
    set_grad(w, sparse);
    CHECK_THROWS_WITH(scaler.step(opt), Contains("sparse gradients are not supported"));
  }
  SECTION("a closure while enabled") {
    int calls = 0;
    CHECK_THROWS_WITH(scaler.step(opt,
                                  [&] {
                                    ++calls;
                                    return at::zeros({});
                                  }),
                      Contains("Closure use is not currently supported if GradScaler is enabled."));
    CHECK(calls == 0);
  }
  SECTION("messages name the class and method") {
    CHECK_THROWS_WITH(scaler.update(), Contains("loom::amp::GradScaler::update: "));
  }
}

TEST_CASE("GradScaler stages follow unscale_, step and update", "[amp][grad_scaler]") {
  GradScaler scaler;
  auto w = param({2}, 0.0);
  torch::optim::SGD opt({w}, torch::optim::SGDOptions(1.0));
  CHECK(scaler.stage(opt) == Stage::Ready);
  scaler.scale(at::ones({}));
  set_grad(w, at::ones({2}));
  scaler.unscale_(opt);
  CHECK(scaler.stage(opt) == Stage::Unscaled);
  scaler.step(opt);
  CHECK(scaler.stage(opt) == Stage::Stepped);
  scaler.update(1024.0);  // a manual scale also resets every optimizer
  CHECK(scaler.stage(opt) == Stage::Ready);
  CHECK(scaler.get_scale() == 1024.0);
  CHECK(scaler.get_growth_tracker() == 0);
}

TEST_CASE("state_dict has torch's five keys and round-trips", "[amp][grad_scaler]") {
  GradScaler scaler(GradScalerOptions{.init_scale = 1024.0, .growth_interval = 4});
  auto w = param({2}, 0.0);
  torch::optim::SGD opt({w}, torch::optim::SGDOptions(1.0));
  scaler.scale(at::ones({}));
  iterate(scaler, opt, kInf);
  iterate(scaler, opt, 1.0);
  iterate(scaler, opt, 1.0);

  auto sd = scaler.state_dict();
  std::vector<std::string> keys;
  for (const auto& kv : sd) keys.push_back(kv.first);
  CHECK(keys == std::vector<std::string>{"_growth_tracker", "backoff_factor", "growth_factor",
                                         "growth_interval", "scale"});
  REQUIRE(sd.at("scale").isDouble());
  REQUIRE(sd.at("growth_factor").isDouble());
  REQUIRE(sd.at("backoff_factor").isDouble());
  REQUIRE(sd.at("growth_interval").isInt());
  REQUIRE(sd.at("_growth_tracker").isInt());
  CHECK(sd.at("scale").toDouble() == 512.0);
  CHECK(sd.at("growth_factor").toDouble() == 2.0);
  CHECK(sd.at("backoff_factor").toDouble() == 0.5);
  CHECK(sd.at("growth_interval").toInt() == 4);
  CHECK(sd.at("_growth_tracker").toInt() == 2);

  auto same = [](const loom::StateDict& a, const loom::StateDict& b) {
    if (a.size() != b.size()) return false;
    for (const auto& kv : a) {
      auto it = b.find(kv.first);
      if (it == b.end() || kv.second.tagKind() != it->second.tagKind()) return false;
      if (kv.second.isDouble() && kv.second.toDouble() != it->second.toDouble()) return false;
      if (kv.second.isInt() && kv.second.toInt() != it->second.toInt()) return false;
    }
    return true;
  };

  SECTION("round trip into a fresh scaler, before its first scale()") {
    GradScaler other;
    other.load_state_dict(sd);
    CHECK(same(other.state_dict(), sd));
    CHECK_FALSE(other.has_scale_tensor());
    CHECK(other.get_scale() == 512.0);
    CHECK(other.get_growth_tracker() == 2);
    CHECK(other.options().growth_interval == 4);
    CHECK(other.options().init_scale == 512.0);
    // The loaded values are honoured when the tensors are created: two more clean steps reach
    // the interval of 4 and the scale doubles.
    auto out = other.scale(at::full({}, 3.0));
    CHECK(out.item<float>() == 1536.0f);
    auto v = param({2}, 0.0);
    torch::optim::SGD opt2({v}, torch::optim::SGDOptions(1.0));
    CHECK(iterate(other, opt2, 1.0));
    CHECK(other.get_growth_tracker() == 3);
    CHECK(iterate(other, opt2, 1.0));
    CHECK(other.get_scale() == 1024.0);
    CHECK(other.get_growth_tracker() == 0);
  }
  SECTION("loading fills the live tensors") {
    GradScaler other(GradScalerOptions{.init_scale = 8.0});
    other.scale(at::ones({}));
    other.load_state_dict(sd);
    CHECK(same(other.state_dict(), sd));
    CHECK(other.scale(at::full({}, 1.0)).item<float>() == 512.0f);
  }
  SECTION("an empty state dict is an error") {
    GradScaler other;
    CHECK_THROWS_WITH(other.load_state_dict({}),
                      Contains("The source state dict is empty, possibly because it was saved "
                               "from a disabled instance of GradScaler."));
  }
  SECTION("missing, unknown and mistyped keys are errors, and change nothing") {
    GradScaler other;
    auto missing = sd;
    missing.erase("_growth_tracker");
    CHECK_THROWS_WITH(
        other.load_state_dict(missing),
        Equals("loom::amp::GradScaler::load_state_dict: missing key \"_growth_tracker\""));
    auto unknown = sd;
    unknown["growth_tracker"] = c10::IValue(int64_t{0});
    CHECK_THROWS_WITH(
        other.load_state_dict(unknown),
        Equals("loom::amp::GradScaler::load_state_dict: unexpected key(s) \"growth_tracker\""));
    auto mistyped = sd;
    mistyped["growth_interval"] = c10::IValue(4.0);
    CHECK_THROWS_WITH(other.load_state_dict(mistyped),
                      Equals("loom::amp::GradScaler::load_state_dict: key \"growth_interval\": "
                             "expected an int, got a float"));
    auto invalid = sd;
    invalid["backoff_factor"] = c10::IValue(2.0);
    CHECK_THROWS_WITH(other.load_state_dict(invalid),
                      Contains("load_state_dict: backoff_factor must be in (0, 1)"));
    CHECK(other.get_scale() == 65536.0);
    CHECK(other.options().backoff_factor == 0.5);
  }
  SECTION("an integer scale is accepted") {
    auto integral = sd;
    integral["scale"] = c10::IValue(int64_t{256});
    GradScaler other;
    other.load_state_dict(integral);
    CHECK(other.get_scale() == 256.0);
  }
}

TEST_CASE("two optimizers skip on their own found_inf and one update combines them",
          "[amp][grad_scaler]") {
  GradScaler scaler(GradScalerOptions{.growth_interval = 2});
  auto a = param({2}, 1.0);
  auto b = param({2}, 1.0);
  torch::optim::SGD opt_a({a}, torch::optim::SGDOptions(1.0));
  torch::optim::SGD opt_b({b}, torch::optim::SGDOptions(1.0));
  scaler.scale(at::ones({}));

  SECTION("one overflows") {
    set_grad(a, at::full({2}, kInf));
    set_grad(b, at::full({2}, 65536.0));
    CHECK_FALSE(scaler.step(opt_a));
    CHECK(scaler.step(opt_b));
    CHECK(at::equal(a, at::ones({2})));
    CHECK(at::equal(b, at::zeros({2})));
    CHECK(scaler.stage(opt_a) == Stage::Stepped);
    CHECK(scaler.stage(opt_b) == Stage::Stepped);
    scaler.update();
    CHECK(scaler.get_scale() == 32768.0);
    CHECK(scaler.get_growth_tracker() == 0);
    CHECK(scaler.stage(opt_a) == Stage::Ready);
    CHECK(scaler.stage(opt_b) == Stage::Ready);
  }
  SECTION("both overflow: one backoff, not two") {
    set_grad(a, at::full({2}, kNan));
    set_grad(b, at::full({2}, kInf));
    CHECK_FALSE(scaler.step(opt_a));
    CHECK_FALSE(scaler.step(opt_b));
    scaler.update();
    CHECK(scaler.get_scale() == 32768.0);
  }
  SECTION("both clean: the tracker counts iterations, not optimizers") {
    for (int i = 0; i < 2; ++i) {
      set_grad(a, at::full({2}, 1.0));
      set_grad(b, at::full({2}, 1.0));
      CHECK(scaler.step(opt_a));
      CHECK(scaler.step(opt_b));
      scaler.update();
      if (i == 0) CHECK(scaler.get_growth_tracker() == 1);
    }
    CHECK(scaler.get_scale() == 131072.0);
  }
  SECTION("an optimizer only unscaled still counts in update") {
    set_grad(a, at::full({2}, kInf));
    set_grad(b, at::full({2}, 1.0));
    scaler.unscale_(opt_a);  // e.g. clipped, then the step was abandoned
    CHECK(scaler.step(opt_b));
    scaler.update();
    CHECK(scaler.get_scale() == 32768.0);
  }
}

TEST_CASE("A disabled GradScaler is a plain optimizer step", "[amp][grad_scaler]") {
  GradScaler scaler(GradScalerOptions{.enabled = false});
  auto w = param({2}, 1.0);
  torch::optim::SGD opt({w}, torch::optim::SGDOptions(1.0));
  CHECK_FALSE(scaler.is_enabled());
  CHECK(scaler.get_scale() == 1.0);
  CHECK(scaler.get_growth_tracker() == 0);

  auto loss = at::full({}, 3.0);
  CHECK(scaler.scale(loss).is_same(loss));
  auto many = scaler.scale(std::vector<at::Tensor>{loss});
  REQUIRE(many.size() == 1);
  CHECK(many[0].is_same(loss));
  CHECK_FALSE(scaler.has_scale_tensor());
  CHECK_FALSE(scaler.scale_device().has_value());

  set_grad(w, at::full({2}, 0.5));
  scaler.unscale_(opt);  // no-op
  CHECK(at::equal(w.grad(), at::full({2}, 0.5)));
  CHECK(scaler.stage(opt) == Stage::Ready);
  CHECK(scaler.step(opt));
  CHECK(at::equal(w, at::full({2}, 0.5)));
  CHECK(scaler.step(opt));  // no stage tracking, so no "step twice" error
  scaler.update();
  scaler.update(4.0);
  CHECK(scaler.get_scale() == 1.0);

  int calls = 0;
  CHECK(scaler.step(opt, [&] {
    ++calls;
    return at::zeros({});
  }));
  CHECK(calls == 1);

  CHECK(scaler.state_dict().empty());
  CHECK_NOTHROW(scaler.load_state_dict({}));
  GradScaler enabled;
  scaler.load_state_dict(enabled.state_dict());  // ignored
  CHECK(scaler.get_scale() == 1.0);
}

TEST_CASE("Copies of a GradScaler own their scale", "[amp][grad_scaler]") {
  GradScaler scaler(GradScalerOptions{.init_scale = 64.0, .growth_interval = 1});
  auto w = param({2}, 0.0);
  torch::optim::SGD opt({w}, torch::optim::SGDOptions(1.0));
  scaler.scale(at::ones({}));
  set_grad(w, at::ones({2}));
  scaler.unscale_(opt);

  GradScaler copy = scaler;
  CHECK(copy.stage(opt) == Stage::Unscaled);
  scaler.step(opt);
  scaler.update();
  CHECK(scaler.get_scale() == 128.0);
  CHECK(copy.get_scale() == 64.0);
  CHECK(copy.stage(opt) == Stage::Unscaled);

  GradScaler assigned;
  assigned = copy;
  copy.update(2.0);
  CHECK(assigned.get_scale() == 64.0);
  GradScaler moved = std::move(assigned);
  CHECK(moved.get_scale() == 64.0);
  CHECK(moved.has_scale_tensor());
}
