// 16-mixed with loom's fused optimizers: no host sync in the step (counted on the ops that
// sync), skipping on inf/nan on the device, clipping, and the StepResult read once.
#include "support/catch.hpp"
#include "support/sync_counter.hpp"
#include "support/warnings.hpp"

#include <atomic>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <loom/loom.hpp>

namespace {

using loom::testing::SyncCounter;

/// A runtime whose first scale (256) does not overflow fp16 for these small models.
loom::Runtime<loom::Cpu, loom::Fp16Mixed> runtime() {
  loom::amp::GradScalerOptions o;
  o.init_scale = 256.0;
  return loom::Runtime<loom::Cpu, loom::Fp16Mixed>(loom::Cpu{}, loom::Fp16Mixed(o));
}

torch::nn::Linear model() {
  torch::manual_seed(3);
  return torch::nn::Linear(4, 3);
}

/// The host reads in one forward + backward (+ clip at `clip` > 0) + step, after two warm steps.
template <class Optimizer>
int syncs_in_one_step(Optimizer& opt, torch::nn::Linear& m,
                      loom::Runtime<loom::Cpu, loom::Fp16Mixed>& rt, const at::Tensor& x,
                      double clip = 0.0) {
  rt.setup(m, opt);
  for (int i = 0; i < 2; ++i) {  // warm: the scale tensor and the state exist
    opt.zero_grad();
    rt.backward(rt.forward(m, x).sum(), m);
    rt.clip_gradients(opt, clip);
    rt.optimizer_step(opt).applied();
  }
  opt.zero_grad();
  SyncCounter counter;
  rt.backward(rt.forward(m, x).sum(), m);
  auto norm = rt.clip_gradients(opt, clip);
  auto result = rt.optimizer_step(opt);
  return SyncCounter::count();
}

}  // namespace

TEST_CASE("A 16-mixed step with a loom::optim optimizer makes no host sync", "[optim][amp]") {
  loom::testing::WarningCatcher quiet;  // fp16 on the CPU warns once
  auto x = at::randn({8, 4});
  {
    auto m = model();
    loom::optim::Adam opt(m->parameters(), loom::optim::AdamOptions(1e-2));
    auto rt = runtime();
    CHECK(syncs_in_one_step(opt, m, rt, x) == 0);
  }
  {
    auto m = model();
    loom::optim::SGD opt(m->parameters(), loom::optim::SGDOptions(1e-2).momentum(0.9));
    auto rt = runtime();
    CHECK(syncs_in_one_step(opt, m, rt, x) == 0);
  }
  {  // LibTorch's optimizer: the scaler must read found_inf on the host
    auto m = model();
    torch::optim::Adam opt(m->parameters(), torch::optim::AdamOptions(1e-2));
    auto rt = runtime();
    CHECK(syncs_in_one_step(opt, m, rt, x) >= 1);
  }
}

TEST_CASE("Backward, clip and a fused 16-mixed step make no host sync", "[optim][amp][clip]") {
  loom::testing::WarningCatcher quiet;
  auto x = at::randn({8, 4});
  {
    auto m = model();
    loom::optim::AdamW opt(m->parameters(), loom::optim::AdamWOptions(1e-2));
    auto rt = runtime();
    CHECK(syncs_in_one_step(opt, m, rt, x, /*clip=*/0.1) == 0);
  }
  {
    auto m = model();
    loom::optim::SGD opt(m->parameters(), loom::optim::SGDOptions(1e-2).momentum(0.9));
    auto rt = runtime();
    CHECK(syncs_in_one_step(opt, m, rt, x, /*clip=*/0.1) == 0);
  }
  {  // the clip actually clipped: the norm, read afterwards, is above the threshold
    auto m = model();
    loom::optim::AdamW opt(m->parameters(), loom::optim::AdamWOptions(1e-2));
    auto rt = runtime();
    rt.setup(m, opt);
    rt.backward(rt.forward(m, x).sum(), m);
    SyncCounter counter;
    const loom::GradNorm norm = rt.clip_gradients(opt, 0.1);
    CHECK_FALSE(norm.known());
    CHECK(SyncCounter::count() == 0);
    CHECK(norm.tensor().dim() == 0);
    CHECK(norm.value() > 0.1);
    CHECK(SyncCounter::count() == 1);
    CHECK(norm.known());
    CHECK(static_cast<double>(norm) == norm.value());
    CHECK(SyncCounter::count() == 1);  // read once
    double after = 0;
    for (const auto& p : m->parameters()) after += p.grad().pow(2).sum().item<double>();
    CHECK(std::sqrt(after) == Approx(0.1).epsilon(1e-4));
  }
}

