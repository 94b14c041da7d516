// loom's optimizer table: the rows of LibTorch's and loom's optimizers, lookups of subclasses
// and of unknown optimizers, and a user's row as the device mover, the schedulers and 16-mixed
// read it.
#include "support/catch.hpp"
#include "support/warnings.hpp"

#include <memory>
#include <optional>
#include <string_view>
#include <typeindex>
#include <typeinfo>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <loom/loom.hpp>

using Catch::Matchers::Contains;
using loom::optim::AmpSupport;
using loom::optim::MomentumKind;

namespace {

/// The row of `opt`, which must exist.
const loom::optim::OptimizerInfo& row(const torch::optim::Optimizer& opt) {
  const auto* info = loom::optim::find_optimizer(opt);
  REQUIRE(info != nullptr);
  return *info;
}

/// LibTorch's SGD that takes the scaler's tensors itself (AmpSupport::Fused): it reads the
/// flag and divides by the scale on the host, which a real fused optimizer does on the device.
struct ScaleTakingSGD : torch::optim::SGD {
  using torch::optim::SGD::SGD;
  std::optional<at::Tensor> grad_scale, found_inf;
  int set_amp_calls = 0;

  using torch::optim::SGD::step;
  at::Tensor step(LossClosure closure = nullptr) override {
    if (found_inf && found_inf->item<float>() != 0.0f) return {};
    if (grad_scale) {
      at::NoGradGuard no_grad;
      for (auto& p : param_groups()[0].params()) p.mutable_grad().div_(*grad_scale);
    }
    return torch::optim::SGD::step(std::move(closure));
  }
};

/// LibTorch's SGD, said to unscale its own gradients.
struct SelfUnscalingByTable : torch::optim::SGD {
  using torch::optim::SGD::SGD;
};

/// LibTorch's SGD, said to be unusable under a GradScaler.
struct RefusedByTable : torch::optim::SGD {
  using torch::optim::SGD::SGD;
};

/// A subclass nobody registers: it gets LibTorch's SGD row.
struct UnregisteredSGD : torch::optim::SGD {
  using torch::optim::SGD::SGD;
};

/// An optimizer loom does not know.
struct Unknown : torch::optim::Optimizer {
  explicit Unknown(std::vector<at::Tensor> params)
      : torch::optim::Optimizer({torch::optim::OptimizerParamGroup(std::move(params))},
                                std::make_unique<torch::optim::SGDOptions>(0.1)) {}
  using torch::optim::Optimizer::step;
  at::Tensor step(LossClosure = nullptr) override { return {}; }
};

int& moves() {
  static int n = 0;
  return n;
}

/// The rows of the three SGDs above: LibTorch's SGD state, no Python layout.
template <AmpSupport Amp>
struct SgdRow : loom::optim::TraitsDefaults {
  using options = torch::optim::SGDOptions;
  using param_state = torch::optim::SGDParamState;
  static constexpr bool python_layout = false;
  static constexpr MomentumKind momentum = MomentumKind::Momentum;
  static constexpr AmpSupport amp = Amp;
  static void move_state(param_state& s, const c10::Device& device) {
    ++moves();
    if (s.momentum_buffer().defined()) s.momentum_buffer(s.momentum_buffer().to(device));
  }
  static double& momentum_of(options& o) { return o.momentum(); }
};

}  // namespace

template <>
struct loom::optim::optimizer_traits<ScaleTakingSGD> : SgdRow<AmpSupport::Fused> {
  static constexpr std::string_view name = "ScaleTakingSGD";
  static void set_amp(ScaleTakingSGD& o, std::optional<at::Tensor> grad_scale,
                      std::optional<at::Tensor> found_inf) {
    ++o.set_amp_calls;
    o.grad_scale = std::move(grad_scale);
    o.found_inf = std::move(found_inf);
  }
};
template <>
struct loom::optim::optimizer_traits<SelfUnscalingByTable> : SgdRow<AmpSupport::SelfUnscaling> {
  static constexpr std::string_view name = "SelfUnscalingByTable";
};
template <>
struct loom::optim::optimizer_traits<RefusedByTable> : SgdRow<AmpSupport::Refused> {
  static constexpr std::string_view name = "RefusedByTable";
};

TEST_CASE("loom's optimizer table has LibTorch's and loom's optimizers", "[optim][optim_table]") {
  torch::nn::Linear m(3, 2);
  const auto p = m->parameters();
  struct Expected {
    std::string_view name;
    bool python_layout;
    MomentumKind momentum;
    AmpSupport amp;
  };
  auto check = [](const torch::optim::Optimizer& opt, Expected e) {
    const auto& info = row(opt);
    CHECK(info.name == e.name);
    CHECK(info.python_layout == e.python_layout);
    CHECK((info.save_options != nullptr) == e.python_layout);
    CHECK(info.momentum == e.momentum);
    CHECK((info.momentum_of != nullptr) == (e.momentum != MomentumKind::None));
    CHECK(info.amp == e.amp);
    CHECK((info.set_amp != nullptr) == (e.amp == AmpSupport::Fused));
    CHECK(info.move_state != nullptr);
  };
  check(torch::optim::SGD(p, 0.1), {"SGD", true, MomentumKind::Momentum, AmpSupport::HostCheck});
  check(torch::optim::Adam(p), {"Adam", true, MomentumKind::Beta1, AmpSupport::HostCheck});
  check(torch::optim::AdamW(p), {"AdamW", true, MomentumKind::Beta1, AmpSupport::HostCheck});
  check(torch::optim::RMSprop(p),
        {"RMSprop", false, MomentumKind::Momentum, AmpSupport::HostCheck});
  check(torch::optim::Adagrad(p), {"Adagrad", false, MomentumKind::None, AmpSupport::HostCheck});
  check(torch::optim::LBFGS(p), {"LBFGS", false, MomentumKind::None, AmpSupport::Refused});
  check(loom::optim::SGD(p, 0.1),
        {"loom::optim::SGD", true, MomentumKind::Momentum, AmpSupport::Fused});
  check(loom::optim::Adam(p, 0.1),
        {"loom::optim::Adam", true, MomentumKind::Beta1, AmpSupport::Fused});
  check(loom::optim::AdamW(p, 0.1),
        {"loom::optim::AdamW", true, MomentumKind::Beta1, AmpSupport::Fused});

  // The momentum accessor reads and writes the group's own option.
  torch::optim::Adam adam(p, torch::optim::AdamOptions(0.1).betas({0.7, 0.9}));
  double* beta1 = row(adam).momentum_of(adam.param_groups()[0].options());
  REQUIRE(beta1 != nullptr);
  CHECK(*beta1 == 0.7);
  *beta1 = 0.8;
  CHECK(std::get<0>(
            static_cast<torch::optim::AdamOptions&>(adam.param_groups()[0].options()).betas()) ==
        0.8);
}

