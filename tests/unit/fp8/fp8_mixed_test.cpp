// The "fp8-mixed" precision on the CPU: loom::fp8::Linear as torch::nn::Linear's drop-in,
// convert_module's swaps and warnings, delayed scaling's update rule and state, selection by
// name, a small MLP against bf16-mixed, and a bitwise save/resume.
#include "support/catch.hpp"
#include "support/same_value.hpp"
#include "support/warnings.hpp"

#include <unistd.h>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <loom/loom.hpp>

using Catch::Matchers::Contains;
using Catch::Matchers::Equals;
using loom::fp8::Scaling;

namespace {

namespace fs = std::filesystem;

struct TempFile {
  fs::path path = fs::temp_directory_path() / ("loom_fp8_mixed_" + std::to_string(::getpid()) +
                                               "_" + std::to_string(++n()) + ".pt");
  ~TempFile() { fs::remove(path); }
  static int& n() {
    static int k = 0;
    return k;
  }
};

loom::fp8::LinearRecipe recipe(
    Scaling s, int64_t history = 1024,
    loom::fp8::DelayedOptions::Amax amax = loom::fp8::DelayedOptions::Amax::Max) {
  loom::fp8::LinearRecipe r;
  r.scaling = s;
  r.delayed.history_len = history;
  r.delayed.amax = amax;
  return r;
}

// A model with every case convert_module meets.
struct Net : torch::nn::Module {
  torch::nn::Sequential body{torch::nn::Linear(32, 64), torch::nn::ReLU(),
                             torch::nn::Linear(64, 10)};  // 10: not a multiple of 16
  torch::nn::Linear member{32, 32};                       // a C++ member: cannot be swapped
  loom::fp8::Linear own{32, 32};                          // enabled
  loom::fp8::Linear odd{20, 32};                          // 20: stays in bf16
  Net() {
    register_module("body", body);
    register_module("member", member);
    register_module("own", own);
    register_module("odd", odd);
  }
};

torch::nn::Sequential mlp(int64_t hidden = 64) {
  return torch::nn::Sequential(torch::nn::Linear(64, hidden), torch::nn::GELU(),
                               torch::nn::Linear(hidden, hidden), torch::nn::GELU(),
                               torch::nn::Linear(hidden, 16));
}

// A teacher's outputs on fixed inputs, plus noise of standard deviation `noise`: a regression
// the MLP can learn, whose loss cannot go below noise^2 (as with real data).
// `draw` picks the samples; the teacher is always the same.
std::pair<at::Tensor, at::Tensor> data(int64_t n, double noise = 0.0, uint64_t draw = 0) {
  at::manual_seed(1234);
  const at::Tensor w = at::randn({64, 16}) / 8.0;
  at::manual_seed(1235 + draw);
  const at::Tensor x = at::randn({n, 64});
  const at::Tensor e = at::randn({n, 16}) * noise;
  return {x, at::tanh(x.mm(w)) + 0.1 * at::sin(3.0 * x.narrow(1, 0, 16)) + e};
}

// A classification with a floor too: 16 classes drawn from a teacher's softmax (labels are
// noisy, as real ones are), so the cross-entropy cannot go below the labels' entropy.
std::pair<at::Tensor, at::Tensor> classes(int64_t n, uint64_t draw = 0) {
  at::manual_seed(4321);
  const at::Tensor w1 = at::randn({64, 64}) / 8.0, w2 = at::randn({64, 16}) / 2.0;
  at::manual_seed(4322 + draw);
  const at::Tensor x = at::randn({n, 64});
  const at::Tensor logits = at::tanh(x.mm(w1)).mm(w2) * 2.0;
  return {x, at::multinomial(at::softmax(logits, 1), 1).squeeze(1)};
}

enum class Task { Regression, Classification };

at::Tensor task_loss(Task task, const at::Tensor& out, const at::Tensor& y) {
  return task == Task::Regression ? at::mse_loss(out, y)
                                  : at::cross_entropy_loss(out.to(at::kFloat), y);
}

struct Trained {
  std::vector<double> losses;  // each step's training loss, as the run computes it
  double heldout = 0;          // held-out loss through the run's own forward
  double heldout_bf16 = 0;     // held-out loss of the final weights under bf16 autocast
};

// `steps` Adam steps of 128 fresh samples each (no sample seen twice), then the held-out
// loss on 4096 other samples, through the runtime's forward and, for the same weights, in
// bf16 (the fp8 layers outside an fp8 scope are plain linear layers).
template <class P>
Trained train_mlp(P policy, int steps, int64_t hidden, Task task = Task::Regression) {
  const int64_t n = 128 * steps;
  auto draw = [&](int64_t count, uint64_t d) {
    return task == Task::Regression ? data(count, 0.2, d) : classes(count, d);
  };
  const auto [x, y] = draw(n, 0);
  loom::seed_everything(7);
  auto model = mlp(hidden);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(3e-3));
  loom::Runtime<loom::Cpu, P> rt(loom::Cpu{}, std::move(policy));
  rt.setup(model, opt);
  Trained t;
  for (int s = 0; s < steps; ++s) {
    auto out = rt.forward(model, x.narrow(0, s * 128, 128));
    const at::Tensor loss = task_loss(task, out, y.narrow(0, s * 128, 128));
    rt.backward(loss, model);
    rt.optimizer_step(opt);
    opt.zero_grad();
    t.losses.push_back(loss.item<double>());
  }
  const auto [tx, ty] = draw(4096, /*draw=*/1);
  at::NoGradGuard no_grad;
  const at::Tensor own = task_loss(task, rt.forward(model, tx), ty);
  t.heldout = own.item<double>();
  loom::amp::AutocastGuard bf16(c10::kCPU, c10::kBFloat16);
  const at::Tensor plain = task_loss(task, model->forward(tx.to(at::kBFloat16)).to(at::kFloat), ty);
  t.heldout_bf16 = plain.item<double>();
  return t;
}

