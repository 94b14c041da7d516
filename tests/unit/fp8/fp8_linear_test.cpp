// loom::fp8::scaled_mm and fp8::linear on the CPU (_scaled_mm's emulated kernel): the forward
// product and both gradients against an fp64 reference, element by element within a bound
// derived from the formats (docs/fp8.md), with outliers, zeros, inf/nan, padding and
// non-contiguous inputs.
#include "support/catch.hpp"
#include "support/fp8_casts.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <loom/fp8/linear.hpp>

namespace {

using Catch::Contains;
using loom::fp8::Scaling;

struct Format {
  double u;  // unit roundoff of a normal number: 2^-(mantissa bits + 1)
  double d;  // half the subnormal spacing, in scaled units
  double top;
};

Format format(c10::ScalarType f) {
  return f == c10::kFloat8_e4m3fn ? Format{std::ldexp(1.0, -4), std::ldexp(1.0, -10), 448.0}
                                  : Format{std::ldexp(1.0, -3), std::ldexp(1.0, -17), 57344.0};
}

// |error| of casting t (fp64, (rows, k)) to `f` and back: u |t| + d / scale, plus the fp32
// rounding of the scale and of t * scale.
at::Tensor cast_error(const at::Tensor& t, c10::ScalarType f, Scaling s) {
  const Format fm = format(f);
  const at::Tensor amax =
      (s == Scaling::Tensorwise ? t.abs().amax() : t.abs().amax({1}, true)).clamp_min(1e-12);
  return t.abs() * (fm.u + std::ldexp(1.0, -21)) + amax / fm.top * fm.d;
}

// The bound on |scaled_mm(a, b) - a @ b^T| for a (m, k) and b (n, k) in fp64.
at::Tensor bound(const at::Tensor& a, const at::Tensor& b, c10::ScalarType fa, c10::ScalarType fb,
                 Scaling s, c10::ScalarType out) {
  const at::Tensor ea = cast_error(a, fa, s), eb = cast_error(b, fb, s);
  const at::Tensor core = ea.mm(b.abs().t()) + a.abs().mm(eb.t()) + ea.mm(eb.t());
  // fp32 products and sums of the dequantised operands.
  const at::Tensor accum = (a.abs() + ea).mm((b.abs() + eb).t()) *
                           (2.0 * static_cast<double>(a.size(1) + 2) * std::ldexp(1.0, -24));
  const double out_u = out == c10::kBFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -24);
  return core + accum + (a.mm(b.t()).abs() + core + accum) * out_u;
}

// Largest |got - want| / bound; at most 1 when every element keeps its bound.
double worst(const at::Tensor& got, const at::Tensor& want, const at::Tensor& b) {
  return ((got.to(at::kDouble) - want).abs() / (b + 1e-300)).max().item<double>();
}

double relative(const at::Tensor& got, const at::Tensor& want) {
  return ((got.to(at::kDouble) - want).norm() / want.norm()).item<double>();
}

struct Run {
  at::Tensor y, dx, dw;
};

// fp8::linear forward and backward with upstream gradient g (exactly representable in bf16,
// the output's dtype).
Run run(const at::Tensor& x, const at::Tensor& w, const at::Tensor& g,
        const loom::fp8::LinearRecipe& r) {
  auto xv = x.detach().clone().requires_grad_();
  auto wv = w.detach().clone().requires_grad_();
  auto y = loom::fp8::linear(xv, wv, at::Tensor(), r);
  (y.to(at::kFloat) * g).sum().backward();
  return {y.detach(), xv.grad(), wv.grad()};
}

struct Case {
  std::string name;
  at::Tensor x, w, g;
};

std::vector<Case> cases() {
  at::manual_seed(3);
  const int64_t m = 40, k = 48, n = 32;  // m: not a multiple of 16 (dW's k is padded)
  auto g = at::randn({m, n}).to(at::kBFloat16).to(at::kFloat);
  std::vector<Case> out;
  out.push_back({"normal", at::randn({m, k}), at::randn({n, k}) * 0.05, g});
  auto xo = at::randn({m, k});
  xo[3][5] = 1e5;  // an activation outlier: the other values of its scale lose precision
  auto wo = at::randn({n, k}) * 0.05;
  wo[1][2] = -40.0;
  out.push_back({"outliers", xo, wo, g * 1e-3});
  out.push_back({"tiny", at::randn({m, k}) * 1e-6, at::randn({n, k}) * 1e-5, g * 1e-8});
  return out;
}

}  // namespace

