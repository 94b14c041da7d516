// Extension point: your own optimizer in loom's optimizer table.
//
//   custom_optimizer [--steps 20] [--out lion.pt]
//
// Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms") written as a
// torch::optim::Optimizer with its own options and per-parameter state. One specialization of
// loom::optim::optimizer_traits says what loom needs to know about it (its state in Python's
// layout, how to move it to a device, which option is its momentum), and one call of
// loom::optim::register_optimizer<Lion>() enters it in the table. From then on rt.save and
// rt.load checkpoint it like LibTorch's and loom's own optimizers.
//
// The program trains a small MLP for --steps steps straight, then again for half the steps,
// saves with rt.save, loads the file into a fresh model and a fresh Lion with rt.load and
// trains the second half; it exits 1 unless the two runs end with the same bits.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/ivalue.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/optimizer.h>
#include <CLI/CLI.hpp>

#include <loom/loom.hpp>

// ---- the optimizer: nothing here knows loom ---------------------------------------------------

/// Lion's options, with the names of lucidrains' lion-pytorch.
struct LionOptions : torch::optim::OptimizerCloneableOptions<LionOptions> {
  using Betas = std::tuple<double, double>;
  LionOptions(double lr = 1e-4) : lr_(lr) {}  // NOLINT: implicit, as LibTorch's options
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }

  TORCH_ARG(double, lr);
  TORCH_ARG(Betas, betas) = std::make_tuple(0.9, 0.99);
  TORCH_ARG(double, weight_decay) = 0.0;
};

/// One parameter's state: the moving average of its gradients.
struct LionParamState : torch::optim::OptimizerCloneableParamState<LionParamState> {
  TORCH_ARG(at::Tensor, exp_avg);
};

/// Lion: the sign of an interpolated momentum as the update, decoupled weight decay.
class Lion : public torch::optim::Optimizer {
 public:
  Lion(std::vector<at::Tensor> params, LionOptions defaults)
      : torch::optim::Optimizer({torch::optim::OptimizerParamGroup(std::move(params))},
                                std::make_unique<LionOptions>(defaults)) {}

  using torch::optim::Optimizer::step;
  at::Tensor step(LossClosure closure = nullptr) override {
    at::NoGradGuard no_grad;
    at::Tensor loss;
    if (closure) {
      at::AutoGradMode enable(true);
      loss = closure();
    }
    for (auto& group : param_groups()) {
      const auto& o = static_cast<const LionOptions&>(group.options());
      const auto [beta1, beta2] = o.betas();
      for (auto& p : group.params()) {
        if (!p.grad().defined()) continue;
        auto& slot = state()[p.unsafeGetTensorImpl()];
        if (!slot) {
          auto fresh = std::make_unique<LionParamState>();
          fresh->exp_avg(at::zeros_like(p));
          slot = std::move(fresh);
        }
        auto& m = static_cast<LionParamState&>(*slot).exp_avg();
        const auto& g = p.grad();
        p.mul_(1 - o.lr() * o.weight_decay());
        p.add_(m.mul(beta1).add_(g, 1 - beta1).sign_(), -o.lr());
        m.mul_(beta2).add_(g, 1 - beta2);
      }
    }
    return loss;
  }
};

// ---- what loom knows about it: one row of loom's optimizer table -------------------------------

namespace loom::optim {

template <>
struct optimizer_traits<Lion> : TraitsDefaults {
  using options = LionOptions;
  using param_state = LionParamState;
  static constexpr std::string_view name = "Lion";
  /// OneCycleLR cycles betas[0]; a scheduler rolls it back with the lr after a skipped step.
  static constexpr MomentumKind momentum = MomentumKind::Beta1;

  /// A param group in Python's layout, as lion-pytorch's state_dict has it (without "params",
  /// which loom adds).
  static void save_options(const options& o, c10::impl::GenericDict& g) {
    const auto [beta1, beta2] = o.betas();
    g.insert("lr", o.lr());
    g.insert("betas", c10::ivalue::Tuple::create({c10::IValue(beta1), c10::IValue(beta2)}));
    g.insert("weight_decay", o.weight_decay());
  }
  /// The reader's errors name the key path ("optimizer.param_groups.0.betas").
  static void load_options(options& o, const PythonReader& r) {
    o.lr(r.number("lr"));
    const auto betas = r.numbers("betas");
    if (betas.size() != 2) r.fail("betas", "expected two numbers");
    o.betas(std::make_tuple(betas[0], betas[1]));
    o.weight_decay(r.number_or("weight_decay", 0.0));
  }
  static void save_state(const param_state& s, c10::impl::GenericDict& d) {
    d.insert("exp_avg", s.exp_avg().detach());
  }
  /// r.tensor casts to the parameter's device and dtype, and checks its shape.
  static std::unique_ptr<param_state> load_state(const PythonReader& r, const options&) {
    auto s = std::make_unique<param_state>();
    s->exp_avg(r.tensor("exp_avg"));
    return s;
  }
  /// What rt.optimizer_to_device (and a Cuda runtime's setup) call for every state.
  static void move_state(param_state& s, const c10::Device& device) {
    s.exp_avg(s.exp_avg().to(device));
  }
  static double& momentum_of(options& o) { return std::get<0>(o.betas()); }
};

}  // namespace loom::optim

// ---- training ----------------------------------------------------------------------------------