double mean_of_last(const std::vector<double>& v, std::size_t k) {
  double sum = 0;
  for (std::size_t i = v.size() - k; i < v.size(); ++i) sum += v[i];
  return sum / static_cast<double>(k);
}

}  // namespace

TEST_CASE("fp8::Linear is torch::nn::Linear outside an fp8 scope", "[fp8][module]") {
  at::manual_seed(3);
  torch::nn::Linear ref(32, 48);
  at::manual_seed(3);
  loom::fp8::Linear mine(32, 48);
  CHECK(mine->weight.equal(ref->weight));  // the same draws, bit for bit
  CHECK(mine->bias.equal(ref->bias));
  std::vector<std::string> names;
  for (const auto& p : mine->named_parameters()) names.push_back(p.key());
  CHECK(names == std::vector<std::string>{"weight", "bias"});
  const at::Tensor x = at::randn({5, 32});
  CHECK(mine->forward(x).equal(ref->forward(x)));
  mine->enable({});
  CHECK(mine->enabled());
  CHECK(mine->forward(x).equal(ref->forward(x)));  // enabled, but no scope: fp32
  {
    loom::fp8::Scope scope;
    const at::Tensor y = mine->forward(x);
    CHECK(y.scalar_type() == at::kBFloat16);
    CHECK(y.equal(loom::fp8::linear(x, ref->weight, ref->bias)));
    CHECK(!y.to(at::kFloat).equal(ref->forward(x)));  // fp8 rounding shows
  }
  loom::fp8::Linear no_bias(torch::nn::LinearOptions(16, 16).bias(false));
  CHECK(!no_bias->bias.defined());
  CHECK(no_bias->parameters().size() == 1);
  CHECK_THROWS_WITH(loom::fp8::Linear(20, 32)->enable({}),
                    Contains("multiples of 16, not 20 -> 32"));
  auto copy = std::dynamic_pointer_cast<loom::fp8::LinearImpl>(mine->clone());
  REQUIRE(copy);
  CHECK(copy->enabled());
  CHECK(copy->weight.equal(mine->weight));
  CHECK(!copy->weight.is_same(mine->weight));
}