TEST_CASE("fp8 linear: the forward and both gradients keep the formats' bound", "[fp8]") {
  for (const Scaling s : {Scaling::Tensorwise, Scaling::Rowwise}) {
    for (const auto& c : cases()) {
      INFO(c.name << (s == Scaling::Tensorwise ? " tensorwise" : " rowwise"));
      const auto r = run(c.x, c.w, c.g, {s});
      CHECK(r.y.scalar_type() == at::kBFloat16);
      CHECK(r.dx.scalar_type() == at::kFloat);
      CHECK(r.dw.scalar_type() == at::kFloat);
      const auto x = c.x.to(at::kDouble), w = c.w.to(at::kDouble), g = c.g.to(at::kDouble);
      const auto e4 = c10::kFloat8_e4m3fn, e5 = c10::kFloat8_e5m2;
      const auto dw_out = s == Scaling::Tensorwise ? c10::kFloat : c10::kBFloat16;
      CHECK(worst(r.y, x.mm(w.t()), bound(x, w, e4, e4, s, c10::kBFloat16)) <= 1.0);
      CHECK(worst(r.dx, g.mm(w), bound(g, w.t(), e5, e4, s, c10::kBFloat16)) <= 1.0);
      CHECK(worst(r.dw, g.t().mm(x), bound(g.t(), x.t(), e5, e4, s, dw_out)) <= 1.0);
      // fp8, not a wider type: the forward's error is well past bf16 rounding (2^-8).
      CHECK(relative(r.y, x.mm(w.t())) > 0.01);
    }
  }
}

TEST_CASE("fp8 linear: row-wise scales keep an outlier from costing its neighbours", "[fp8]") {
  const auto c = cases()[1];
  const auto x = c.x.to(at::kDouble), w = c.w.to(at::kDouble);
  const auto want = x.mm(w.t());
  const auto tw = run(c.x, c.w, c.g, {Scaling::Tensorwise}).y;
  const auto rw = run(c.x, c.w, c.g, {Scaling::Rowwise}).y;
  // Rows of x without the outlier, columns of w without its outlier.
  auto rows = at::ones({x.size(0)}, at::kBool);
  rows[3] = false;
  auto cols = at::ones({w.size(0)}, at::kBool);
  cols[1] = false;
  auto part = [&](const at::Tensor& t) {
    return t.index({rows}).index({at::indexing::Slice(), cols});
  };
  CHECK(relative(part(rw), part(want)) * 3 < relative(part(tw), part(want)));
}

TEST_CASE("fp8 linear: zeros stay zero, padding and strides change nothing", "[fp8]") {
  const auto zero = run(at::zeros({20, 32}), at::zeros({16, 32}), at::ones({20, 16}), {});
  CHECK(zero.y.count_nonzero().item<int64_t>() == 0);
  CHECK(zero.dx.count_nonzero().item<int64_t>() == 0);
  CHECK(zero.dw.count_nonzero().item<int64_t>() == 0);
  CHECK_FALSE(zero.y.isnan().any().item<bool>());

  at::manual_seed(5);
  const auto base = at::randn({48, 40});
  const auto x = base.t();  // (40, 48), not contiguous
  REQUIRE_FALSE(x.is_contiguous());
  const auto w = at::randn({24, 48}), g = at::randn({40, 24}).to(at::kBFloat16).to(at::kFloat);
  for (const Scaling s : {Scaling::Tensorwise, Scaling::Rowwise}) {
    const auto a = run(x, w, g, {s}), b = run(x.contiguous(), w, g, {s});
    CHECK(a.y.equal(b.y));
    CHECK(a.dx.equal(b.dx));
    CHECK(a.dw.equal(b.dw));
  }
  // k = 40 and n = 24 are padded to 48 and 32; 3-D inputs are (batch, seq, k).
  const auto y3 = loom::fp8::linear(x.reshape({4, 10, 48}), w, at::Tensor());
  CHECK(y3.sizes() == at::IntArrayRef({4, 10, 24}));
  CHECK(y3.reshape({40, 24}).equal(run(x, w, g, {}).y));
  const auto pad = loom::fp8::scaled_mm(at::randn({5, 40}), at::randn({24, 40}));
  CHECK(pad.sizes() == at::IntArrayRef({5, 24}));
}

