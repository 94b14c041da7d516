// loom::optim's LR schedulers: values, state dicts and skipped steps against Python's
// torch.optim.lr_scheduler (hidden parity case, ctest optim.lr_scheduler_parity), and their
// behaviour and errors on their own.
#include "support/catch.hpp"
#include "support/fixture.hpp"
#include "support/sync_counter.hpp"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <ATen/ATen.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>

#include <loom/optim/adam.hpp>
#include <loom/optim/lr_scheduler.hpp>
#include <loom/optim/sgd.hpp>

using loom::testing::Reader;
using loom::testing::SyncCounter;

namespace {

using Settings = std::map<std::string, std::vector<std::string>>;

struct Case {
  std::string name, optimizer, kind;
  Settings settings;
  std::vector<double> initial_lr, initial_momentum;
  std::vector<int> mask;
  std::vector<double> metrics;                    // ReduceLROnPlateau's, where the mask is 1
  std::vector<std::vector<double>> lrs, momenta;  // after every step
};

double hex(const std::string& w) { return std::strtod(w.c_str(), nullptr); }

std::vector<double> list(const Settings& s, const std::string& key) {
  const auto& v = s.at(key);
  std::vector<double> out;
  for (std::size_t i = 1; i < v.size(); ++i) out.push_back(hex(v[i]));
  return out;
}

std::vector<double> lrs{0.1, 0.05};

std::vector<at::Tensor> params() { return {at::zeros({2}), at::zeros({3})}; }

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& kind,
                                                        std::vector<at::Tensor> p) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (kind == "sgd") {
    for (int i = 0; i < 2; ++i) {
      groups.emplace_back(
          std::vector<at::Tensor>{p[i]},
          std::make_unique<loom::optim::SGDOptions>(loom::optim::SGDOptions(lrs[i]).momentum(0.9)));
    }
    return std::make_unique<loom::optim::SGD>(groups,
                                              loom::optim::SGDOptions(lrs[0]).momentum(0.9));
  }
  for (int i = 0; i < 2; ++i) {
    groups.emplace_back(std::vector<at::Tensor>{p[i]},
                        std::make_unique<loom::optim::AdamOptions>(lrs[i]));
  }
  return std::make_unique<loom::optim::Adam>(groups, loom::optim::AdamOptions(lrs[0]));
}