TEST_CASE("fp8-mixed converts what it can, keeps the parameters, and names the rest",
          "[fp8][convert]") {
  auto net = std::make_shared<Net>();
  const at::Tensor w0 = net->body[0]->as<torch::nn::Linear>()->weight;
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
  loom::Runtime<loom::Cpu, loom::Fp8Mixed> rt;
  loom::testing::WarningCatcher warnings;
  rt.setup(net, opt);
  REQUIRE(warnings.messages.size() == 1);
  const std::string& w = warnings.messages[0];
  CHECK_THAT(w, Contains("fp8-mixed keeps 3 linear layer(s) in bf16"));
  CHECK_THAT(w, Contains("'body.2' (64 -> 10): not multiples of 16"));
  CHECK_THAT(w, Contains("'member' (32 -> 32): a torch::nn::Linear member, which cannot be "
                         "swapped; declare it as loom::fp8::Linear"));
  CHECK_THAT(w, Contains("'odd' (20 -> 32): not multiples of 16"));
  CHECK(rt.precision().fp8_layers() == std::vector<std::string>{"body.0", "own"});

  // body.0 is an fp8 layer now, holding the very tensor the optimizer updates.
  auto* swapped = dynamic_cast<loom::fp8::LinearImpl*>(net->body->ptr(0).get());
  REQUIRE(swapped != nullptr);
  CHECK(swapped->enabled());
  CHECK(swapped->weight.is_same(w0));
  CHECK(net->body->named_children()[0].value().get() == swapped);
  CHECK(dynamic_cast<torch::nn::LinearImpl*>(net->body->ptr(2).get()) != nullptr);
  CHECK(net->named_parameters().size() == 10);

  const at::Tensor x = at::randn({8, 32});
  const at::Tensor before = w0.clone();
  at::Tensor y;
  {
    // Net has no forward of its own: its pieces, in the runtime's forward scope.
    [[maybe_unused]] auto guard = rt.forward_context();
    y = net->body->forward(x).sum() + net->own->forward(x).sum() + net->member->forward(x).sum() +
        net->odd->forward(at::randn({8, 20})).sum();
    CHECK(net->body->forward(x).scalar_type() == at::kBFloat16);
  }
  rt.backward(y.to(at::kFloat), *net);
  CHECK(w0.grad().defined());
  CHECK(rt.optimizer_step(opt));
  CHECK(!w0.equal(before));  // the optimizer built before setup moved the fp8 layer's weight
  CHECK(w0.scalar_type() == at::kFloat);  // master weights stay fp32
}

TEST_CASE("delayed scaling follows TransformerEngine's update rule", "[fp8][delayed]") {
  using Amax = loom::fp8::DelayedOptions::Amax;
  const Amax algo = GENERATE(Amax::Max, Amax::MostRecent);
  INFO((algo == Amax::Max ? "max" : "most_recent"));
  auto model = torch::nn::Sequential(torch::nn::Linear(16, 16));
  {
    torch::NoGradGuard no_grad;
    auto& w = model[0]->as<torch::nn::Linear>()->weight;
    w.copy_(at::linspace(-0.5, 0.5, 256).reshape({16, 16}));  // amax 0.5
  }
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.0));
  loom::Runtime<loom::Cpu, loom::Fp8Mixed> rt(loom::Cpu{},
                                              loom::Fp8Mixed(recipe(Scaling::Delayed, 3, algo)));
  rt.setup(model, opt);
  auto block = rt.precision().delayed_state();
  REQUIRE(block);
  CHECK(block->amax_history.sizes() == at::IntArrayRef{3, 1, 3});
  CHECK(block->scale.equal(at::ones({1, 3})));
  auto step = [&](double x_amax, double grad) {
    at::Tensor x = at::linspace(-x_amax, x_amax, 64).reshape({4, 16});
    auto out = rt.forward(model, x);
    // d loss / d out = grad everywhere: the output gradient's amax is `grad`.
    rt.backward((out * grad).sum(), model);
    rt.optimizer_step(opt);
    opt.zero_grad();
  };
  step(2.0, 0.25);
  // x was cast to bf16 first (convert_input): 2.0 is exact. Row 0 rolled to the end.
  CHECK(block->amax_history.select(0, 2).squeeze(0).equal(at::tensor({2.0f, 0.5f, 0.25f})));
  CHECK(block->amax_history.select(0, 0).abs().sum().item<double>() == 0.0);
  const float e4m3 = 448.0f, e5m2 = 57344.0f;
  CHECK(block->scale[0][0].item<float>() == Approx(e4m3 / 2.0f).epsilon(1e-6));
  CHECK(block->scale[0][1].item<float>() == Approx(e4m3 / 0.5f).epsilon(1e-6));
  CHECK(block->scale[0][2].item<float>() == Approx(e5m2 / 0.25f).epsilon(1e-6));
  step(1.0, 0.25);
  // Max: the history still holds 2.0; MostRecent: 1.0 alone.
  CHECK(block->scale[0][0].item<float>() ==
        Approx(algo == Amax::Max ? e4m3 / 2.0f : e4m3 / 1.0f).epsilon(1e-6));
  // A non-finite input: the output is nan, never finite; the scale is kept.
  const at::Tensor kept = block->scale.clone();
  at::Tensor bad = at::ones({4, 16});
  bad[1][3] = std::numeric_limits<float>::infinity();
  auto out = rt.forward(model, bad);
  CHECK(out.isnan().all().item<bool>());
  rt.backward(out.sum(), model);
  rt.optimizer_step(opt);
  opt.zero_grad();
  CHECK(block->scale.select(1, 0).equal(kept.select(1, 0)));
  CHECK(std::isinf(block->amax_history[2][0][0].item<float>()));
}