TEST_CASE("fp8 quantize: one pass in the input's own dtype gives the fp32 formula's bits",
          "[fp8]") {
  at::manual_seed(13);
  const auto base = at::randn({48, 40}) * 3.0;
  base[7][2] = 700.0;  // clamped by e4m3's 448 once scaled by another row's amax
  loom::testing::for_each_fp8_cast(
      base, {at::kFloat, at::kBFloat16, at::kHalf, at::kDouble},
      [](const at::Tensor& t, Scaling s, c10::ScalarType f, const std::string& name) {
        INFO(name);
        // The formula: fp32, contiguous, amax, scale = top / amax, clamp, cast.
        const double top = loom::fp8::max_value(f);
        const auto x = t.to(at::kFloat).contiguous();
        const auto amax =
            (s == Scaling::Tensorwise ? x.abs().amax() : x.abs().amax({1}, true)).clamp_min(1e-12);
        const auto scale = at::reciprocal(amax).mul_(top);
        const auto want = x.mul(scale).clamp_(-top, top).to(f);
        const auto got = loom::fp8::quantize(t, f, s);
        CHECK(got.data.is_contiguous());
        CHECK(got.data.scalar_type() == f);
        CHECK(got.data.view(at::kByte).equal(want.view(at::kByte)));
        CHECK(got.inv_scale.equal(at::reciprocal(scale)));
      });
}

TEST_CASE("fp8 linear: one cast per operand gives three scaled_mm calls' bits", "[fp8]") {
  // Tensor-wise and delayed scales cast each operand once and reuse it, transposed, in the
  // backward products: the values must be those of three independent scaled_mm calls.
  at::manual_seed(17);
  struct Dims {
    int64_t m, k, n;
  };
  for (const Dims d : {Dims{40, 48, 32}, Dims{64, 32, 16}, Dims{40, 40, 24}, Dims{7, 20, 10}}) {
    for (const Scaling s : {Scaling::Tensorwise, Scaling::Delayed}) {
      INFO("m " << d.m << " k " << d.k << " n " << d.n << " scaling " << static_cast<int>(s));
      const auto x = at::randn({d.k, d.m}).t().to(at::kBFloat16);  // not contiguous, bf16
      const auto w = at::randn({d.n, d.k}) * 0.1;
      const auto g = at::randn({d.m, d.n}).to(at::kBFloat16).to(at::kFloat);
      loom::fp8::LinearRecipe r{s};
      // Delayed: two blocks in the same state, with scales other than 1.
      auto block = [&] {
        auto b = std::make_shared<loom::fp8::DelayedBlock>(
            loom::fp8::DelayedBlock::make(1, r.delayed, c10::kCPU));
        b->scale.copy_(at::tensor(std::vector<float>{20.0f, 3000.0f, 2e4f}).view({1, 3}));
        b->amax_history.select(0, 0).fill_(0.5);
        return b;
      };
      const auto mine = block(), theirs = block();
      auto xv = x.detach().clone().requires_grad_();
      auto wv = w.detach().clone().requires_grad_();
      const auto y = loom::fp8::linear(xv, wv, at::Tensor(), r, {mine, 0});
      (y.to(at::kFloat) * g).sum().backward();

      auto o = loom::fp8::detail::forward_options(r), ox = loom::fp8::detail::grad_input_options(r),
           ow = loom::fp8::detail::grad_weight_options(r);
      if (s == Scaling::Delayed) {
        o.a_slot = theirs->slot(0, loom::fp8::Operand::Input);
        o.b_slot = ow.b_slot = theirs->slot(0, loom::fp8::Operand::Weight);
        ox.a_slot = ow.a_slot = theirs->slot(0, loom::fp8::Operand::GradOutput);
        ox.b_slot = theirs->slot(0, loom::fp8::Operand::Weight);
        ow.b_slot = theirs->slot(0, loom::fp8::Operand::Input);
      }
      const auto dy = g.to(at::kBFloat16);
      CHECK(y.equal(loom::fp8::scaled_mm(x, w, o)));
      CHECK(xv.grad().equal(loom::fp8::scaled_mm(dy, w.t(), ox).to(at::kBFloat16)));
      CHECK(wv.grad().equal(loom::fp8::scaled_mm(dy.t(), x.t(), ow).to(at::kFloat)));
      CHECK(mine->amax_history.equal(theirs->amax_history));
      CHECK(xv.grad().scalar_type() == at::kBFloat16);
      CHECK(wv.grad().sizes() == w.sizes());
    }
  }
}