// Calls f with the case's scheduler, built on `opt` from the fixture's settings.
template <class F>
void with_scheduler(const Case& c, torch::optim::Optimizer& opt, F&& f) {
  const auto& s = c.settings;
  auto num = [&](const char* k) { return hex(s.at(k).at(0)); };
  auto integer = [&](const char* k) { return std::stoll(s.at(k).at(0)); };
  if (c.kind == "StepLR") {
    loom::optim::StepLR sched(opt, integer("step_size"), num("gamma"));
    f(sched);
  } else if (c.kind == "MultiStepLR") {
    std::vector<int64_t> m;
    for (double x : list(s, "milestones")) m.push_back(static_cast<int64_t>(x));
    loom::optim::MultiStepLR sched(opt, m, num("gamma"));
    f(sched);
  } else if (c.kind == "LinearLR") {
    loom::optim::LinearLR sched(opt, num("start_factor"), num("end_factor"),
                                integer("total_iters"));
    f(sched);
  } else if (c.kind == "CosineAnnealingLR") {
    loom::optim::CosineAnnealingLR sched(opt, integer("T_max"), num("eta_min"));
    f(sched);
  } else if (c.kind == "WarmupCosineLR") {
    loom::optim::WarmupCosineLR sched(opt, {.warmup_steps = integer("warmup_steps"),
                                            .total_steps = integer("total_steps"),
                                            .warmup_start_factor = num("warmup_start_factor"),
                                            .eta_min = num("eta_min")});
    f(sched);
  } else if (c.kind == "OneCycleLR") {
    loom::optim::OneCycleOptions o{.max_lr = list(s, "max_lr"),
                                   .total_steps = integer("total_steps")};
    if (s.count("pct_start")) o.pct_start = num("pct_start");
    if (s.count("anneal_strategy")) o.anneal_strategy = s.at("anneal_strategy").at(0);
    if (s.count("three_phase")) o.three_phase = integer("three_phase") != 0;
    if (s.count("base_momentum")) o.base_momentum = {num("base_momentum")};
    if (s.count("max_momentum")) o.max_momentum = {num("max_momentum")};
    loom::optim::OneCycleLR sched(opt, o);
    f(sched);
  } else if (c.kind == "ExponentialLR") {
    loom::optim::ExponentialLR sched(opt, num("gamma"));
    f(sched);
  } else if (c.kind == "PolynomialLR") {
    loom::optim::PolynomialLR sched(opt, integer("total_iters"), num("power"));
    f(sched);
  } else if (c.kind == "CosineAnnealingWarmRestarts") {
    loom::optim::CosineAnnealingWarmRestarts sched(opt, integer("T_0"), integer("T_mult"),
                                                   num("eta_min"));
    f(sched);
  } else if (c.kind == "ChainedScheduler") {
    loom::optim::LinearLR warm(opt, num("start_factor"), num("end_factor"), integer("total_iters"));
    loom::optim::ExponentialLR decay(opt, num("gamma"));
    loom::optim::ChainedScheduler sched(warm, decay);
    f(sched);
  } else if (c.kind == "ReduceLROnPlateau") {
    loom::optim::ReduceLROnPlateauOptions o;
    if (s.count("mode")) o.mode = s.at("mode").at(0);
    if (s.count("factor")) o.factor = num("factor");
    if (s.count("patience")) o.patience = integer("patience");
    if (s.count("threshold")) o.threshold = num("threshold");
    if (s.count("threshold_mode")) o.threshold_mode = s.at("threshold_mode").at(0);
    if (s.count("cooldown")) o.cooldown = integer("cooldown");
    if (s.count("min_lr")) o.min_lrs = list(s, "min_lr");
    if (s.count("eps")) o.eps = num("eps");
    loom::optim::ReduceLROnPlateau sched(opt, o);
    f(sched);
  } else if (c.kind == "LambdaLR") {
    const double factor = num("factor");  // Python's lambda e: factor ** e
    loom::optim::LambdaLR sched(
        opt, [factor](int64_t e) { return std::pow(factor, static_cast<double>(e)); });
    f(sched);
  } else {
    FAIL("unknown scheduler " << c.kind);
  }
}

template <class S>
constexpr bool is_plateau = std::is_same_v<std::decay_t<S>, loom::optim::ReduceLROnPlateau>;

// Step i of case c: the step result of the mask, or, for ReduceLROnPlateau, the metric where
// the mask is 1 (an evaluation), nothing where it is 0.
template <class S>
void step(S& sched, const Case& c, int64_t i) {
  if constexpr (is_plateau<S>) {
    if (c.mask[i] != 0) sched.step(c.metrics[i]);
  } else {
    sched.step(loom::StepResult(c.mask[i] != 0));
  }
}

std::vector<double> group_momenta(torch::optim::Optimizer& opt) {
  return loom::optim::detail::GroupHypers::of(opt).momentum;
}

// Bitwise equality of doubles, with the step in the message.
void same(const std::vector<double>& got, const std::vector<double>& want,
          const std::string& what) {
  INFO(what);
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("group " << i << ": " << got[i] << " vs Python's " << want[i]);
    CHECK(std::memcmp(&got[i], &want[i], sizeof(double)) == 0);
  }
}

