// rt.save / rt.load: a whole training state in place, strict key checks, precisions crossed,
// RNG and seeds, the Python optimizer layout both ways, entry_traits and each entry's kind.
#include "support/catch.hpp"
#include "support/same_value.hpp"
#include "support/warnings.hpp"

#include <unistd.h>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <loom/loom.hpp>

using Catch::Matchers::Contains;

namespace {

namespace fs = std::filesystem;

/// A fresh directory under the system temp dir, removed with the object.
struct TempDir {
  fs::path path = fs::temp_directory_path() / ("loom_save_load_" + std::to_string(::getpid()) +
                                               "_" + std::to_string(++count()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
  static int& count() {
    static int n = 0;
    return n;
  }
};

torch::nn::Sequential make_model() {
  return torch::nn::Sequential(torch::nn::Linear(6, 8), torch::nn::BatchNorm1d(8),
                               torch::nn::ReLU(), torch::nn::Dropout(0.25),
                               torch::nn::Linear(8, 3));
}

/// `steps` training steps on fixed data, with dropout drawing from the CPU generator.
template <class RT, class Opt>
void train(RT& rt, torch::nn::Sequential& model, Opt& opt, int steps) {
  for (int i = 0; i < steps; ++i) {
    auto x = at::arange(48, at::kFloat).reshape({8, 6}).sin() * (i + 1);
    auto y = at::arange(8, at::kLong) % 3;
    auto out = rt.forward(model, x);
    auto loss = at::cross_entropy_loss(out, y);
    rt.backward(loss, model);
    rt.optimizer_step(opt);
    opt.zero_grad();
  }
}

}  // namespace

// A type with no state members, checkpointed through a specialisation of
// loom::state::entry_traits (docs/checkpoints.md, "Your own types", quotes it).
namespace geo {
struct Point {
  double x = 0;
  double y = 0;
};
}  // namespace geo

template <>
struct loom::state::entry_traits<geo::Point> {
  static constexpr loom::state::EntryKind kind = loom::state::EntryKind::Object;
  static constexpr bool copies_tensors = false;