TEST_CASE("fp8-mixed's state: delayed histories save, load and are checked by name",
          "[fp8][state]") {
  auto model = mlp();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01));
  loom::Runtime<loom::Cpu, loom::Fp8Mixed> rt(loom::Cpu{},
                                              loom::Fp8Mixed(recipe(Scaling::Delayed, 8)));
  rt.setup(model, opt);
  auto out = rt.forward(model, at::randn({4, 64}));
  rt.backward(out.sum(), model);
  rt.optimizer_step(opt);
  const loom::StateDict s = rt.precision().state_dict();
  std::vector<std::string> keys;
  for (const auto& [k, v] : s) keys.push_back(k);
  CHECK(keys == std::vector<std::string>{"fp8.0.amax_history", "fp8.0.scale", "fp8.2.amax_history",
                                         "fp8.2.scale", "fp8.4.amax_history", "fp8.4.scale"});
  CHECK(s.at("fp8.2.amax_history").toTensor().sizes() == at::IntArrayRef{8, 3});
  CHECK(s.at("fp8.2.scale").toTensor().sizes() == at::IntArrayRef{3});

  auto model2 = mlp();
  torch::optim::SGD opt2(model2->parameters(), torch::optim::SGDOptions(0.01));
  loom::Fp8Mixed p2(recipe(Scaling::Delayed, 8));
  CHECK_THROWS_WITH(p2.load_state_dict(s), Contains("loads after setup()"));
  loom::Runtime<loom::Cpu, loom::Fp8Mixed> rt2(loom::Cpu{}, std::move(p2));
  rt2.setup(model2, opt2);
  rt2.precision().load_state_dict(s);
  CHECK(rt2.precision().delayed_state()->scale.equal(rt.precision().delayed_state()->scale));
  CHECK(rt2.precision().delayed_state()->amax_history.equal(
      rt.precision().delayed_state()->amax_history));

  auto missing = s;
  missing.erase("fp8.4.scale");
  CHECK_THROWS_WITH(
      rt2.precision().load_state_dict(missing),
      Equals("loom::precision::Fp8Mixed::load_state_dict: missing key \"fp8.4.scale\""));
  auto extra = s;
  extra["fp8.9.scale"] = at::ones({3});
  CHECK_THROWS_WITH(
      rt2.precision().load_state_dict(extra),
      Equals("loom::precision::Fp8Mixed::load_state_dict: unexpected key(s) \"fp8.9.scale\""));
  loom::Runtime<loom::Cpu, loom::Fp8Mixed> rt3(loom::Cpu{},
                                               loom::Fp8Mixed(recipe(Scaling::Delayed, 4)));
  auto model3 = mlp();
  rt3.setup(model3);
  CHECK_THROWS_WITH(
      rt3.precision().load_state_dict(s),
      Contains("loom::precision::Fp8Mixed::load_state_dict: key \"fp8.0.amax_history\": "
               "expected a tensor of shape [4, 3], got [8, 3]"));
  // Dynamic scaling keeps no state and takes none.
  loom::Fp8Mixed dynamic;
  CHECK(dynamic.state_dict().empty());
  CHECK_THROWS_WITH(dynamic.load_state_dict(s), Contains("has no state"));
  CHECK_THROWS_WITH(loom::Fp8Mixed(loom::fp8::LinearRecipe{.grad_dtype = at::kHalf}),
                    Contains("is not an fp8 format"));
}