TEST_CASE("Clipping equals a C++ transcription of clip_grad_norm_(foreach=True), bit for bit",
          "[optim][clip]") {
  // Not Python itself: Python's arithmetic written out here with ATen calls (per-tensor norms,
  // the norm of their stack, coef = (norm + 1e-6).reciprocal() * max_norm, Tensor.__rtruediv__,
  // clamped to 1), for f32 gradients from a module's backward. The comparison with Python's
  // own clip_grad_norm_ (dtypes, groups, non-finite norms) is clip_grad_parity_test.cpp, run
  // by ctest as optim.clip_grad_parity; this one needs no Python.
  for (double norm_type : {2.0, 1.0, 3.0, std::numeric_limits<double>::infinity()}) {
    INFO("norm_type " << norm_type);
    torch::manual_seed(11);
    torch::nn::Linear m(16, 8);
    loom::optim::AdamW opt(m->parameters(), loom::optim::AdamWOptions(1e-2));
    loom::Runtime<loom::Cpu, loom::Fp32> rt;
    rt.setup(m, opt);
    rt.backward(rt.forward(m, at::randn({32, 16})).pow(2).sum(), m);
    std::vector<at::Tensor> grads, norms;
    for (const auto& p : m->parameters()) {
      grads.push_back(p.grad().clone());
      norms.push_back(at::linalg_vector_norm(p.grad(), norm_type));
    }
    const at::Tensor total = at::linalg_vector_norm(at::stack(norms), norm_type);
    const at::Tensor coef = at::clamp_max((total + 1e-6).reciprocal() * 0.25, 1.0);
    const loom::GradNorm got = rt.clip_gradients(opt, 0.25, norm_type);
    CHECK(got.tensor().scalar_type() == at::kFloat);
    CHECK(at::equal(got.tensor(), total));
    auto params = m->parameters();
    for (std::size_t i = 0; i < params.size(); ++i) {
      CHECK(at::equal(params[i].grad(), grads[i] * coef));
    }
  }
}

TEST_CASE("error_if_nonfinite reads the norm and refuses a non-finite one", "[optim][clip]") {
  torch::manual_seed(2);
  torch::nn::Linear m(4, 2);
  loom::optim::SGD opt(m->parameters(), loom::optim::SGDOptions(1e-2));
  loom::Runtime<loom::Cpu, loom::Fp32> rt;
  rt.setup(m, opt);
  rt.backward(rt.forward(m, at::randn({3, 4})).sum(), m);
  {
    SyncCounter counter;
    const auto norm = rt.clip_gradients(opt, 1e6, 2.0, /*error_if_nonfinite=*/true);
    CHECK(SyncCounter::count() == 1);  // the check read it
    CHECK(norm.known());
    CHECK(std::isfinite(norm.value()));
  }
  m->weight.mutable_grad().view({-1})[1].fill_(std::numeric_limits<float>::quiet_NaN());
  CHECK_THROWS_WITH(rt.clip_gradients(opt, 1.0, 2.0, true),
                    Catch::Contains("total norm of order 2 of the gradients is non-finite (nan)"));
  CHECK(std::isnan(rt.clip_gradients(opt, 1.0).value()));  // off: no error, a nan norm
}

TEST_CASE("Reading a fused 16-mixed StepResult is one sync, once", "[optim][amp]") {
  loom::testing::WarningCatcher quiet;
  auto m = model();
  loom::optim::AdamW opt(m->parameters(), loom::optim::AdamWOptions(1e-2));
  auto rt = runtime();
  rt.setup(m, opt);
  rt.backward(rt.forward(m, at::randn({8, 4})).sum(), m);
  auto result = rt.optimizer_step(opt);
  CHECK_FALSE(result.known());
  REQUIRE(result.found_inf().defined());
  SyncCounter counter;
  CHECK(result.applied());
  CHECK(SyncCounter::count() == 1);
  CHECK(result.known());
  CHECK(static_cast<bool>(result));
  CHECK(SyncCounter::count() == 1);
}

TEST_CASE("A fused 16-mixed step with inf gradients is skipped on the device", "[optim][amp]") {
  loom::testing::WarningCatcher quiet;
  auto m = model();
  loom::optim::Adam opt(m->parameters(), loom::optim::AdamOptions(1e-2));
  auto rt = runtime();
  rt.setup(m, opt);
  auto x = at::randn({8, 4});
  rt.backward(rt.forward(m, x).sum(), m);
  REQUIRE(rt.optimizer_step(opt).applied());
  const auto w = m->weight.detach().clone();
  const double scale = rt.precision().loss_scale();
  opt.zero_grad();
  rt.backward(rt.forward(m, x).sum(), m);
  m->weight.mutable_grad().view({-1})[0].fill_(std::numeric_limits<float>::infinity());
  auto result = rt.optimizer_step(opt);
  CHECK_FALSE(result.applied());
  CHECK(at::equal(m->weight.detach(), w));
  CHECK(rt.precision().loss_scale() == scale * 0.5);
  auto& s =
      static_cast<loom::optim::AdamParamState&>(*opt.state().at(m->weight.unsafeGetTensorImpl()));
  CHECK(s.step().item<float>() == 1.f);  // the skipped step did not count
}

TEST_CASE("Clipping under 16-mixed unscales once, then the fused step takes no scale",
          "[optim][amp]") {
  loom::testing::WarningCatcher quiet;
  auto m = model();
  loom::optim::Adam opt(m->parameters(), loom::optim::AdamOptions(1e-2));
  auto rt = runtime();
  rt.setup(m, opt);
  rt.backward(rt.forward(m, at::randn({8, 4})).sum() * 2, m);
  rt.clip_gradients(opt, 0.5);
  // The reference: a plain Adam step on the clipped, unscaled gradients.
  std::vector<at::Tensor> ref;
  for (const auto& p : m->parameters()) {
    auto r = p.detach().clone().requires_grad_();
    r.mutable_grad() = p.grad().clone();
    ref.push_back(r);
  }
  double norm = 0;
  for (const auto& r : ref) norm += r.grad().pow(2).sum().item<double>();
  CHECK(std::sqrt(norm) <= 0.5 + 1e-6);  // clipped true gradients, not scaled ones
  loom::optim::Adam plain(ref, loom::optim::AdamOptions(1e-2));
  plain.step();
  REQUIRE(rt.optimizer_step(opt).applied());
  auto params = m->parameters();
  for (std::size_t i = 0; i < params.size(); ++i)
    CHECK(at::equal(params[i].detach(), ref[i].detach()));
}