  static c10::IValue save(geo::Point& p, const std::string&) {
    auto d = loom::state::new_dict();
    d.insert("x", p.x);
    d.insert("y", p.y);
    return d;
  }
  static void load(geo::Point& p, const c10::IValue& value, const std::string& path,
                   const loom::LoadOptions&) {
    loom::state::Reader r("loom::load", value, path);  // errors name "origin.x"
    p.x = r.number("x");
    p.y = r.number("y");
    r.finish();
  }
};

TEST_CASE("module_state has Python's state_dict names in Python's order", "[checkpoint][state]") {
  auto model = make_model();
  auto d = loom::state::module_state(*model);
  std::vector<std::string> keys;
  for (const auto& e : d) keys.push_back(e.key().toStringRef());
  CHECK(keys == std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias",
                                         "1.running_mean", "1.running_var", "1.num_batches_tracked",
                                         "4.weight", "4.bias"});
}

TEST_CASE("rt.save then rt.load restores a 16-mixed training state bitwise in place",
          "[checkpoint][state]") {
  TempDir dir;
  const auto file = dir.path / "last.pt";
  loom::seed_everything(11);
  loom::Runtime<loom::Cpu, loom::Fp16Mixed> rt;
  auto model = make_model();
  loom::optim::Adam opt(model->parameters(), loom::optim::AdamOptions(1e-2));
  rt.setup(model, opt);
  loom::optim::StepLR sched(opt, 2, 0.5);
  loom::DistributedSampler sampler(20, loom::DistributedSamplerOptions{});
  sampler.set_epoch(3);
  sampler.reset();
  sampler.next(5);
  train(rt, model, opt, 3);
  sched.step();
  int64_t step = 3;
  double best = 0.25;
  std::string tag = "run-a";
  at::Tensor extra = at::arange(4, at::kFloat);
  loom::State state{{"model", model},     {"optimizer", opt},   {"runtime", rt},
                    {"scheduler", sched}, {"sampler", sampler}, {"step", step},
                    {"best", best},       {"tag", tag},         {"extra", extra}};
  rt.save(file, state);
  const c10::IValue saved = loom::checkpoint::load_value(file);
  {
    const auto d = saved.toGenericDict();
    std::vector<std::string> keys;
    for (const auto& e : d) keys.push_back(e.key().toStringRef());
    CHECK(keys == std::vector<std::string>{"model", "optimizer", "runtime", "scheduler", "sampler",
                                           "step", "best", "tag", "extra"});
    const auto runtime = d.at("runtime").toGenericDict();
    CHECK(runtime.at("precision").toStringRef() == "16-mixed");
    const auto scaler = runtime.at("precision_state").toGenericDict();
    CHECK(scaler.size() == 5);  // GradScaler.state_dict()'s five keys
    CHECK(scaler.at("_growth_tracker").isInt());
    CHECK(runtime.at("device").toList().size() == 1);
    CHECK(runtime.at("device").toList().get(0).toGenericDict().at("torch").toTensor().numel() ==
          5056);
    const auto groups = d.at("optimizer").toGenericDict().at("param_groups").toList();
    CHECK(groups.get(0).toGenericDict().at("fused").toBool());
    CHECK(groups.get(0).toGenericDict().at("betas").isTuple());
  }
  // What the next steps give: the reference.
  train(rt, model, opt, 2);
  rt.save(dir.path / "ref.pt", state);
  const c10::IValue after = loom::checkpoint::load_value(dir.path / "ref.pt");

  // Everything fresh, loaded from the file, two more steps: the same bits.
  loom::seed_everything(99);
  loom::Runtime<loom::Cpu, loom::Fp16Mixed> rt2;
  auto model2 = make_model();
  loom::optim::Adam opt2(model2->parameters(), loom::optim::AdamOptions(1.0));
  rt2.setup(model2, opt2);
  loom::optim::StepLR sched2(opt2, 7, 0.1);
  loom::DistributedSampler sampler2(20, loom::DistributedSamplerOptions{});
  int64_t step2 = 0;
  double best2 = 0;
  std::string tag2;
  at::Tensor extra2 = at::zeros({4});
  loom::State state2{{"model", model2},     {"optimizer", opt2},   {"runtime", rt2},
                     {"scheduler", sched2}, {"sampler", sampler2}, {"step", step2},
                     {"best", best2},       {"tag", tag2},         {"extra", extra2}};
  const auto rest = rt2.load(file, state2);
  CHECK(rest.empty());
  CHECK(step2 == 3);
  CHECK(best2 == 0.25);
  CHECK(tag2 == "run-a");
  CHECK(extra2.equal(extra));
  CHECK(sampler2.epoch() == 3);
  loom::DistributedSampler fresh(20, loom::DistributedSamplerOptions{});
  fresh.set_epoch(3);
  fresh.reset();
  fresh.next(5);
  CHECK(*sampler2.next(3) == *fresh.next(3));  // epoch 3, from its sixth index on
  train(rt2, model2, opt2, 2);
  rt2.save(dir.path / "resumed.pt", state2);
  const c10::IValue resumed = loom::checkpoint::load_value(dir.path / "resumed.pt");
  auto a = after.toGenericDict(), b = resumed.toGenericDict();
  for (const char* key : {"model", "optimizer", "runtime", "scheduler"}) {
    INFO(key);
    CHECK(loom::testing::difference(a.at(key), b.at(key)) == "");
  }
}

TEST_CASE("rt.load names what does not fit, and returns what it was not asked for",
          "[checkpoint][state]") {
  TempDir dir;
  const auto file = dir.path / "ck.pt";
  loom::Runtime<loom::Cpu, loom::Fp32> rt;
  auto model = make_model();
  loom::optim::Adam opt(model->parameters(), loom::optim::AdamOptions(1e-2));
  rt.setup(model, opt);
  train(rt, model, opt, 1);
  int64_t epoch = 4;
  rt.save(file, {{"model", model}, {"optimizer", opt}, {"epoch", epoch}});

  SECTION("extras come back") {
    auto rest = rt.load(file, {{"model", model}});
    CHECK(rest.size() == 2);
    CHECK(rest.at("epoch").toInt() == 4);
    CHECK(rest.at("optimizer").isGenericDict());
  }
  SECTION("a name the file lacks") {
    int64_t step = 0;
    CHECK_THROWS_WITH(rt.load(file, {{"step", step}}),
                      Contains("'step' is not in the checkpoint") && Contains("strict=true"));
    loom::testing::WarningCatcher warnings;
    CHECK_NOTHROW(rt.load(file, {{"step", step}}, /*strict=*/false));
    REQUIRE(warnings.messages.size() == 1);
    CHECK_THAT(warnings.messages[0], Contains("'step' is not in the checkpoint"));
  }
  SECTION("a module of another shape, with other keys") {
    torch::nn::Sequential other(torch::nn::Linear(6, 9), torch::nn::ReLU(),
                                torch::nn::Linear(9, 3));
    const auto before = other[0]->as<torch::nn::Linear>()->weight.clone();
    CHECK_THROWS_WITH(rt.load(file, {{"model", other}}),
                      Contains("loom::load: key \"model\": does not fit the module") &&
                          Contains("'0.weight' has shape [8, 6] in the checkpoint and [9, 6]") &&
                          Contains("\n  unexpected key(s) (7): 1.weight, 1.bias, 1.running_mean, "
                                   "1.running_var, 1.num_batches_tracked, ... and 2 more") &&
                          Contains("\n  missing key(s) (2): 2.weight, 2.bias") &&
                          Contains("strict = false"));
    CHECK(other[0]->as<torch::nn::Linear>()->weight.equal(before));  // nothing copied
  }
  SECTION("a module with many other keys: a few per line and a count") {
    torch::nn::Sequential many;
    for (int i = 0; i < 40; ++i) many->push_back(torch::nn::Linear(2, 2));
    std::string message;
    try {
      rt.load(file, {{"model", many}});
    } catch (const loom::Error& e) {
      message = e.what();
    }
    CHECK_THAT(message, Contains("\n  mismatched (6): '0.weight' has shape [8, 6]"));
    CHECK_THAT(message, Contains("\n  missing key(s) (74): 2.weight, 2.bias, 3.weight, 3.bias, "
                                 "5.weight, ... and 69 more"));
    CHECK_THAT(message, !Contains("39.bias"));
    // Short: what rt.load adds (the file, "does not fit this run") aside, a few lines.
    CHECK_THAT(message, Contains(file.string() + " does not fit this run: "));
    CHECK(message.size() - file.string().size() < 700);
  }
  SECTION("an integer tensor where the module has floats") {
    auto d = loom::state::module_state(*model);
    d.insert_or_assign("0.bias", at::zeros({8}, at::kLong));
    CHECK_THROWS_WITH(loom::state::load_module_state(*model, d, "model"),
                      Contains("'0.bias' is Long in the checkpoint and Float in the module"));
  }
  SECTION("another optimizer's state") {
    loom::optim::SGD sgd(model->parameters(), loom::optim::SGDOptions(0.1));
    CHECK_THROWS_WITH(rt.load(file, {{"optimizer", sgd}}),
                      Contains("optimizer.param_groups.0") && Contains("holds Adam's options"));
    loom::optim::AdamW adamw(model->parameters(), loom::optim::AdamWOptions(0.1));
    CHECK_THROWS_WITH(rt.load(file, {{"optimizer", adamw}}),
                      Contains("optimizer.param_groups.0.decoupled_weight_decay") &&
                          Contains("holds Adam's state, the optimizer is AdamW"));
    CHECK(adamw.state().empty());
  }
  SECTION("a file that is not a checkpoint") {
    std::ofstream(dir.path / "bad.pt") << "not a zip";
    CHECK_THROWS_AS(rt.load(dir.path / "bad.pt", {{"model", model}}), loom::Error);
  }
  SECTION("an object loom cannot checkpoint is a compile error; a name twice is an error") {
    CHECK_THROWS_WITH(rt.save(dir.path / "twice.pt", {{"a", epoch}, {"a", epoch}}),
                      Contains("names 'a' twice"));
    CHECK_FALSE(fs::exists(dir.path / "twice.pt"));
  }
}

TEST_CASE("entry_traits checkpoints a type of the user's; each entry has its kind",
          "[checkpoint][state]") {
  TempDir tmp;
  const fs::path dir = tmp.path;
  loom::Runtime<loom::Cpu, loom::Fp32> rt;
  auto model = make_model();
  loom::optim::Adam opt(model->parameters(), loom::optim::AdamOptions(1e-2));
  rt.setup(model, opt);

  geo::Point origin{1.5, -2.0};
  loom::State state{{"model", model}, {"origin", origin}};
  rt.save(dir / "point.pt", state);
  const auto saved = loom::checkpoint::load_value(dir / "point.pt").toGenericDict();
  const auto xy = saved.at("origin").toGenericDict();
  CHECK(xy.size() == 2);
  CHECK(xy.at("x").toDouble() == 1.5);
  CHECK(xy.at("y").toDouble() == -2.0);
  geo::Point back;
  CHECK(rt.load(dir / "point.pt", {{"model", model}, {"origin", back}}).empty());
  CHECK(back.x == 1.5);
  CHECK(back.y == -2.0);

  // StateEntry itself: the traits' kind and copies_tensors, save and load, errors by path.
  loom::StateEntry entry("origin", back);
  CHECK(entry.kind() == loom::state::EntryKind::Object);
  CHECK_FALSE(entry.copies_tensors());
  geo::Point other{3.0, 4.0};
  entry.load(loom::StateEntry("other", other).save(), loom::LoadOptions{});
  CHECK(back.x == 3.0);
  CHECK(back.y == 4.0);
  auto bad = loom::state::new_dict();
  bad.insert("x", "three");
  bad.insert("y", 4.0);
  CHECK_THROWS_WITH(entry.load(bad, loom::LoadOptions{}),
                    Contains("loom::load: key \"origin.x\": expected a number, got a str"));
  const geo::Point fixed{5.0, 6.0};
  loom::StateEntry frozen("fixed", fixed);
  CHECK(frozen.save().toGenericDict().at("x").toDouble() == 5.0);
  CHECK_THROWS_WITH(frozen.load(bad, loom::LoadOptions{}),
                    Contains("loom::load: key \"fixed\": refers to a const object, which cannot "
                             "be loaded"));

  // loom's own specialisations.
  using loom::state::EntryKind;
  torch::optim::SGD torch_sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  loom::optim::StepLR sched(opt, 2, 0.5);
  loom::DistributedSampler sampler(20, loom::DistributedSamplerOptions{});
  loom::amp::GradScaler scaler;
  loom::optim::EMA ema(*model);
  int64_t step = 3;
  std::uint16_t width = 2;
  double best = 0.5;
  bool done = false;
  std::string tag = "run";
  at::Tensor extra = at::zeros({2});
  c10::IValue any(1.0);
  const loom::State kinds{
      {"model", model}, {"module", *model},   {"optimizer", opt},   {"torch_sgd", torch_sgd},
      {"runtime", rt},  {"scheduler", sched}, {"sampler", sampler}, {"scaler", scaler},
      {"ema", ema},     {"step", step},       {"width", width},     {"best", best},
      {"done", done},   {"tag", tag},         {"extra", extra},     {"any", any}};
  const std::vector<EntryKind> expected{
      EntryKind::Module,  EntryKind::Module, EntryKind::Optimizer, EntryKind::Optimizer,
      EntryKind::Runtime, EntryKind::Object, EntryKind::Object,    EntryKind::Object,
      EntryKind::Object,  EntryKind::Value,  EntryKind::Value,     EntryKind::Value,
      EntryKind::Value,   EntryKind::Value,  EntryKind::Value,     EntryKind::Value};
  REQUIRE(kinds.size() == expected.size());
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    INFO(kinds[i].name());
    CHECK(kinds[i].kind() == expected[i]);
    const bool copies = expected[i] == EntryKind::Module || expected[i] == EntryKind::Optimizer;
    CHECK(kinds[i].copies_tensors() == copies);
    // The object of a module or optimizer entry, for a strategy that maps its shards.
    CHECK((kinds[i].module() != nullptr) == (expected[i] == EntryKind::Module));
    CHECK((kinds[i].optimizer() != nullptr) == (expected[i] == EntryKind::Optimizer));
  }
  CHECK(kinds[0].module() == model.get());
  CHECK(kinds[1].module() == model.get());
  CHECK(kinds[2].optimizer() == &opt);
  CHECK(kinds[3].optimizer() == &torch_sgd);
  // A Runtime has state_dict() too, and still saves as the runtime's entry.
  CHECK(loom::StateEntry("runtime", rt).save().toGenericDict().contains("precision"));
  CHECK(loom::StateEntry("width", width).save().toInt() == 2);
  CHECK(loom::StateEntry("best", best).save().toDouble() == 0.5);
}