std::vector<Case> read_fixture(const std::string& path, int64_t& steps, int64_t& resume) {
  Reader in(path);
  in.expect("loom-lr-scheduler-parity");
  in.expect("1");
  in.expect("cases");
  const auto n = in.integer();
  in.expect("steps");
  steps = in.integer();
  in.expect("resume");
  resume = in.integer();
  in.expect("lrs");
  REQUIRE(in.numbers(2) == lrs);
  std::vector<Case> cases;
  for (int64_t k = 0; k < n; ++k) {
    Case c;
    in.expect("case");
    c.name = in.word();
    c.optimizer = in.word();
    c.kind = in.word();
    const auto count = in.integer();
    for (int64_t j = 0; j < count; ++j) {
      auto key = in.word();
      auto first = in.word();
      std::vector<std::string> v{first};
      if (key == "milestones" || key == "max_lr" ||
          key == "min_lr") {  // lists: a count, then the values
        for (int64_t e = 0; e < std::stoll(first); ++e) v.push_back(in.word());
      }
      c.settings[key] = v;
    }
    in.expect("initial");
    c.initial_lr = in.numbers(2);
    c.initial_momentum = in.numbers(2);
    in.expect("mask");
    for (int64_t i = 0; i < steps; ++i) c.mask.push_back(static_cast<int>(in.integer()));
    in.expect("metrics");
    c.metrics = in.numbers(static_cast<std::size_t>(steps));
    for (int64_t i = 0; i < steps; ++i) {
      in.expect("row");
      c.lrs.push_back(in.numbers(2));
      c.momenta.push_back(in.numbers(2));
    }
    cases.push_back(std::move(c));
  }
  return cases;
}

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) FAIL("cannot open " << path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("LR schedulers give Python's lrs, states and skips", "[.][lr_scheduler][parity]") {
  const char* path = std::getenv("LOOM_LR_SCHEDULER_PARITY_FILE");
  if (path == nullptr) FAIL("LOOM_LR_SCHEDULER_PARITY_FILE is not set");
  int64_t steps = 0, resume = 0;
  const auto cases = read_fixture(path, steps, resume);
  REQUIRE(cases.size() == 14);
  for (const auto& c : cases) {
    SECTION(c.name) {
      // 1. Uninterrupted, with the skip mask as step results; loom's state at `resume` saved
      //    for Python to check.
      auto opt = make_optimizer(c.optimizer, params());
      with_scheduler(c, *opt, [&](auto& sched) {
        same(loom::optim::detail::group_lrs(*opt), c.initial_lr, c.name + " initial lr");
        same(group_momenta(*opt), c.initial_momentum, c.name + " initial momentum");
        for (int64_t i = 0; i < steps; ++i) {
          step(sched, c, i);
          const auto now = loom::optim::detail::group_lrs(*opt);
          same(now, c.lrs[i], c.name + " lr after step " + std::to_string(i + 1));
          same(sched.get_last_lr(), c.lrs[i], c.name + " get_last_lr");
          same(group_momenta(*opt), c.momenta[i],
               c.name + " momentum after step " + std::to_string(i + 1));
          if (i + 1 == resume) {
            auto bytes = torch::pickle_save(c10::IValue(sched.state_dict()));
            std::ofstream(std::string(path) + "." + c.name + ".cpp.pt", std::ios::binary)
                .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
          }
        }
      });

      // 2. The same mask as device-side flags on the CPU: the same lrs, no host read.
      auto opt2 = make_optimizer(c.optimizer, params());
      with_scheduler(c, *opt2, [&](auto& sched) {
        if constexpr (!is_plateau<decltype(sched)>) {  // ReduceLROnPlateau steps on metrics
          std::vector<at::Tensor> flags;
          for (int64_t i = 0; i < steps; ++i) {
            flags.push_back(at::full({}, c.mask[i] ? 0.0f : 1.0f));
          }
          SyncCounter counter;
          for (int64_t i = 0; i < steps; ++i) sched.step(loom::StepResult(flags[i]));
          CHECK(SyncCounter::count() == 0);
          same(loom::optim::detail::group_lrs(*opt2), c.lrs.back(), c.name + " flags on the CPU");
        }
      });

      // 3. Resumed from Python's state dict after `resume` steps (the optimizer's lrs and
      //    momenta restored as its own state would bring them back).
      auto opt3 = make_optimizer(c.optimizer, params());
      with_scheduler(c, *opt3, [&](auto& sched) {
        sched.load_state_dict(
            torch::pickle_load(read_bytes(std::string(path) + "." + c.name + ".py.pt")));
        loom::optim::detail::GroupHypers{c.lrs[resume - 1], c.momenta[resume - 1]}.restore(*opt3);
        same(sched.get_last_lr(), c.lrs[resume - 1], c.name + " get_last_lr after loading");
        for (int64_t i = resume; i < steps; ++i) {
          step(sched, c, i);
          same(loom::optim::detail::group_lrs(*opt3), c.lrs[i],
               c.name + " resumed, lr after step " + std::to_string(i + 1));
          same(group_momenta(*opt3), c.momenta[i], c.name + " resumed, momentum");
        }
      });
    }
  }
}

namespace {

struct Sgd {
  std::vector<at::Tensor> p = params();
  std::unique_ptr<torch::optim::Optimizer> opt = make_optimizer("sgd", p);
};

}  // namespace

TEST_CASE("StepLR steps, skips and restores", "[lr_scheduler]") {
  Sgd s;
  loom::optim::StepLR sched(*s.opt, 2, 0.5);
  CHECK(sched.get_last_lr() == std::vector<double>{0.1, 0.05});
  sched.step();                         // position 1
  sched.step(loom::StepResult(false));  // skipped: still 1
  CHECK(sched.last_epoch() == 1);
  sched.step(loom::StepResult(true));  // position 2: halved
  CHECK(sched.last_epoch() == 2);
  CHECK(sched.get_last_lr() == std::vector<double>{0.05, 0.025});
  CHECK(s.opt->param_groups()[1].options().get_lr() == 0.025);

  auto state = sched.state_dict();
  CHECK(state.at("last_epoch").toInt() == 2);
  CHECK(state.at("_step_count").toInt() == 3);  // the initial step counts, as in Python
  CHECK(state.at("step_size").toInt() == 2);
  Sgd t;
  loom::optim::StepLR other(*t.opt, 5, 0.9);
  other.load_state_dict(state);  // as Python: the settings come with the state
  CHECK(other.last_epoch() == 2);
  other.step();
  other.step();  // position 4: the loaded step size (2) and gamma (0.5) apply
  CHECK(t.opt->param_groups()[0].options().get_lr() == 0.05);
}

TEST_CASE("LR schedulers work with LibTorch's optimizers and cycle their momentum",
          "[lr_scheduler]") {
  auto p = at::zeros({3});
  torch::optim::SGD opt({p}, torch::optim::SGDOptions(0.1).momentum(0.9));
  loom::optim::OneCycleLR sched(opt, {.max_lr = {1.0}, .total_steps = 10});
  const auto& o = static_cast<torch::optim::SGDOptions&>(opt.param_groups()[0].options());
  CHECK(o.lr() == Approx(0.04));  // max_lr / div_factor
  CHECK(o.momentum() == Approx(0.95));
  for (int i = 0; i < 3; ++i) sched.step();
  CHECK(o.lr() > 0.5);
  CHECK(o.momentum() < 0.9);
}

TEST_CASE("LR schedulers reject bad settings and states with clear errors", "[lr_scheduler]") {
  Sgd s;
  using Catch::Matchers::Contains;
  using Catch::Matchers::Equals;
  CHECK_THROWS_WITH(loom::optim::StepLR(*s.opt, 0), Contains("step_size must be positive"));
  CHECK_THROWS_WITH(loom::optim::PolynomialLR(*s.opt, 0),
                    Equals("loom::optim::PolynomialLR: total_iters must be positive"));
  CHECK_THROWS_WITH(
      loom::optim::CosineAnnealingWarmRestarts(*s.opt, 0),
      Equals("loom::optim::CosineAnnealingWarmRestarts: Expected positive integer T_0, but got 0"));
  CHECK_THROWS_WITH(loom::optim::CosineAnnealingWarmRestarts(*s.opt, 3, 0),
                    Equals("loom::optim::CosineAnnealingWarmRestarts: Expected integer T_mult >= "
                           "1, but got 0"));
  CHECK_THROWS_WITH(
      loom::optim::LambdaLR(
          *s.opt, std::vector<loom::optim::LambdaLR::Lambda>{[](int64_t) { return 1.0; }}),
      Equals("loom::optim::LambdaLR: Expected 2 lr_lambdas, but got 1"));
  CHECK_THROWS_WITH(loom::optim::LinearLR(*s.opt, 0.0),
                    Contains("Starting multiplicative factor expected to be greater than 0"));
  CHECK_THROWS_WITH(loom::optim::WarmupCosineLR(*s.opt, {.warmup_steps = 10, .total_steps = 10}),
                    Contains("needs 1 <= warmup_steps < total_steps"));
  CHECK_THROWS_WITH(loom::optim::OneCycleLR(*s.opt, {.max_lr = {1.0, 2.0, 3.0}, .total_steps = 5}),
                    Contains("expected 2 values for max_lr, got 3"));
  CHECK_THROWS_WITH(
      loom::optim::OneCycleLR(*s.opt, {.max_lr = {1.0}, .total_steps = 5, .anneal_strategy = "x"}),
      Contains("anneal_strategy must be one of 'cos' or 'linear'"));

  auto p = at::zeros({1});
  torch::optim::Adagrad adagrad({p}, torch::optim::AdagradOptions(0.1));
  CHECK_THROWS_WITH(loom::optim::OneCycleLR(adagrad, {.max_lr = {1.0}, .total_steps = 5}),
                    Contains("optimizer must support momentum or beta1"));

  loom::optim::OneCycleLR one(*s.opt, {.max_lr = {1.0}, .total_steps = 3});
  for (int i = 0; i < 3; ++i) one.step();
  CHECK_THROWS_WITH(one.step(),
                    Contains("Tried to step 4 times. The specified number of total steps is 3"));

  loom::optim::StepLR step(*s.opt, 3);
  loom::optim::MultiStepLR multi(*s.opt, {2, 4});
  CHECK_THROWS_WITH(
      multi.load_state_dict(step.state_dict()),
      Equals("loom::optim::MultiStepLR::load_state_dict: missing key \"milestones\""));
  auto state = step.state_dict();
  state.insert_or_assign("base_lrs", c10::List<double>({0.1}));
  CHECK_THROWS_WITH(
      step.load_state_dict(state),
      Equals("loom::optim::StepLR::load_state_dict: key \"base_lrs\": holds 1 values for 2 "
             "param groups"));
  state = step.state_dict();
  state.insert_or_assign("gamma", std::string("half"));
  CHECK_THROWS_WITH(
      step.load_state_dict(state),
      Equals("loom::optim::StepLR::load_state_dict: key \"gamma\": expected a number, got a str"));
  CHECK_THROWS_WITH(step.load_state_dict(c10::IValue(3)),
                    Equals("loom::optim::StepLR::load_state_dict: expected a dict, got an int"));
  CHECK_THROWS_WITH(step.step(loom::StepResult(at::zeros({2}))),
                    Contains("found_inf must be one f32 element"));
}

TEST_CASE("ReduceLROnPlateau lowers the lr after patience, cools down and takes tensors",
          "[lr_scheduler]") {
  Sgd s;
  loom::optim::ReduceLROnPlateau sched(*s.opt, {.factor = 0.5, .patience = 1, .cooldown = 1});
  CHECK(std::isinf(sched.best()));
  sched.step(1.0);                 // the best
  sched.step(at::full({}, 1.0f));  // one bad epoch: within patience
  CHECK(sched.num_bad_epochs() == 1);
  CHECK(sched.get_last_lr() == std::vector<double>{0.1, 0.05});
  sched.step(2.0);  // two: halved, cooldown starts
  CHECK(sched.get_last_lr() == std::vector<double>{0.05, 0.025});
  CHECK(sched.in_cooldown());
  sched.step(3.0);  // in cooldown: not counted
  CHECK(sched.num_bad_epochs() == 0);
  CHECK(sched.last_epoch() == 4);
  auto state = sched.state_dict();
  CHECK(state.at("default_min_lr").toInt() == 0);  // Python's default, an int
  CHECK(state.at("mode_worse").toDouble() == std::numeric_limits<double>::infinity());

  Sgd t;
  loom::optim::ReduceLROnPlateau other(*t.opt, {.mode = "max"});
  other.load_state_dict(state);  // the settings come with the state, as in Python
  CHECK(other.last_epoch() == 4);
  other.step(4.0);
  other.step(5.0);  // two bad epochs in min mode, patience 1
  CHECK(t.opt->param_groups()[0].options().get_lr() == 0.05);

  using Catch::Matchers::Equals;
  CHECK_THROWS_WITH(loom::optim::ReduceLROnPlateau(*s.opt, {.factor = 1.0}),
                    Equals("loom::optim::ReduceLROnPlateau: Factor should be < 1.0."));
  CHECK_THROWS_WITH(loom::optim::ReduceLROnPlateau(*s.opt, {.mode = "least"}),
                    Equals("loom::optim::ReduceLROnPlateau: mode least is unknown!"));
  CHECK_THROWS_WITH(loom::optim::ReduceLROnPlateau(*s.opt, {.threshold_mode = "pct"}),
                    Equals("loom::optim::ReduceLROnPlateau: threshold mode pct is unknown!"));
  CHECK_THROWS_WITH(loom::optim::ReduceLROnPlateau(*s.opt, {.min_lrs = {0.1}}),
                    Equals("loom::optim::ReduceLROnPlateau: expected 2 min_lrs, got 1"));
  CHECK_THROWS_WITH(sched.step(at::zeros({2})),
                    Equals("loom::optim::ReduceLROnPlateau: a metric tensor must hold one "
                           "element, got 2"));
  state.insert_or_assign("mode", std::string("up"));
  CHECK_THROWS_WITH(other.load_state_dict(state),
                    Equals("loom::optim::ReduceLROnPlateau: mode up is unknown!"));
  CHECK(other.last_epoch() == 6);  // a refused state changes nothing
}

TEST_CASE("ChainedScheduler steps its schedulers in order, once per applied step",
          "[lr_scheduler]") {
  Sgd s;
  loom::optim::StepLR halve(*s.opt, 1, 0.5);
  loom::optim::ExponentialLR decay(*s.opt, 0.1);
  loom::optim::ChainedScheduler sched(halve, decay);
  sched.step(loom::StepResult(at::full({}, 1.0f)));  // skipped: nothing moves
  CHECK(sched.get_last_lr() == std::vector<double>{0.1, 0.05});
  sched.step(loom::StepResult(at::full({}, 0.0f)));
  CHECK(sched.get_last_lr()[0] == 0.1 * 0.5 * 0.1);
  CHECK(halve.last_epoch() == 1);
  CHECK(decay.last_epoch() == 1);
  auto state = sched.state_dict();
  CHECK(state.at("_schedulers").toList().size() == 2);

  Sgd t;
  loom::optim::StepLR other(*t.opt, 1, 0.5);
  loom::optim::ChainedScheduler one(other);
  CHECK_THROWS_WITH(one.load_state_dict(state),
                    Catch::Matchers::Equals("loom::optim::ChainedScheduler::load_state_dict: key "
                                            "\"_schedulers\": holds 2 states for 1 schedulers"));
  loom::optim::ExponentialLR foreign(*t.opt, 0.9);
  CHECK_THROWS_WITH(loom::optim::ChainedScheduler(halve, foreign),
                    Catch::Matchers::Contains("expects all schedulers to belong to the same "
                                              "optimizer, but got scheduler ExponentialLR at "
                                              "index 1"));
}
