// A user-written optimizer in loom's optimizer table: rt.save refuses it until it is
// registered, then writes it in Python's layout, and rt.load resumes it bitwise.
#include "support/catch.hpp"

#include <unistd.h>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/optimizer.h>

#include <loom/loom.hpp>

using Catch::Matchers::Contains;

namespace {

namespace fs = std::filesystem;

struct HeavyBallOptions : torch::optim::OptimizerCloneableOptions<HeavyBallOptions> {
  HeavyBallOptions(double lr = 1e-2) : lr_(lr) {}  // NOLINT: implicit, as LibTorch's options
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
  TORCH_ARG(double, lr);
  TORCH_ARG(double, momentum) = 0.9;
};

struct HeavyBallState : torch::optim::OptimizerCloneableParamState<HeavyBallState> {
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(at::Tensor, momentum_buffer);
};

/// Heavy-ball momentum with a step count: v = m v + g, p -= lr v / sqrt(step). `Tag` makes
/// distinct types, one registered and one not.
template <int Tag>
class HeavyBall : public torch::optim::Optimizer {
 public:
  HeavyBall(std::vector<at::Tensor> params, HeavyBallOptions defaults)
      : torch::optim::Optimizer({torch::optim::OptimizerParamGroup(std::move(params))},
                                std::make_unique<HeavyBallOptions>(defaults)) {}

  using torch::optim::Optimizer::step;
  at::Tensor step(LossClosure closure = nullptr) override {
    at::NoGradGuard no_grad;
    at::Tensor loss;
    if (closure) loss = closure();
    for (auto& group : param_groups()) {
      const auto& o = static_cast<const HeavyBallOptions&>(group.options());
      for (auto& p : group.params()) {
        if (!p.grad().defined()) continue;
        auto& slot = state()[p.unsafeGetTensorImpl()];
        if (!slot) {
          auto fresh = std::make_unique<HeavyBallState>();
          fresh->momentum_buffer(at::zeros_like(p));
          slot = std::move(fresh);
        }
        auto& s = static_cast<HeavyBallState&>(*slot);
        s.step(s.step() + 1);
        s.momentum_buffer().mul_(o.momentum()).add_(p.grad());
        p.sub_(s.momentum_buffer() * (o.lr() / std::sqrt(static_cast<double>(s.step()))));
      }
    }
    return loss;
  }
};

using Registered = HeavyBall<0>;
using Unregistered = HeavyBall<1>;

}  // namespace

/// HeavyBall's row of loom's optimizer table: the same traits for both tags; only
/// HeavyBall<0> is registered.
template <int Tag>
struct loom::optim::optimizer_traits<HeavyBall<Tag>> : loom::optim::TraitsDefaults {
  using options = HeavyBallOptions;
  using param_state = HeavyBallState;
  static constexpr std::string_view name = "HeavyBall";
  static constexpr MomentumKind momentum = MomentumKind::Momentum;

  static void save_options(const options& o, c10::impl::GenericDict& g) {
    g.insert("lr", o.lr());
    g.insert("momentum", o.momentum());
  }
  static void load_options(options& o, const PythonReader& r) {
    o.lr(r.number("lr"));
    o.momentum(r.number("momentum"));
  }
  static void save_state(const param_state& s, c10::impl::GenericDict& d) {
    d.insert("step", at::scalar_tensor(static_cast<double>(s.step()), at::kFloat));
    d.insert("momentum_buffer", s.momentum_buffer().detach());
  }
  static std::unique_ptr<param_state> load_state(const PythonReader& r, const options&) {
    auto s = std::make_unique<param_state>();
    s->step(static_cast<int64_t>(r.number("step")));
    s->momentum_buffer(r.tensor("momentum_buffer"));
    return s;
  }
  static void move_state(param_state& s, const c10::Device& device) {
    s.momentum_buffer(s.momentum_buffer().to(device));
  }
  static double& momentum_of(options& o) { return o.momentum(); }
};