TEST_CASE("model and optimizer states cross precisions, the GradScaler does not",
          "[checkpoint][state]") {
  TempDir dir;
  const auto file = dir.path / "fp32.pt";
  loom::seed_everything(3);
  loom::Runtime<loom::Cpu, loom::Fp32> rt;
  auto model = make_model();
  loom::optim::Adam opt(model->parameters(), loom::optim::AdamOptions(1e-2));
  rt.setup(model, opt);
  train(rt, model, opt, 2);
  rt.save(file, {{"model", model}, {"optimizer", opt}, {"runtime", rt}});

  SECTION("an fp32 checkpoint fine-tunes in bf16-true: weights and state cast") {
    loom::Runtime<loom::Cpu, loom::Bf16True> bf;
    auto m = make_model();
    loom::optim::Adam o(m->parameters(), loom::optim::AdamOptions(1.0));
    bf.setup(m, o);
    bf.load(file, {{"model", m}, {"optimizer", o}, {"runtime", bf}});
    auto w = m[0]->as<torch::nn::Linear>()->weight;
    CHECK(w.scalar_type() == at::kBFloat16);
    CHECK(w.equal(model[0]->as<torch::nn::Linear>()->weight.to(at::kBFloat16)));
    const auto& s =
        static_cast<const loom::optim::AdamParamState&>(*o.state().at(w.unsafeGetTensorImpl()));
    CHECK(s.exp_avg().scalar_type() == at::kBFloat16);
    CHECK(s.step().item<float>() == 2.0f);
    CHECK(static_cast<const loom::optim::AdamOptions&>(o.param_groups()[0].options()).lr() ==
          1e-2);         // the checkpoint's options, as Python's load_state_dict
    train(bf, m, o, 1);  // and it trains
  }
  SECTION("16-mixed from a 32-true file: the scaler's state is missing") {
    loom::Runtime<loom::Cpu, loom::Fp16Mixed> mixed;
    auto m = make_model();
    loom::optim::Adam o(m->parameters(), loom::optim::AdamOptions(1.0));
    mixed.setup(m, o);
    CHECK_THROWS_WITH(mixed.load(file, {{"model", m}, {"runtime", mixed}}),
                      Contains("loom::load: key \"runtime.precision_state\": ") &&
                          Contains("saved under precision \"32-true\", which has no state") &&
                          Contains("\"16-mixed\" needs its own (_growth_tracker"));
    loom::testing::WarningCatcher warnings;
    CHECK_NOTHROW(mixed.load(file, {{"model", m}, {"runtime", mixed}}, /*strict=*/false));
    REQUIRE(warnings.messages.size() == 1);
    CHECK_THAT(warnings.messages[0], Contains("not restored (strict=false)"));
    CHECK(mixed.loss_scale() == 65536.0);
  }
  SECTION("bf16-mixed from a 16-mixed file: the scaler's state is refused by name") {
    loom::Runtime<loom::Cpu, loom::Fp16Mixed> mixed;
    auto m = make_model();
    loom::optim::Adam o(m->parameters(), loom::optim::AdamOptions(1e-2));
    mixed.setup(m, o);
    train(mixed, m, o, 1);
    mixed.save(dir.path / "fp16.pt", {{"model", m}, {"runtime", mixed}});
    loom::Runtime<loom::Cpu, loom::Bf16Mixed> bf;
    CHECK_THROWS_WITH(bf.load(dir.path / "fp16.pt", {{"model", m}, {"runtime", bf}}),
                      Contains("loom::load: key \"runtime.precision_state\": ") &&
                          Contains("holds the state of precision \"16-mixed\"") &&
                          Contains("\"bf16-mixed\" cannot use"));
    loom::testing::WarningCatcher warnings;
    CHECK_NOTHROW(bf.load(dir.path / "fp16.pt", {{"model", m}, {"runtime", bf}}, false));
    CHECK(warnings.messages.size() == 1);
  }
}