TEST_CASE("fp8 linear: inf and nan make their scale's outputs nan, never finite numbers", "[fp8]") {
  at::manual_seed(9);
  for (const double bad :
       {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    INFO(bad);
    auto x = at::randn({32, 32});
    x[4][7] = bad;
    const auto w = at::randn({16, 32});
    const auto tw = loom::fp8::linear(x, w, at::Tensor(), {Scaling::Tensorwise});
    CHECK(tw.isnan().all().item<bool>());
    const auto rw = loom::fp8::linear(x, w, at::Tensor(), {Scaling::Rowwise});
    CHECK(rw[4].isnan().all().item<bool>());
    CHECK(rw.isfinite().sum().item<int64_t>() == 31 * 16);
  }
  // A non-finite output gradient: every weight gradient nan under one scale per tensor.
  auto g = at::randn({32, 16});
  g[0][0] = std::numeric_limits<float>::infinity();
  const auto r = run(at::randn({32, 32}), at::randn({16, 32}), g, {});
  CHECK(r.dw.isnan().all().item<bool>());
  CHECK(r.dx.isnan().all().item<bool>());
}

TEST_CASE("fp8 linear: the bias, and the errors", "[fp8]") {
  at::manual_seed(11);
  auto x = at::randn({8, 32});
  auto w = at::randn({16, 32});
  auto bias = at::randn({16}).requires_grad_();
  const auto y = loom::fp8::linear(x, w, bias);
  CHECK(y.scalar_type() == at::kBFloat16);
  CHECK((y - loom::fp8::linear(x, w, at::Tensor()))
            .sub(bias.to(at::kBFloat16))
            .abs()
            .max()
            .item<float>() <= 0.0625f);
  y.to(at::kFloat).sum().backward();
  CHECK(bias.grad().scalar_type() == at::kFloat);
  CHECK(bias.grad().allclose(at::full({16}, 8.0f)));

  CHECK_THROWS_WITH(loom::fp8::linear(at::randn({4, 31}), w, at::Tensor()),
                    Contains("the input's last dimension must be the weight's second"));
  CHECK_THROWS_WITH(loom::fp8::scaled_mm(x, w, {c10::kFloat8_e5m2, c10::kFloat8_e5m2}),
                    Contains("e5m2 x e5m2 is not a product _scaled_mm runs"));
  CHECK_THROWS_WITH(loom::fp8::quantize(x, c10::kHalf, Scaling::Tensorwise),
                    Contains("Half is not an fp8 format loom casts to"));
}

TEST_CASE("fp8 linear: measured errors against the bound", "[.][fp8][errors]") {
  for (const Scaling s : {Scaling::Tensorwise, Scaling::Rowwise}) {
    for (const auto& c : cases()) {
      const auto r = run(c.x, c.w, c.g, {s});
      const auto x = c.x.to(at::kDouble), w = c.w.to(at::kDouble), g = c.g.to(at::kDouble);
      const auto e4 = c10::kFloat8_e4m3fn, e5 = c10::kFloat8_e5m2;
      const auto dw_out = s == Scaling::Tensorwise ? c10::kFloat : c10::kBFloat16;
      WARN((s == Scaling::Tensorwise ? "tensorwise " : "rowwise ")
           << c.name << ": y rel " << relative(r.y, x.mm(w.t())) << " worst/bound "
           << worst(r.y, x.mm(w.t()), bound(x, w, e4, e4, s, c10::kBFloat16)) << "; dx rel "
           << relative(r.dx, g.mm(w)) << " worst/bound "
           << worst(r.dx, g.mm(w), bound(g, w.t(), e5, e4, s, c10::kBFloat16)) << "; dw rel "
           << relative(r.dw, g.t().mm(x)) << " worst/bound "
           << worst(r.dw, g.t().mm(x), bound(g.t(), x.t(), e5, e4, s, dw_out)));
    }
  }
}