TEST_CASE("fp8-mixed is selected by name, and transformer-engine names it", "[fp8][select]") {
  STATIC_REQUIRE(std::is_same_v<loom::precision_t<"fp8-mixed">, loom::Fp8Mixed>);
  STATIC_REQUIRE(loom::PrecisionPolicy<loom::Fp8Mixed>);
  CHECK(std::string(loom::precision::allowed_names).find("\"fp8-mixed\"") != std::string::npos);
  auto name = [](auto p) { return std::string(decltype(p)::precision()); };
  CHECK(loom::with_precision("fp8-mixed", name) == "fp8-mixed");
  auto scaling = [](auto p) {
    if constexpr (std::is_same_v<decltype(p), loom::Fp8Mixed>) {
      return static_cast<int>(p.recipe().scaling);
    } else {
      return -1;
    }
  };
  CHECK(loom::with_precision("fp8-mixed", scaling, {.fp8 = recipe(Scaling::Rowwise)}) ==
        static_cast<int>(Scaling::Rowwise));
  CHECK_THROWS_WITH(loom::with_precision("transformer-engine", name),
                    Contains("not supported by loom; its native alternative is \"fp8-mixed\""));
  loom::Fp8Mixed p;
  CHECK_NOTHROW(p.bind_device(c10::Device(c10::kCPU)));
}

namespace {

// An fp8-mixed run's losses against bf16-mixed's, in percent, printed on one line.
struct Against {
  double learned;   // held-out, the final weights evaluated in bf16
  double forward;   // held-out, through the run's own forward
  double training;  // the training loss of the last 50 steps
};

Against against(const char* task, Scaling s, const Trained& bf16, const Trained& fp8) {
  auto pct = [](double got, double ref) { return 100.0 * (got - ref) / ref; };
  const double train_ref = mean_of_last(bf16.losses, 50), train = mean_of_last(fp8.losses, 50);
  const Against a{pct(fp8.heldout_bf16, bf16.heldout_bf16), pct(fp8.heldout, bf16.heldout),
                  pct(train, train_ref)};
  std::printf(
      "[fp8] %s %-10s held-out loss, final weights in bf16: bf16-mixed %.5f, fp8-mixed "
      "%.5f (%+.2f%%); through the run's forward: %.5f (%+.2f%%); training loss, last "
      "50 steps: %.5f vs %.5f (%+.2f%%); first step %.4f\n",
      task,
      s == Scaling::Tensorwise ? "tensorwise"
      : s == Scaling::Rowwise  ? "rowwise"
                               : "delayed",
      bf16.heldout_bf16, fp8.heldout_bf16, a.learned, fp8.heldout, a.forward, train_ref, train,
      a.training, bf16.losses.front());
  return a;
}

}  // namespace

TEST_CASE("fp8-mixed trains a small MLP as well as bf16-mixed", "[fp8][train][.slow]") {
  // MLP 64-256-256-16 (GELU), a teacher plus noise of variance 0.04 (the loss's floor),
  // 600 steps from the same weights on the same batches (bf16-mixed's run, seeded, made once
  // for the three scalings).
  const int steps = 600;
  static const auto bf16 = train_mlp(loom::Bf16Mixed{}, steps, 256);
  const auto s = GENERATE(Scaling::Tensorwise, Scaling::Rowwise, Scaling::Delayed);
  const auto fp8 = train_mlp(loom::Fp8Mixed(recipe(s, 16)), steps, 256);
  const Against a = against("regression", s, bf16, fp8);
  CHECK(bf16.losses.front() > 5 * bf16.heldout);  // it learned, towards the floor of 0.04
  CHECK(bf16.heldout == bf16.heldout_bf16);       // bf16-mixed's forward is bf16 autocast
  // What was learned: the same weights' loss within 1% of bf16-mixed's.
  CHECK(std::abs(a.learned) <= 1.0);
  // The fp8 forward's own rounding adds to its loss: within 1.5%.
  CHECK(std::abs(a.forward) <= 1.5);
  CHECK(std::abs(a.training) <= 1.5);
}