TEST_CASE("LibTorch's optimizers save in Python's layout and load back", "[checkpoint][state]") {
  auto model = make_model();
  loom::Runtime<loom::Cpu, loom::Fp32> rt;
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-2).amsgrad(true));
  rt.setup(model, adam);
  train(rt, model, adam, 3);
  const auto d = loom::state::optimizer_state(adam);
  const auto groups = d.at("param_groups").toList();
  const auto g = groups.get(0).toGenericDict();
  std::vector<std::string> keys;
  for (const auto& e : g) keys.push_back(e.key().toStringRef());
  CHECK(keys == std::vector<std::string>{"lr", "betas", "eps", "weight_decay", "amsgrad",
                                         "maximize", "foreach", "capturable", "differentiable",
                                         "fused", "decoupled_weight_decay", "params"});
  CHECK(g.at("fused").isNone());
  CHECK(g.at("params").toIntVector() == std::vector<int64_t>{0, 1, 2, 3, 4, 5});
  const auto st = d.at("state").toGenericDict();
  CHECK(st.size() == 6);
  const auto s0 = st.at(0).toGenericDict();
  CHECK(s0.at("step").toTensor().scalar_type() == at::kFloat);
  CHECK(s0.at("step").toTensor().item<float>() == 3.0f);
  CHECK(s0.contains("max_exp_avg_sq"));

  torch::optim::Adam back(model->parameters(), torch::optim::AdamOptions(5.0));
  loom::state::load_optimizer_state(back, d);
  CHECK(loom::testing::difference(loom::state::optimizer_state(back), d) == "");
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  CHECK_THROWS_WITH(loom::state::load_optimizer_state(sgd, d), Contains("holds Adam's options"));

  auto maximize = loom::state::optimizer_state(
      loom::optim::Adam(model->parameters(), loom::optim::AdamOptions(1e-2).maximize(true)));
  CHECK_THROWS_WITH(loom::state::load_optimizer_state(back, maximize),
                    Contains("optimizer.param_groups.0.maximize") &&
                        Contains("LibTorch's optimizers have no maximize"));
}

