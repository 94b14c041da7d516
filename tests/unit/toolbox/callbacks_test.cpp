// loom::WithCallbacks and the built-in callbacks: the runtime's events in Lightning's order,
// rt.call<"name"> reaching only the callbacks that take it, what compiles away, and Composer's
// EarlyStopper, ThresholdStopper, NaNMonitor, LRMonitor and OptimizerMonitor. Two ranks are
// played by a strategy that reports a world of two and answers its all-reduce for the other
// rank: the agreement is this process's vote combined with a given one.
#include "support/catch.hpp"
#include "support/sync_counter.hpp"
#include "support/warnings.hpp"

#include <unistd.h>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <loom/callbacks.hpp>
#include <loom/loom.hpp>

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using Catch::Matchers::Equals;

namespace {

using Plain = loom::Runtime<loom::Cpu, loom::Fp32>;

struct CallbacksMlpImpl : torch::nn::Module {
  CallbacksMlpImpl()
      : fc1(register_module("fc1", torch::nn::Linear(4, 8))),
        fc2(register_module("fc2", torch::nn::Linear(8, 2))) {}
  at::Tensor forward(const at::Tensor& x) { return fc2(at::relu(fc1(x))); }  // (B, 2) f32
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(CallbacksMlp);

CallbacksMlp make_model() {
  at::manual_seed(0);
  return CallbacksMlp();
}

/// The mean squared error of the model on a fixed batch `i`.
template <class R>
at::Tensor loss_of(R& rt, CallbacksMlp& model, int64_t i) {
  at::Tensor x = at::linspace(-1.0, 1.0, 12).reshape({3, 4}) * static_cast<double>(i + 1);
  at::Tensor y = at::ones({3, 2});
  return torch::nn::functional::mse_loss(rt.forward(model, x), y);
}

/// A fresh folder under the system's temporary folder, removed at the end.
struct CallbacksTempDir {
  fs::path path;
  CallbacksTempDir() {
    static int n = 0;
    path = fs::temp_directory_path() /
           ("loom_callbacks_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~CallbacksTempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

/// Records every event it gets as "TAG:event@global_step".
struct Recorder {
  std::string tag;
  std::vector<std::string>* events;
  template <class E, class R, class... A>
  void on(E, R& rt, A&...) {
    events->push_back(tag + ":" + std::string(E::name) + "@" + std::to_string(rt.global_step()));
  }
};
// Two recorders of different types, so that rt.callback<T>() can tell them apart.
struct FirstRecorder : Recorder {};
struct SecondRecorder : Recorder {};

struct NoEvents {};
struct AlsoNoEvents {};

/// Takes on_custom(int&) only: adds the value and changes it for the callbacks after it.
struct TakesCustom {
  int got = 0;
  template <class R>
  void on(loom::Event<"on_custom">, R&, int& x) {
    got += x;
    x += 100;
  }
};
/// Takes on_custom(int&) too, and sees what TakesCustom made of the argument.
struct SeesCustom {
  int got = 0;
  template <class R>
  void on(loom::Event<"on_custom">, R&, int& x) {
    got = x;
  }
};
/// Takes another event, without arguments.
struct TakesOther {
  int calls = 0;
  template <class R>
  void on(loom::Event<"on_other">, R&) {
    ++calls;
  }
};

/// Records the optimizer-step events with the optimizer each names.
struct OptimizerOrder {
  std::vector<std::pair<std::string, const torch::optim::Optimizer*>> seen;
  template <class R>
  void on(loom::Event<"on_before_optimizer_step">, R&, torch::optim::Optimizer& o) {
    seen.emplace_back("before", &o);
  }
  template <class R>
  void on(loom::Event<"on_after_optimizer_step">, R& rt, torch::optim::Optimizer& o,
          const loom::StepResult& r) {
    seen.emplace_back((r.applied() ? "after@" : "skipped@") + std::to_string(rt.global_step()), &o);
  }
};

/// Keeps every row written, its tensors read.
class MemoryLogger : public loom::Logger {
 public:
  MemoryLogger() : loom::Logger(loom::LoggerOptions{.flush_every = 1000}) {}
  ~MemoryLogger() override { close(); }

  /// (step, name) -> value of every row flushed so far.
  std::map<std::pair<int64_t, std::string>, double> values;

 protected:
  void write_rows(const std::vector<Row>& rows) override {
    for (const Row& row : rows) {
      for (const auto& [name, value] : row.values) values[{row.step, name}] = value.number();
    }
  }
  void write_hyperparams(const loom::Hyperparams&) override {}
};

/// A world of two played by one process: this process is rank 1, and the other rank's vote
/// in an all-reduce (Max) is `other`.
struct PretendTwoRanks : loom::dist::Defaults<PretendTwoRanks> {
  static constexpr std::string_view strategy() { return "pretend_two_ranks"; }
  double other = 0.0;
  int reduces = 0;
  int rank() const { return 1; }
  int world_size() const { return 2; }
  void all_reduce(at::Tensor& t, loom::dist::ReduceOp op) {
    ++reduces;
    if (op == loom::dist::ReduceOp::Max) t.clamp_min_(other);
  }
};

// What compiles away: a runtime whose callbacks take no event has the Runtime's members alone.
using Idle = loom::WithCallbacks<Plain, NoEvents, AlsoNoEvents>;
static_assert(!Idle::handles<"on_before_backward">);
static_assert(!Idle::handles<"on_after_backward">);
static_assert(!Idle::handles<"on_before_optimizer_step">);
static_assert(!Idle::handles<"on_after_optimizer_step">);
static_assert(!Idle::handles<"on_save_checkpoint">);
static_assert(!Idle::handles<"on_load_checkpoint">);
static_assert(!Idle::handles<"on_log">);
// Empty callbacks take no space: the wrapper adds the step count, the stop flag and its reason.
static_assert(sizeof(Idle) == sizeof(loom::WithCallbacks<Plain>));
static_assert(sizeof(loom::WithCallbacks<Plain>) == sizeof(Plain) + sizeof(loom::CallbackList<>));

using Custom = loom::WithCallbacks<Plain, NoEvents, TakesCustom, SeesCustom, TakesOther>;
static_assert(Custom::handles<"on_custom", int>);
static_assert(!Custom::handles<"on_custom">);  // no callback takes it without an argument
static_assert(!Custom::handles<"on_custom", std::string>);
static_assert(Custom::handles<"on_other">);
static_assert(!Custom::handles<"on_log">);

// Each built-in callback takes exactly the events it documents.
using Builtins = loom::WithCallbacks<Plain, loom::NaNMonitor>;
static_assert(Builtins::handles<"on_after_backward">);
static_assert(Builtins::handles<"on_save_checkpoint">);
static_assert(!Builtins::handles<"on_before_backward">);
static_assert(!Builtins::handles<"on_before_optimizer_step">);  // no unscale, no event
static_assert(!Builtins::handles<"on_log">);
static_assert(loom::WithCallbacks<Plain, loom::EarlyStopper>::handles<"on_log">);
static_assert(!loom::WithCallbacks<Plain, loom::EarlyStopper>::handles<"on_after_backward">);
static_assert(loom::WithCallbacks<Plain, loom::LRMonitor>::handles<"on_before_optimizer_step">);
static_assert(
    loom::WithCallbacks<Plain, loom::OptimizerMonitor>::handles<"on_after_optimizer_step">);

}  // namespace

TEST_CASE("WithCallbacks fires the runtime's events in Lightning's order, callbacks in order",
          "[callbacks]") {
  std::vector<std::string> events;
  loom::WithCallbacks rt(Plain{}, FirstRecorder{{"A", &events}}, SecondRecorder{{"B", &events}});
  auto model = make_model();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  rt.setup(model, opt);
  CallbacksTempDir dir;
  loom::State state{{"model", model}, {"optimizer", opt}, {"callbacks", rt.callbacks()}};

  for (int64_t step = 0; step < 2; ++step) {
    for (int64_t micro = 0; micro < 2; ++micro) {
      auto scope = rt.no_backward_sync(model, micro == 0);
      rt.backward(loss_of(rt, model, micro) / 2.0, model);
    }
    rt.optimizer_step(opt);
    opt.zero_grad();
    rt.log("train/loss", 1.0, rt.global_step());
  }
  rt.save(dir.path / "last.pt", state);
  rt.load(dir.path / "last.pt", state);

  std::vector<std::string> want;
  auto both = [&](const std::string& e) {
    want.push_back("A:" + e);
    want.push_back("B:" + e);
  };
  for (int step = 0; step < 2; ++step) {
    const std::string s = std::to_string(step);
    for (int micro = 0; micro < 2; ++micro) {
      both("on_before_backward@" + s);
      both("on_after_backward@" + s);
    }
    both("on_before_optimizer_step@" + s);
    both("on_after_optimizer_step@" + std::to_string(step + 1));  // the step is counted
    both("on_log@" + std::to_string(step + 1));
  }
  both("on_save_checkpoint@2");
  both("on_load_checkpoint@2");
  CHECK(events == want);
  CHECK(rt.global_step() == 2);
  CHECK(rt.callback<SecondRecorder>().tag == "B");
  CHECK_FALSE(rt.should_stop());
}

TEST_CASE("A step of several optimizers: each one's before events, the step, each one's after",
          "[callbacks]") {
  loom::WithCallbacks rt(Plain{}, OptimizerOrder{});
  auto model = make_model();
  torch::optim::SGD a(model->fc1->parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::SGD b(model->fc2->parameters(), torch::optim::SGDOptions(0.1));
  rt.setup(model, a, b);
  using Seen = std::vector<std::pair<std::string, const torch::optim::Optimizer*>>;
  rt.backward(loss_of(rt, model, 0), model);
  CHECK(rt.optimizer_step({a, b}).size() == 2);
  CHECK(rt.callback<OptimizerOrder>().seen ==
        Seen{{"before", &a}, {"before", &b}, {"after@1", &a}, {"after@1", &b}});
  CHECK(rt.global_step() == 1);  // one step of two optimizers

  rt.callback<OptimizerOrder>().seen.clear();
  std::vector<loom::OptimizerRef> both{b, a};
  rt.backward(loss_of(rt, model, 1), model);
  CHECK(rt.optimizer_step(loom::Optimizers(both)).size() == 2);
  CHECK(rt.callback<OptimizerOrder>().seen ==
        Seen{{"before", &b}, {"before", &a}, {"after@2", &b}, {"after@2", &a}});
}

TEST_CASE("rt.call<name> reaches only the callbacks that take the event, in order", "[callbacks]") {
  loom::WithCallbacks rt(Plain{}, NoEvents{}, TakesCustom{}, SeesCustom{}, TakesOther{});
  static_assert(std::is_same_v<decltype(rt), Custom>);
  int x = 5;
  rt.call<"on_custom">(x);
  CHECK(rt.callback<TakesCustom>().got == 5);
  CHECK(rt.callback<SeesCustom>().got == 105);  // the argument as TakesCustom left it
  CHECK(x == 105);
  CHECK(rt.callback<TakesOther>().calls == 0);
  rt.call<"on_other">();
  rt.call<"on_nobody">(x, 1.0);  // no callback takes it: nothing happens
  CHECK(rt.callback<TakesOther>().calls == 1);
  CHECK(rt.callback<TakesCustom>().got == 5);
}

TEST_CASE("stop() keeps the first reason, and the callbacks' entry refuses other callbacks",
          "[callbacks]") {
  loom::WithCallbacks rt(Plain{}, TakesOther{});
  CHECK_FALSE(rt.should_stop());
  CHECK(rt.stop_reason().empty());
  rt.stop("first");
  rt.stop("second");
  CHECK(rt.should_stop());
  CHECK(rt.stop_reason() == "first");

  const loom::StateDict saved = rt.callbacks().state_dict();
  CHECK(saved.at("callbacks").toStringRef() == "TakesOther");
  CHECK(saved.at("should_stop").toBool());
  loom::WithCallbacks other(Plain{}, loom::NaNMonitor());
  CHECK_THROWS_WITH(
      other.callbacks().load_state_dict(saved),
      Equals("loom::CallbackList::load_state_dict: key \"callbacks\": the checkpoint holds the "
             "state of the callbacks [TakesOther]; this runtime has [NaNMonitor]"));
  loom::StateDict stray = saved;
  stray.emplace("0.TakesOther.count", c10::IValue(int64_t{3}));
  CHECK_THROWS_WITH(
      rt.callbacks().load_state_dict(stray),
      Equals("loom::CallbackList::load_state_dict: unexpected key(s) \"0.TakesOther.count\""));
}

TEST_CASE("EarlyStopper stops after `patience` values without an improvement above min_delta",
          "[callbacks]") {
  loom::WithCallbacks rt(
      Plain(), loom::EarlyStopper({.metric = "val/loss", .patience = 2, .min_delta = 0.1}));
  // 0.8 improves on 1.0 by more than 0.1; 0.75 and 0.71 do not (waits 1 and 2).
  const double values[] = {1.0, 0.8, 0.75, 0.71, 0.1};
  int64_t stopped_at = -1;
  for (int64_t i = 0; i < 5; ++i) {
    rt.log("other/metric", 0.0, i);  // not watched
    rt.log_dict({{"val/loss", values[i]}}, i);
    if (rt.should_stop()) {
      stopped_at = i;
      break;
    }
  }
  CHECK(stopped_at == 3);
  CHECK(rt.stop_reason() ==
        "EarlyStopper: 'val/loss' did not improve by more than 0.1 for 2 checks (best: 0.8)");
  CHECK(rt.callback<loom::EarlyStopper>().best() == 0.8);
  CHECK(rt.callback<loom::EarlyStopper>().wait() == 2);

  // Max mode, a tensor value, and a nan that ends the run at once.
  loom::WithCallbacks acc(Plain{},
                          loom::EarlyStopper({.metric = "acc", .mode = loom::MetricMode::Max}));
  acc.log("acc", at::scalar_tensor(0.5), 0);
  acc.log("acc", at::scalar_tensor(0.6), 1);
  CHECK(acc.callback<loom::EarlyStopper>().best() == Approx(0.6));
  CHECK_FALSE(acc.should_stop());
  acc.log("acc", std::numeric_limits<double>::quiet_NaN(), 2);
  CHECK(acc.should_stop());
  CHECK_THAT(acc.stop_reason(), Contains("EarlyStopper: 'acc' is nan, not finite"));
  CHECK_THROWS_WITH(loom::EarlyStopper({.patience = 0}),
                    Equals("loom::EarlyStopper: patience must be at least 1"));
}

TEST_CASE("EarlyStopper's state resumes after save and load: the stop comes at the same step",
          "[callbacks]") {
  // Improvements at 0, 1 and 3; after step 4 the wait is 1 (the checkpoint); patience 3 ends
  // the run at step 6. A stopper that forgot its state would take 0.97 as its first best.
  const double values[] = {1.0, 0.9, 0.95, 0.8, 0.97, 0.99, 0.98, 0.5};
  const loom::EarlyStopperOptions options{.metric = "val/loss", .patience = 3};
  auto train = [&](auto& rt, CallbacksMlp& model, torch::optim::SGD& opt, int64_t from,
                   int64_t to) {
    for (int64_t i = from; i < to; ++i) {
      rt.backward(loss_of(rt, model, i), model);
      rt.optimizer_step(opt);
      opt.zero_grad();
      rt.log("val/loss", values[i], rt.global_step());
      if (rt.should_stop()) return i;
    }
    return int64_t{-1};
  };

  auto model = make_model();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  loom::WithCallbacks whole(Plain{}, loom::EarlyStopper(options));
  whole.setup(model, opt);
  CHECK(train(whole, model, opt, 0, 8) == 6);
  CHECK(whole.global_step() == 7);

  CallbacksTempDir dir;
  const fs::path file = dir.path / "mid.pt";
  {
    auto m = make_model();
    torch::optim::SGD o(m->parameters(), torch::optim::SGDOptions(0.1));
    loom::WithCallbacks first(Plain{}, loom::EarlyStopper(options));
    first.setup(m, o);
    CHECK(train(first, m, o, 0, 5) == -1);
    CHECK(first.callback<loom::EarlyStopper>().wait() == 1);
    loom::State state{{"model", m}, {"optimizer", o}, {"callbacks", first.callbacks()}};
    first.save(file, state);
  }
  auto m = make_model();
  torch::optim::SGD o(m->parameters(), torch::optim::SGDOptions(0.1));
  loom::WithCallbacks second(Plain{}, loom::EarlyStopper(options));
  second.setup(m, o);
  loom::State state{{"model", m}, {"optimizer", o}, {"callbacks", second.callbacks()}};
  second.load(file, state);
  // A WithCallbacks is a runtime entry too: {"runtime", rt} saves the Runtime's own state.
  loom::State with_runtime{{"runtime", second}, {"callbacks", second.callbacks()}};
  second.save(dir.path / "runtime.pt", with_runtime);
  second.load(dir.path / "runtime.pt", with_runtime);
  CHECK(second.global_step() == 5);
  CHECK(second.callback<loom::EarlyStopper>().best() == 0.8);
  CHECK(second.callback<loom::EarlyStopper>().wait() == 1);
  CHECK(train(second, m, o, 5, 8) == 6);
  CHECK(second.global_step() == whole.global_step());
  CHECK(second.stop_reason() == whole.stop_reason());
  for (const auto& p : m->named_parameters()) {
    CHECK(at::equal(p.value(), model->named_parameters()[p.key()]));
  }

  // Another runtime's callbacks refuse the file.
  loom::WithCallbacks other(Plain{}, loom::ThresholdStopper());
  loom::State wrong{{"callbacks", other.callbacks()}};
  CHECK_THROWS_WITH(other.load(file, wrong),
                    Contains("the checkpoint holds the state of the callbacks [EarlyStopper]; "
                             "this runtime has [ThresholdStopper]"));
}

TEST_CASE("ThresholdStopper stops when the metric crosses the threshold, strictly", "[callbacks]") {
  loom::WithCallbacks rt(
      Plain(), loom::ThresholdStopper(
                   {.metric = "val/acc", .threshold = 0.9, .mode = loom::MetricMode::Max}));
  rt.log("val/acc", 0.5, 0);
  rt.log("val/acc", 0.9, 1);  // equal: not crossed
  CHECK_FALSE(rt.should_stop());
  rt.log("val/acc", 0.91, 2);
  CHECK(rt.should_stop());
  CHECK(rt.stop_reason() == "ThresholdStopper: 'val/acc' = 0.91 > 0.9");

  loom::WithCallbacks low(Plain{}, loom::ThresholdStopper({.metric = "loss", .threshold = 0.1}));
  low.log("loss", std::numeric_limits<double>::quiet_NaN(), 0);  // nan never crosses
  low.log("loss", 0.1, 1);
  CHECK_FALSE(low.should_stop());
  low.log("loss", at::scalar_tensor(0.05), 2);
  CHECK(low.stop_reason() == "ThresholdStopper: 'loss' = 0.05 < 0.1");
}

TEST_CASE("The stoppers agree over the ranks: one all-reduce per value, any rank's vote stops",
          "[callbacks]") {
  using TwoRanks = loom::Runtime<loom::Cpu, loom::Fp32, PretendTwoRanks>;
  loom::WithCallbacks rt(TwoRanks{}, loom::EarlyStopper({.metric = "val/loss", .patience = 5}),
                         loom::ThresholdStopper({.metric = "val/loss", .threshold = 0.0}));
  rt.log("val/loss", 1.0, 0);
  rt.log("other", 1.0, 0);
  CHECK(rt.strategy().reduces == 2);  // one per stopper, for the watched metric only
  CHECK_FALSE(rt.should_stop());
  rt.strategy().other = 1.0;  // the other rank would stop
  rt.log("val/loss", 0.5, 1);
  CHECK(rt.strategy().reduces == 4);
  CHECK(rt.should_stop());
  CHECK(rt.stop_reason() == "EarlyStopper: another rank's 'val/loss' ended the run");
  CHECK(rt.callback<loom::EarlyStopper>().best() == 0.5);  // this rank's view goes on
}

TEST_CASE(
    "NaNMonitor reads its checks every `interval` backwards and names the step and "
    "parameter",
    "[callbacks]") {
  loom::WithCallbacks rt(Plain{}, loom::NaNMonitor({.interval = 4}));
  auto model = make_model();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  rt.setup(model, opt);
  auto loss_at = [&](int64_t step) {
    at::Tensor loss = loss_of(rt, model, step);
    if (step == 1) {
      // sqrt's gradient at 0 is inf: fc2.weight's gradient becomes inf, the loss stays finite.
      const at::Tensor w = model->fc2->weight[0][0];
      loss = loss + at::sqrt(w - w.detach());
    }
    return loss;
  };
  {
    loom::testing::SyncCounter syncs;
    for (int64_t step = 0; step < 3; ++step) {  // backwards 1 to 3: nothing read
      rt.backward(loss_at(step), model);
      rt.optimizer_step(opt);
      opt.zero_grad();
    }
    CHECK(loom::testing::SyncCounter::count() == 0);
  }
  CHECK(rt.callback<loom::NaNMonitor>().pending() == 3);
  // The fourth backward reads them: step 1's gradient is named, not the nan losses after it.
  CHECK_THROWS_WITH(rt.backward(loss_at(3), model),
                    Equals("loom::NaNMonitor: step 1: the gradient of 'fc2.weight' is not finite"));
  CHECK(rt.callback<loom::NaNMonitor>().pending() == 0);
  CHECK_THROWS_WITH(loom::NaNMonitor({.interval = 0}),
                    Equals("loom::NaNMonitor: interval must be at least 1"));
}

TEST_CASE("NaNMonitor names a nan loss, and checks before every checkpoint", "[callbacks]") {
  loom::WithCallbacks rt(Plain{}, loom::NaNMonitor({.interval = 100}));
  auto model = make_model();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  rt.setup(model, opt);
  CallbacksTempDir dir;
  loom::State state{{"model", model}, {"callbacks", rt.callbacks()}};
  rt.backward(loss_of(rt, model, 0), model);
  rt.save(dir.path / "ok.pt", state);  // finite: written
  CHECK(fs::exists(dir.path / "ok.pt"));
  rt.optimizer_step(opt);
  opt.zero_grad();
  rt.backward(loss_of(rt, model, 1) * std::numeric_limits<double>::quiet_NaN(), model);
  CHECK_THROWS_WITH(rt.save(dir.path / "bad.pt", state),
                    Equals("loom::NaNMonitor: step 1: the loss is nan"));
  CHECK_FALSE(fs::exists(dir.path / "bad.pt"));
}

TEST_CASE("NaNMonitor under 16-mixed checks the loss only: overflow is the scaler's",
          "[callbacks]") {
  loom::testing::WarningCatcher quiet;  // fp16 on the CPU warns once
  loom::WithCallbacks rt(
      loom::Runtime<loom::Cpu, loom::Fp16Mixed>(loom::Cpu{}, loom::Fp16Mixed({.init_scale = 8.0})),
      loom::NaNMonitor({.interval = 1}));
  auto model = make_model();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  rt.setup(model, opt);
  const at::Tensor w = model->fc2->weight[0][0];
  at::Tensor loss = rt.forward(model, at::ones({2, 4})).sum();
  CHECK_NOTHROW(rt.backward(loss + at::sqrt(w - w.detach()), model));  // an inf gradient
  CHECK_FALSE(rt.optimizer_step(opt).applied());                       // skipped by the scaler
  opt.zero_grad();
  loss = (rt.forward(model, at::ones({2, 4})).sum().abs() + 1.0) *
         std::numeric_limits<double>::infinity();
  CHECK_THROWS_WITH(rt.backward(loss, model), Equals("loom::NaNMonitor: step 1: the loss is inf"));
}

TEST_CASE("LRMonitor logs Composer's lr-<Optimizer>/group<i> keys through the loggers",
          "[callbacks]") {
  auto logger = std::make_shared<MemoryLogger>();
  loom::WithCallbacks rt(Plain{}, loom::LRMonitor({.interval = 2}));
  rt.add_logger(logger);
  auto model = make_model();
  torch::optim::SGD opt(
      {torch::optim::OptimizerParamGroup(model->fc1->parameters()),
       torch::optim::OptimizerParamGroup(model->fc2->parameters(),
                                         std::make_unique<torch::optim::SGDOptions>(0.05))},
      torch::optim::SGDOptions(0.1));
  rt.setup(model, opt);
  for (int64_t step = 0; step < 3; ++step) {
    rt.backward(loss_of(rt, model, step), model);
    rt.optimizer_step(opt);
    opt.zero_grad();
    static_cast<torch::optim::SGDOptions&>(opt.param_groups()[0].options()).lr(0.1 / (step + 2));
  }
  rt.teardown();
  const auto& v = logger->values;
  CHECK(v.size() == 4);  // steps 0 and 2, two groups each
  CHECK(v.at({0, "lr-SGD/group0"}) == 0.1);
  CHECK(v.at({0, "lr-SGD/group1"}) == 0.05);
  CHECK(v.at({2, "lr-SGD/group0"}) == 0.1 / 3);
  CHECK(v.at({2, "lr-SGD/group1"}) == 0.05);

  // The class name, as Composer's optimizer.__class__.__name__.
  loom::optim::AdamW fused(model->parameters(), loom::optim::AdamWOptions(1e-3));
  torch::optim::AdamW libtorch(model->parameters(), torch::optim::AdamWOptions(1e-3));
  struct MySgd : torch::optim::SGD {
    using torch::optim::SGD::SGD;
  };
  MySgd mine(model->parameters(), torch::optim::SGDOptions(0.1));
  CHECK(loom::detail::optimizer_class_name(fused) == "AdamW");
  CHECK(loom::detail::optimizer_class_name(libtorch) == "AdamW");
  CHECK(loom::detail::optimizer_class_name(mine) == "MySgd");
}

TEST_CASE("OptimizerMonitor logs Composer's l2_norm keys as device tensors, without a sync",
          "[callbacks]") {
  auto logger = std::make_shared<MemoryLogger>();
  loom::WithCallbacks rt(Plain{}, loom::OptimizerMonitor({.interval = 2}));
  rt.add_logger(logger);
  auto model = make_model();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  rt.setup(model, opt);
  std::map<std::pair<int64_t, std::string>, double> want;
  for (int64_t step = 0; step < 3; ++step) {
    rt.backward(loss_of(rt, model, step), model);
    std::map<std::string, at::Tensor> before;
    for (const auto& p : model->named_parameters()) before[p.key()] = p.value().detach().clone();
    {
      loom::testing::SyncCounter syncs;
      rt.optimizer_step(opt);
      CHECK(loom::testing::SyncCounter::count() == 0);
    }
    if (step % 2 == 0) {
      double global = 0.0;
      for (const auto& p : model->named_parameters()) {
        const double g = at::linalg_vector_norm(p.value().grad(), 2).item<double>();
        global += g * g;
        want[{step, "l2_norm/grad/" + p.key()}] = g;
        want[{step, "l2_norm/param/" + p.key()}] =
            at::linalg_vector_norm(p.value(), 2).item<double>();
        want[{step, "l2_norm/update/" + p.key()}] =
            at::linalg_vector_norm(p.value() - before[p.key()], 2).item<double>();
      }
      want[{step, "l2_norm/grad/global"}] = std::sqrt(global);
    }
    opt.zero_grad();
  }
  rt.teardown();
  REQUIRE(logger->values.size() == want.size());  // 13 keys at steps 0 and 2
  CHECK(want.size() == 26);
  for (const auto& [key, value] : want) {
    INFO(key.second << " at step " << key.first);
    REQUIRE(logger->values.count(key) == 1);
    CHECK(logger->values.at(key) == Approx(value).epsilon(1e-6));
  }
}

TEST_CASE("Under 16-mixed the optimizer-step callbacks see unscaled gradients", "[callbacks]") {
  loom::testing::WarningCatcher quiet;
  auto logger = std::make_shared<MemoryLogger>();
  loom::WithCallbacks rt(loom::Runtime<loom::Cpu, loom::Fp16Mixed>(
                             loom::Cpu{}, loom::Fp16Mixed({.init_scale = 1024.0})),
                         loom::OptimizerMonitor({.interval = 1}));
  rt.add_logger(logger);
  auto model = make_model();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  rt.setup(model, opt);
  rt.backward(loss_of(rt, model, 0), model);
  REQUIRE(rt.optimizer_step(opt).applied());
  double global = 0.0;
  for (const auto& p : model->parameters()) {  // unscaled by then, by the step if not before
    global += at::linalg_vector_norm(p.grad(), 2).pow(2).item<double>();
  }
  rt.teardown();
  CHECK(logger->values.at({0, "l2_norm/grad/global"}) == Approx(std::sqrt(global)).epsilon(1e-6));
}