namespace {

using Rt = loom::Runtime<loom::Cpu, loom::Fp32>;

torch::nn::Sequential make_model() {
  return torch::nn::Sequential(torch::nn::Linear(8, 32), torch::nn::ReLU(),
                               torch::nn::Linear(32, 1));
}

/// Steps [from, to) of the run, each on its own generated batch (the same in every run).
double train(Rt& rt, torch::nn::Sequential& model, Lion& opt, int64_t from, int64_t to) {
  double loss = 0.0;
  for (int64_t step = from; step < to; ++step) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
    auto x = at::randn({64, 8}, gen);
    auto y = x.sum(1, /*keepdim=*/true).sin();  // (64, 1) f32
    auto out = rt.forward(model, rt.to_device(x));
    auto l = torch::nn::functional::mse_loss(out, rt.to_device(y));
    loss = rt.backward(l, model).item<double>();
    rt.optimizer_step(opt);
    opt.zero_grad();
  }
  return loss;
}

/// The parameters and every optimizer state tensor, for a bitwise comparison.
std::vector<at::Tensor> snapshot(torch::nn::Sequential& model, Lion& opt) {
  std::vector<at::Tensor> out;
  for (const auto& p : model->parameters()) {
    out.push_back(p.detach().clone());
    out.push_back(
        static_cast<LionParamState&>(*opt.state().at(p.unsafeGetTensorImpl())).exp_avg().clone());
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t steps = 20;
  std::string out = "lion.pt";
  CLI::App app{"Checkpoints a user-written optimizer (Lion) through loom's optimizer table.",
               "custom_optimizer"};
  app.option_defaults()->always_capture_default();
  app.add_option("--steps", steps, "steps in all; the checkpoint is taken halfway")
      ->check(CLI::Range(int64_t{2}, int64_t{100000}));
  app.add_option("--out", out, "the checkpoint to write");
  CLI11_PARSE(app, argc, argv);
  try {
    const int64_t halfway = steps / 2;
    const LionOptions options = LionOptions(1e-3).weight_decay(0.01);

    // Before its row exists, loom says what is missing.
    {
      Rt rt;
      auto model = make_model();
      Lion opt(model->parameters(), options);
      rt.setup(model, opt);
      try {
        rt.save(out, {{"optimizer", opt}});
        std::printf("custom_optimizer: rt.save took an optimizer loom does not know\n");
        return 1;
      } catch (const loom::Error& e) {
        const std::string what = e.what();
        std::printf("unregistered: %s\n", what.substr(0, what.find(';')).c_str());
      }
    }

    // Once, before the first checkpoint (calling it again does nothing).
    loom::optim::register_optimizer<Lion>();

    // The run straight through.
    loom::seed_everything(0);
    Rt straight_rt;
    auto straight = make_model();
    Lion straight_opt(straight->parameters(), options);
    straight_rt.setup(straight, straight_opt);
    std::printf("registered: \"%s\" in loom's optimizer table\n",
                std::string(loom::optim::find_optimizer(straight_opt)->name).c_str());
    const double first_loss = train(straight_rt, straight, straight_opt, 0, 1);
    const double last_loss = train(straight_rt, straight, straight_opt, 1, steps);

    // The same run, stopped halfway and saved.
    loom::seed_everything(0);
    {
      Rt rt;
      auto model = make_model();
      Lion opt(model->parameters(), options);
      rt.setup(model, opt);
      train(rt, model, opt, 0, halfway);
      int64_t step = halfway;
      rt.save(out, {{"model", model}, {"optimizer", opt}, {"runtime", rt}, {"step", step}});
    }
    const auto saved = loom::checkpoint::load_value(out).toGenericDict();
    const auto group =
        saved.at("optimizer").toGenericDict().at("param_groups").toListRef()[0].toGenericDict();
    const auto& betas = group.at("betas").toTupleRef().elements();
    std::printf(
        "saved %s at step %lld: optimizer.param_groups.0 = {lr %g, betas (%g, %g), "
        "weight_decay %g, %zu params}, %zu parameter states\n",
        out.c_str(), static_cast<long long>(halfway), group.at("lr").toDouble(),
        betas[0].toDouble(), betas[1].toDouble(), group.at("weight_decay").toDouble(),
        group.at("params").toListRef().size(),
        saved.at("optimizer").toGenericDict().at("state").toGenericDict().size());

    // A fresh process would start here: a fresh model, a fresh Lion, rt.load, the second half.
    Rt rt;
    auto model = make_model();
    Lion opt(model->parameters(), LionOptions(0.5));  // options come from the checkpoint
    rt.setup(model, opt);
    int64_t step = 0;
    rt.load(out, {{"model", model}, {"optimizer", opt}, {"runtime", rt}, {"step", step}});
    train(rt, model, opt, step, steps);
    std::printf("resumed at step %lld, continued to step %lld: lr %g\n",
                static_cast<long long>(step), static_cast<long long>(steps),
                opt.param_groups()[0].options().get_lr());

    const auto a = snapshot(straight, straight_opt);
    const auto b = snapshot(model, opt);
    int64_t equal = 0;
    for (std::size_t i = 0; i < a.size(); ++i) equal += a[i].equal(b[i]) ? 1 : 0;
    std::printf("loss %.4f -> %.4f; %lld of %zu tensors (parameters and exp_avg) equal\n",
                first_loss, last_loss, static_cast<long long>(equal), a.size());
    if (equal != static_cast<int64_t>(a.size())) {
      std::printf("the continued run differs from the uninterrupted one\n");
      return 1;
    }
    std::printf("the continued run equals the uninterrupted one bitwise\n");
    std::filesystem::remove(out);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "custom_optimizer: %s\n", e.what());
    return 2;
  }
}