TEST_CASE("a loaded optimizer keeps the file's tensors only when nothing else uses them",
          "[checkpoint][state]") {
  auto model = make_model();
  loom::Runtime<loom::Cpu, loom::Fp32> rt;
  loom::optim::Adam adam(model->parameters(), loom::optim::AdamOptions(1e-2));
  rt.setup(model, adam);
  train(rt, model, adam, 2);
  const auto p0 = model->parameters()[0];
  auto exp_avg = [](torch::optim::Optimizer& o, const at::Tensor& p) {
    return static_cast<loom::optim::AdamParamState&>(*o.state().at(p.unsafeGetTensorImpl()))
        .exp_avg();
  };
  // A state freshly read (its tensors owned by the dict alone): kept with adopt, copied without.
  const auto fresh = loom::checkpoint::load_bytes(
      loom::checkpoint::save_bytes(loom::state::optimizer_state(adam)));
  const auto fresh_avg =
      fresh.toGenericDict().at("state").toGenericDict().at(0).toGenericDict().at("exp_avg");
  loom::optim::Adam a(model->parameters(), loom::optim::AdamOptions(1e-2));
  loom::state::load_optimizer_state(a, fresh, "optimizer", /*adopt=*/true);
  CHECK(exp_avg(a, p0).is_same(fresh_avg.toTensor()));
  loom::optim::Adam b(model->parameters(), loom::optim::AdamOptions(1e-2));
  loom::state::load_optimizer_state(b, fresh);
  CHECK_FALSE(exp_avg(b, p0).is_alias_of(fresh_avg.toTensor()));
  CHECK(exp_avg(b, p0).equal(exp_avg(adam, p0)));
  // Another optimizer's live state is copied even with adopt: the two never share a tensor.
  loom::optim::Adam c(model->parameters(), loom::optim::AdamOptions(1e-2));
  loom::state::load_optimizer_state(c, loom::state::optimizer_state(adam), "optimizer", true);
  CHECK_FALSE(exp_avg(c, p0).is_alias_of(exp_avg(adam, p0)));
  // Two states sharing one storage in the file are split apart.
  auto shared = loom::state::optimizer_state(adam);
  auto s0 = shared.at("state").toGenericDict().at(0).toGenericDict();
  const auto both = at::zeros({2, p0.numel()});
  s0.insert_or_assign("exp_avg", both[0].view(p0.sizes()));
  s0.insert_or_assign("exp_avg_sq", both[1].view(p0.sizes()));
  const auto split = loom::checkpoint::load_bytes(loom::checkpoint::save_bytes(shared));
  loom::optim::Adam e(model->parameters(), loom::optim::AdamOptions(1e-2));
  loom::state::load_optimizer_state(e, split, "optimizer", true);
  const auto& es =
      static_cast<loom::optim::AdamParamState&>(*e.state().at(p0.unsafeGetTensorImpl()));
  CHECK_FALSE(es.exp_avg().is_alias_of(es.exp_avg_sq()));
  CHECK(es.exp_avg().is_contiguous());
  // A parameter id named twice is an error naming where.
  auto twice = loom::state::optimizer_state(adam);
  auto ids = twice.at("param_groups").toList().get(0).toGenericDict();
  ids.insert_or_assign("params", c10::List<int64_t>({0, 0, 2, 3, 4, 5}));
  loom::optim::Adam f(model->parameters(), loom::optim::AdamOptions(1e-2));
  CHECK_THROWS_WITH(
      loom::state::load_optimizer_state(f, twice),
      Contains("optimizer.param_groups.0.params") && Contains("names the parameter id 0 twice"));
}