TEST_CASE("fp8-mixed trains a small MLP classifier as well as bf16-mixed", "[fp8][train][.slow]") {
  // MLP 64-256-256-16 (GELU), cross-entropy on 16 noisy classes (the labels' entropy is the
  // loss's floor), 600 steps from the same weights on the same batches (bf16-mixed's once).
  const int steps = 600;
  static const auto bf16 = train_mlp(loom::Bf16Mixed{}, steps, 256, Task::Classification);
  const auto s = GENERATE(Scaling::Tensorwise, Scaling::Rowwise, Scaling::Delayed);
  const auto fp8 = train_mlp(loom::Fp8Mixed(recipe(s, 16)), steps, 256, Task::Classification);
  const Against a = against("classifier", s, bf16, fp8);
  CHECK(bf16.losses.front() > 1.5 * bf16.heldout);  // it learned
  CHECK(bf16.heldout == bf16.heldout_bf16);
  // Every loss within 1% of bf16-mixed's: what was learned, the fp8 forward's own, training.
  CHECK(std::abs(a.learned) <= 1.0);
  CHECK(std::abs(a.forward) <= 1.0);
  CHECK(std::abs(a.training) <= 1.0);
}

TEST_CASE("an fp8-mixed run saved and resumed is bitwise the straight run", "[fp8][resume]") {
  const auto s = GENERATE(Scaling::Tensorwise, Scaling::Delayed);
  INFO((s == Scaling::Delayed ? "delayed" : "tensorwise"));
  const auto xy = data(64);  // (lambdas cannot capture structured bindings in Clang 14)
  const at::Tensor &x = xy.first, &y = xy.second;
  auto run = [&](auto& rt, auto& model, auto& opt, int from, int to) {
    for (int i = from; i < to; ++i) {
      const auto k = (i * 16) % 64;
      auto out = rt.forward(model, x.narrow(0, k, 16));
      rt.backward(at::mse_loss(out, y.narrow(0, k, 16)), model);
      rt.optimizer_step(opt);
      opt.zero_grad();
    }
  };
  using RT = loom::Runtime<loom::Cpu, loom::Fp8Mixed>;
  auto make = [&](unsigned seed) {
    loom::seed_everything(seed);
    auto model = mlp();
    auto opt =
        std::make_shared<loom::optim::Adam>(model->parameters(), loom::optim::AdamOptions(1e-3));
    auto rt = std::make_shared<RT>(loom::Cpu{}, loom::Fp8Mixed(recipe(s, 4)));
    rt->setup(model, *opt);
    return std::make_tuple(model, opt, rt);
  };
  TempFile mid, ref, resumed;
  auto [m1, o1, r1] = make(5);
  run(*r1, m1, *o1, 0, 6);
  r1->save(mid.path, {{"model", m1}, {"optimizer", *o1}, {"runtime", *r1}});
  run(*r1, m1, *o1, 6, 11);
  r1->save(ref.path, {{"model", m1}, {"optimizer", *o1}, {"runtime", *r1}});

  auto [m2, o2, r2] = make(77);
  r2->load(mid.path, {{"model", m2}, {"optimizer", *o2}, {"runtime", *r2}});
  run(*r2, m2, *o2, 6, 11);
  r2->save(resumed.path, {{"model", m2}, {"optimizer", *o2}, {"runtime", *r2}});
  const auto a = loom::checkpoint::load_value(ref.path).toGenericDict();
  const auto b = loom::checkpoint::load_value(resumed.path).toGenericDict();
  for (const char* key : {"model", "optimizer", "runtime"}) {
    INFO(key);
    CHECK(loom::testing::difference(a.at(key), b.at(key)) == "");
  }
  const auto state = a.at("runtime").toGenericDict().at("precision_state").toGenericDict();
  CHECK(state.size() == (s == Scaling::Delayed ? 6u : 0u));
  if (s == Scaling::Delayed) {
    // Resuming without the histories would not be bitwise: the check above can fail.
    CHECK(state.at("fp8.2.amax_history").toTensor().abs().sum().item<double>() > 0);
  }
  // An fp8-mixed checkpoint's histories cannot go to bf16-mixed: named, as for the scaler.
  if (s == Scaling::Delayed) {
    loom::Runtime<loom::Cpu, loom::Bf16Mixed> bf;
    auto m3 = mlp();
    CHECK_THROWS_WITH(bf.load(ref.path, {{"model", m3}, {"runtime", bf}}),
                      Contains("precision \"fp8-mixed\""));
  }
}