namespace {

/// A fresh directory under the system temp dir, removed with the object.
struct TempDir {
  fs::path path =
      fs::temp_directory_path() /
      ("loom_custom_optimizer_" + std::to_string(::getpid()) + "_" + std::to_string(++count()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
  static int& count() {
    static int n = 0;
    return n;
  }
};

using Rt = loom::Runtime<loom::Cpu, loom::Fp32>;

torch::nn::Sequential make_model() {
  return torch::nn::Sequential(torch::nn::Linear(6, 8), torch::nn::Tanh(), torch::nn::Linear(8, 3));
}

/// Steps [from, to) on data that depends on the step only.
template <class Opt>
void train(Rt& rt, torch::nn::Sequential& model, Opt& opt, int from, int to) {
  for (int i = from; i < to; ++i) {
    auto x = at::arange(48, at::kFloat).reshape({8, 6}).sin() * (i + 1);
    auto y = at::arange(8, at::kLong) % 3;
    rt.backward(at::cross_entropy_loss(rt.forward(model, x), y), model);
    rt.optimizer_step(opt);
    opt.zero_grad();
  }
}

/// Parameters, buffers and step counts, in order.
template <class Opt>
std::vector<at::Tensor> snapshot(torch::nn::Sequential& model, Opt& opt) {
  std::vector<at::Tensor> out;
  for (const auto& p : model->parameters()) {
    const auto& s = static_cast<HeavyBallState&>(*opt.state().at(p.unsafeGetTensorImpl()));
    out.push_back(p.detach().clone());
    out.push_back(s.momentum_buffer().clone());
    out.push_back(at::scalar_tensor(s.step(), at::kLong));
  }
  return out;
}

}  // namespace

TEST_CASE("a user optimizer in loom's optimizer table checkpoints through rt.save, bitwise",
          "[checkpoint][optim_table]") {
  TempDir dir;
  // Traits alone do not make a row: rt.save says what is missing, and writes nothing.
  {
    Rt rt;
    auto model = make_model();
    Unregistered opt(model->parameters(), HeavyBallOptions(0.1));
    rt.setup(model, opt);
    train(rt, model, opt, 0, 1);
    CHECK_THROWS_WITH(rt.save(dir.path / "no.pt", {{"optimizer", opt}}),
                      Contains("'optimizer' is an optimizer loom cannot checkpoint in Python's "
                               "layout") &&
                          Contains("HeavyBall<1>") &&
                          Contains("loom::optim::register_optimizer<O>()"));
    CHECK_FALSE(fs::exists(dir.path / "no.pt"));
    CHECK(loom::optim::find_optimizer(opt) == nullptr);
  }

  loom::optim::register_optimizer<Registered>();
  loom::optim::register_optimizer<Registered>();  // again: nothing changes

  at::manual_seed(3);
  Rt straight_rt;
  auto straight = make_model();
  Registered straight_opt(straight->parameters(), HeavyBallOptions(0.1).momentum(0.8));
  straight_rt.setup(straight, straight_opt);
  train(straight_rt, straight, straight_opt, 0, 6);

  at::manual_seed(3);
  {
    Rt rt;
    auto model = make_model();
    Registered opt(model->parameters(), HeavyBallOptions(0.1).momentum(0.8));
    rt.setup(model, opt);
    train(rt, model, opt, 0, 3);
    rt.save(dir.path / "half.pt", {{"model", model}, {"optimizer", opt}, {"runtime", rt}});
  }

  // Python's layout: param groups with the traits' keys and "params"; states by parameter id.
  const auto file = loom::checkpoint::load_value(dir.path / "half.pt").toGenericDict();
  const auto saved = file.at("optimizer").toGenericDict();
  const auto group = saved.at("param_groups").toListRef()[0].toGenericDict();
  std::vector<std::string> keys;
  for (const auto& e : group) keys.push_back(e.key().toStringRef());
  CHECK(keys == std::vector<std::string>{"lr", "momentum", "params"});
  CHECK(group.at("momentum").toDouble() == 0.8);
  std::vector<int64_t> ids;  // read back as a generic list, as Python's lists are
  for (const auto& id : group.at("params").toListRef()) ids.push_back(id.toInt());
  CHECK(ids == std::vector<int64_t>{0, 1, 2, 3});
  const auto state = saved.at("state").toGenericDict();
  REQUIRE(state.size() == 4);
  CHECK(state.at(0).toGenericDict().at("step").toTensor().item<float>() == 3.0f);

  Rt rt;
  auto model = make_model();
  Registered opt(model->parameters(), HeavyBallOptions(7.0).momentum(0.0));
  rt.setup(model, opt);
  rt.load(dir.path / "half.pt", {{"model", model}, {"optimizer", opt}, {"runtime", rt}});
  CHECK(opt.param_groups()[0].options().get_lr() == 0.1);  // the file's options
  train(rt, model, opt, 3, 6);

  const auto a = snapshot(straight, straight_opt);
  const auto b = snapshot(model, opt);
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("tensor " << i);
    CHECK(a[i].equal(b[i]));
  }
}

TEST_CASE("a user optimizer's checkpoint errors name the key path", "[checkpoint][optim_table]") {
  loom::optim::register_optimizer<Registered>();
  auto model = make_model();
  Rt rt;
  Registered opt(model->parameters(), HeavyBallOptions(0.1));
  rt.setup(model, opt);
  train(rt, model, opt, 0, 2);
  const auto good = loom::state::optimizer_state(opt);

  Registered other(model->parameters(), HeavyBallOptions(0.5));
  loom::state::load_optimizer_state(other, good);
  CHECK(other.param_groups()[0].options().get_lr() == 0.1);

  auto no_lr = loom::state::optimizer_state(opt);
  CHECK(no_lr.at("param_groups").toListRef()[0].toGenericDict().erase("lr") == 1);
  CHECK_THROWS_WITH(loom::state::load_optimizer_state(other, no_lr),
                    Contains("loom::load: missing key \"optimizer.param_groups.0.lr\""));

  auto bad_shape = loom::state::optimizer_state(opt);
  bad_shape.at("state").toGenericDict().at(0).toGenericDict().insert_or_assign("momentum_buffer",
                                                                               at::zeros({2}));
  CHECK_THROWS_WITH(
      loom::state::load_optimizer_state(other, bad_shape),
      Contains("loom::load: key \"optimizer.state.0.momentum_buffer\": has shape [2]"));

  // LibTorch's SGD state has no step: refused, naming where; `other` is left as it was.
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  train(rt, model, sgd, 0, 1);
  CHECK_THROWS_WITH(loom::state::load_optimizer_state(other, loom::state::optimizer_state(sgd)),
                    Contains("loom::load: missing key \"optimizer.state.0.step\""));
  CHECK(other.param_groups()[0].options().get_lr() == 0.1);
}