TEST_CASE("seed_everything seeds the CPU generator, with an optional rank offset",
          "[checkpoint][seed]") {
  CHECK(loom::seed_everything(5) == 5);
  const auto a = at::rand({8});
  loom::seed_everything(5);
  CHECK(at::rand({8}).equal(a));
  CHECK(loom::seed_everything(5, 2) == 7);
  const auto b = at::rand({8});
  at::manual_seed(7);
  CHECK(at::rand({8}).equal(b));
}

namespace {

// tests/parity/checkpoint_training.py's model, optimizers and data, in C++.
constexpr int kSteps = 10, kK = 4;

torch::nn::Sequential py_model() {
  return torch::nn::Sequential(torch::nn::Linear(6, 8), torch::nn::BatchNorm1d(8),
                               torch::nn::ReLU(), torch::nn::Linear(8, 3));
}

std::vector<at::Tensor> params_of(torch::nn::Sequential& m, std::initializer_list<int> layers) {
  std::vector<at::Tensor> out;
  for (int i : layers) {
    for (auto& p : m[static_cast<std::size_t>(i)]->parameters()) out.push_back(p);
  }
  return out;
}

template <class Options>
std::vector<torch::optim::OptimizerParamGroup> groups(torch::nn::Sequential& m, Options g0,
                                                      Options g1) {
  std::vector<torch::optim::OptimizerParamGroup> out;
  out.emplace_back(params_of(m, {0, 1}), std::make_unique<Options>(g0));
  out.emplace_back(params_of(m, {3}), std::make_unique<Options>(g1));
  return out;
}

std::unique_ptr<torch::optim::Optimizer> py_optimizer(const std::string& name,
                                                      torch::nn::Sequential& m) {
  using namespace loom::optim;
  if (name == "sgd") {
    return std::make_unique<SGD>(groups(m, SGDOptions(0.05).momentum(0.9),
                                        SGDOptions(0.02).momentum(0.8).weight_decay(1e-3)),
                                 SGDOptions(1.0));
  }
  if (name == "adam") {
    return std::make_unique<Adam>(groups(m, AdamOptions(1e-2), AdamOptions(5e-3).amsgrad(true)),
                                  AdamOptions(1.0));
  }
  if (name == "adamw") {
    return std::make_unique<AdamW>(
        groups(m, AdamWOptions(1e-2), AdamWOptions(5e-3).weight_decay(0.1)), AdamWOptions(1.0));
  }
  using torch::optim::SGDOptions;
  return std::make_unique<torch::optim::SGD>(
      groups(m, SGDOptions(0.05).momentum(0.9), SGDOptions(0.02).momentum(0.9)), SGDOptions(1.0));
}

template <class RT>
void py_train(RT& rt, torch::nn::Sequential& m, torch::optim::Optimizer& opt, int first, int last) {
  for (int i = first; i < last; ++i) {
    auto x = at::arange(48, at::kFloat).reshape({8, 6}).sin() * (i + 1);
    auto y = at::arange(8, at::kLong) % 3;
    auto loss = at::cross_entropy_loss(rt.forward(m, x), y);
    rt.backward(loss, m);
    rt.optimizer_step(opt);
    opt.zero_grad();
  }
}

}  // namespace