TEST_CASE("A subclass takes its registered base's row and an unknown optimizer has none",
          "[optim][optim_table]") {
  torch::nn::Linear m(3, 2);
  UnregisteredSGD sub(m->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  CHECK(row(sub).name == "SGD");
  CHECK(row(sub).type == std::type_index(typeid(torch::optim::SGD)));
  CHECK_FALSE(loom::state::optimizer_state(sub).at("param_groups").toListRef().empty());

  Unknown unknown(m->parameters());
  CHECK(loom::optim::find_optimizer(unknown) == nullptr);
  CHECK(loom::optim::momentum_kind(unknown) == MomentumKind::None);
  CHECK(loom::optim::amp_support(unknown) == AmpSupport::HostCheck);
  CHECK_THROWS_WITH(
      loom::state::optimizer_state(unknown),
      Contains("cannot checkpoint in Python's layout") && Contains("register_optimizer<O>()"));
  CHECK_THROWS_WITH(loom::optim::OneCycleLR(unknown, {.max_lr = {0.1}, .total_steps = 10}),
                    Contains("optimizer must support momentum or beta1"));
  torch::optim::RMSprop rmsprop(m->parameters());
  CHECK_THROWS_WITH(
      loom::state::optimizer_state(rmsprop, "opt"),
      Contains("'opt' is an optimizer loom cannot checkpoint") && Contains("has no Python layout"));
}

TEST_CASE("A user's row moves its states, lends its momentum and says how 16-mixed steps it",
          "[optim][optim_table]") {
  loom::testing::WarningCatcher quiet;  // fp16 on the CPU warns once
  loom::optim::register_optimizer<ScaleTakingSGD>();
  loom::optim::register_optimizer<SelfUnscalingByTable>();
  loom::optim::register_optimizer<RefusedByTable>();
  torch::manual_seed(0);
  torch::nn::Linear m(3, 2);
  auto x = at::randn({4, 3});

  ScaleTakingSGD opt(m->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  CHECK(row(opt).name == "ScaleTakingSGD");

  // 16-mixed hands it the scale and the flag instead of unscaling and reading the flag. (A
  // first scale of 256: 65536 would overflow fp16 in this backward.)
  loom::amp::GradScalerOptions scaling;
  scaling.init_scale = 256.0;
  loom::Runtime<loom::Cpu, loom::Fp16Mixed> rt(loom::Cpu{}, loom::Fp16Mixed(scaling));
  rt.setup(m, opt);
  rt.backward(rt.forward(m, x).sum(), m);
  const auto result = rt.optimizer_step(opt);
  CHECK(opt.set_amp_calls == 1);
  REQUIRE(opt.grad_scale.has_value());
  CHECK(opt.grad_scale->item<float>() == 256.0f);
  REQUIRE(opt.found_inf.has_value());
  CHECK_FALSE(result.known());  // the device flag, not a host decision
  CHECK(result.applied());

  // The device mover is the row's.
  const int before = moves();
  loom::device::move_optimizer_state(opt, c10::Device(c10::kMeta));
  CHECK(moves() - before == 2);
  for (auto& kv : opt.state()) {
    CHECK(static_cast<torch::optim::SGDParamState&>(*kv.second).momentum_buffer().is_meta());
  }

  // OneCycleLR cycles the row's momentum option: max_momentum at the start.
  ScaleTakingSGD cycled(m->parameters(), torch::optim::SGDOptions(0.1).momentum(0.5));
  loom::optim::OneCycleLR sched(cycled, {.max_lr = {0.1}, .total_steps = 10});
  CHECK(static_cast<torch::optim::SGDOptions&>(cycled.param_groups()[0].options()).momentum() ==
        Approx(0.95));

  // No Python layout in this row: rt.save refuses it, naming the row.
  CHECK_THROWS_WITH(loom::state::optimizer_state(opt), Contains("has no Python layout"));

  SelfUnscalingByTable self(m->parameters(), 0.1);
  rt.backward(rt.forward(m, x).sum(), m);
  CHECK_THROWS_WITH(rt.clip_gradients(self, 1.0), Contains("unscales them itself"));
  RefusedByTable refused(m->parameters(), 0.1);
  CHECK_THROWS_WITH(rt.optimizer_step(refused),
                    Contains("loom: AMP and the RefusedByTable optimizer are not compatible."));
}