TEST_CASE("training crosses between Python and loom through checkpoints, bitwise",
          "[.][checkpoint][training]") {
  const char* env = std::getenv("LOOM_CHECKPOINT_TRAINING_BASE");
  if (env == nullptr) FAIL("LOOM_CHECKPOINT_TRAINING_BASE is not set");
  const std::string base = env;
  for (const std::string name : {"sgd", "adam", "adamw", "torch_sgd"}) {
    INFO(name);
    const std::string stem = base + "." + name;
    const auto py_final = loom::checkpoint::load_value(stem + ".final.pt").toGenericDict();
    auto matches_python = [&](torch::nn::Sequential& m, torch::optim::Optimizer& opt) {
      CHECK(loom::testing::difference(loom::state::module_state(*m), py_final.at("model")) == "");
      CHECK(loom::testing::difference(loom::state::optimizer_state(opt).at("state"),
                                      py_final.at("optimizer").toGenericDict().at("state")) == "");
    };
    // 1. From Python's initial weights (torch.save(model.state_dict()): a bare OrderedDict)
    //    all the way: Python's final state. Then loom's own step-K checkpoint for --check.
    {
      loom::Runtime<loom::Cpu, loom::Fp32> rt;
      auto m = py_model();
      loom::state::load_module_state(*m, loom::checkpoint::load_value(stem + ".init.pt"), "init");
      auto opt = py_optimizer(name, m);
      rt.setup(m, *opt);
      py_train(rt, m, *opt, 0, kK);
      int64_t step = kK;
      rt.save(stem + ".loom_k.pt",
              {{"model", m}, {"optimizer", *opt}, {"runtime", rt}, {"step", step}});
      py_train(rt, m, *opt, kK, kSteps);
      matches_python(m, *opt);
      rt.save(stem + ".loom_final.pt", {{"model", m}, {"optimizer", *opt}});
    }
    // 2. Python's Fabric-style step-K checkpoint, resumed in loom: Python's final state.
    {
      loom::Runtime<loom::Cpu, loom::Fp32> rt;
      auto m = py_model();
      auto opt = py_optimizer(name, m);
      for (auto& g : opt->param_groups()) g.options().set_lr(3.0);  // replaced by the file's
      rt.setup(m, *opt);
      const auto rest = rt.load(stem + ".k.pt", {{"model", m}, {"optimizer", *opt}});
      REQUIRE(rest.size() == 1);
      CHECK(rest.at("step").toInt() == kK);
      py_train(rt, m, *opt, kK, kSteps);
      matches_python(m, *opt);
    }
  }
}
