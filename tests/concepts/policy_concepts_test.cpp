// The concepts accept the shipped policies and the minimal archetypes, and reject a policy
// that lacks any single row of their requirement tables.
#include <type_traits>
#include <utility>

#include "support/catch.hpp"

#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <loom/loom.hpp>

#include "support/archetypes.hpp"
#include "support/recording.hpp"

using namespace loom;
using loom::testing::DeviceArchetype;
using loom::testing::PrecisionArchetype;

namespace {

struct CopyableGuard {};
struct ThrowingGuard {
  ThrowingGuard(const ThrowingGuard&) = delete;
  ~ThrowingGuard() noexcept(false) {}
};

// Row 0 is the move row, which the archetypes do not switch off; every other row must be.
template <int... K>
constexpr bool precision_rows_all_required(std::integer_sequence<int, K...>) {
  return (!PrecisionPolicy<PrecisionArchetype<K + 1>> && ...);
}
template <int... K>
constexpr bool device_rows_all_required(std::integer_sequence<int, K...>) {
  return (!DevicePolicy<DeviceArchetype<K + 1>> && ...);
}

struct BadBackend : device::Defaults<BadBackend> {
  static constexpr c10::DeviceType device_type() { return c10::kCPU; }
  static constexpr std::string_view name() { return "bad"; }
  static constexpr std::string_view ddp_backend() { return "tcp"; }
};
struct RuntimeNamedDevice : device::Defaults<RuntimeNamedDevice> {
  static constexpr c10::DeviceType device_type() { return c10::kCPU; }
  static std::string_view name() { return "not constant"; }  // not constexpr
  static constexpr std::string_view ddp_backend() { return "gloo"; }
};
struct WrongReturn : precision::Defaults<WrongReturn> {
  static constexpr std::string_view precision() { return "wrong"; }
  void convert_input(const at::Tensor&) const {}  // must return a tensor
};
struct CopyableContext : precision::Defaults<CopyableContext> {
  static constexpr std::string_view precision() { return "copyable"; }
  CopyableGuard forward_context(c10::DeviceType) const { return {}; }
};

/// A strategy that records the order Runtime calls its hooks in, on top of the defaults.
struct RecordingStrategy : dist::Defaults<RecordingStrategy> {
  static constexpr std::string_view strategy() { return "recording"; }
  std::vector<std::string>* log = nullptr;
  void setup(torch::nn::Module& m, c10::Device d, std::string_view backend) {
    log->push_back("setup " + std::to_string(m.parameters().size()) + " " + d.str() + " " +
                   std::string(backend));
  }
  void pre_forward() { log->push_back("pre_forward"); }
  template <class Step>
  void backward(const at::Tensor&, Step&& step) {
    log->push_back("backward begins");
    step();
    log->push_back("backward ends");
  }
  template <class Unscale, class Step>
  auto optimizer_step(Optimizers optimizers, Unscale&& unscale, Step&& step) {
    log->push_back("optimizer_step of " + std::to_string(optimizers.size()));
    unscale();
    auto result = step();
    log->push_back("optimizer_step ends");
    return result;
  }
  template <class Clip>
  loom::GradNorm clip_gradients(torch::optim::Optimizer&, double max_norm, double norm_type,
                                Clip&& clip) {
    log->push_back("clip " + std::to_string(static_cast<int>(max_norm)) + " norm " +
                   std::to_string(static_cast<int>(norm_type)));
    return clip(max_norm);
  }
  void teardown() { log->push_back("strategy teardown"); }
};

template <int... K>
constexpr bool strategy_rows_all_required(std::integer_sequence<int, K...>) {
  return (!StrategyPolicy<testing::StrategyArchetype<K + 1>> && ...);
}

}  // namespace

TEST_CASE("StrategyPolicy accepts shipped, minimal and custom strategies", "[concepts][strategy]") {
  STATIC_REQUIRE(StrategyPolicy<SingleProcess>);
  STATIC_REQUIRE(StrategyPolicy<testing::StrategyArchetype<-1>>);
  STATIC_REQUIRE(StrategyPolicy<RecordingStrategy>);
  STATIC_REQUIRE(SingleProcess::strategy() == "single_device");
  STATIC_REQUIRE(std::is_empty_v<SingleProcess>);
}

TEST_CASE("StrategyPolicy rejects a strategy that lacks any one row", "[concepts][strategy]") {
  STATIC_REQUIRE(
      strategy_rows_all_required(std::make_integer_sequence<int, testing::s_rows - 1>{}));
  STATIC_REQUIRE_FALSE(loom::detail::strategy_has_backward<
                       testing::StrategyArchetype<testing::s_strategy_has_backward>>);
  STATIC_REQUIRE_FALSE(Checkpointable<testing::StrategyArchetype<testing::s_has_teardown>>);
  STATIC_REQUIRE_FALSE(StrategyPolicy<Cpu>);
  STATIC_REQUIRE_FALSE(StrategyPolicy<Fp32>);
  STATIC_REQUIRE_FALSE(StrategyPolicy<int>);
}

TEST_CASE("The strategy is Runtime's third, defaulted argument", "[concepts][strategy]") {
  STATIC_REQUIRE(std::is_same_v<Runtime<Cpu, Fp32>, Runtime<Cpu, Fp32, SingleProcess>>);
  STATIC_REQUIRE(loom::detail::family_of<SingleProcess>(loom::detail::families{}) == 2);
  STATIC_REQUIRE(loom::detail::policies_in_order<Cpu, Fp32, SingleProcess>());
  STATIC_REQUIRE_FALSE(loom::detail::policies_in_order<Cpu, SingleProcess, Fp32>());
  STATIC_REQUIRE_FALSE(loom::detail::policies_in_order<SingleProcess, Fp32, Cpu>());
  STATIC_REQUIRE(
      sizeof(Runtime<DeviceArchetype<-1>, PrecisionArchetype<-1>, testing::StrategyArchetype<-1>>) >
      0);
}

TEST_CASE("Runtime calls the strategy's hooks in the step table's order", "[runtime][strategy]") {
  std::vector<std::string> log;
  RecordingStrategy s;
  s.log = &log;
  Runtime<Cpu, Fp32, RecordingStrategy> rt(Cpu{}, Fp32{}, s);
  torch::nn::Linear model(3, 2);
  rt.setup(model);
  auto out = rt.forward(model, torch::ones({4, 3}));
  CHECK(log == std::vector<std::string>{"setup 2 cpu gloo", "pre_forward"});
  rt.backward(out.sum(), model);
  CHECK(log.back() == "backward ends");
  CHECK(log[log.size() - 2] == "backward begins");
  REQUIRE(model->weight.grad().defined());  // the precision's backward ran inside
  CHECK(model->weight.grad().sum().item<float>() == 24.0f);
  // The clip and the step go through the strategy, which runs the precision's inside.
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.5));
  torch::optim::SGD other(std::vector<torch::Tensor>{torch::zeros({1}, torch::requires_grad())},
                          torch::optim::SGDOptions(0.5));
  const double norm = rt.clip_gradients(sgd, 1000.0, 1.0).value();
  CHECK(log.back() == "clip 1000 norm 1");
  CHECK(norm == Approx(4.0 * 3 * 2 + 4.0 * 2));       // |grad| sums: weight 24, bias 8
  CHECK(rt.clip_gradients(sgd, 0.0).value() == 0.0);  // nothing to clip: the strategy is not asked
  CHECK(log.back() == "clip 1000 norm 1");
  const auto before = model->weight.detach().clone();
  CHECK(rt.optimizer_step(sgd).applied());
  CHECK(log[log.size() - 2] == "optimizer_step of 1");
  CHECK(log.back() == "optimizer_step ends");
  CHECK(torch::allclose(model->weight.detach(), before - 0.5 * model->weight.grad()));
  CHECK(rt.optimizer_step({sgd, other}).size() == 2);
  CHECK(log[log.size() - 2] == "optimizer_step of 2");
  rt.teardown();
  CHECK(log.back() == "strategy teardown");
  CHECK(rt.strategy().rank() == 0);
  CHECK(rt.strategy().world_size() == 1);
  CHECK(rt.strategy().is_global_zero());
}

TEST_CASE("SingleProcess collectives are the one-process results", "[strategy]") {
  SingleProcess s;
  auto t = torch::tensor({1.0f, -2.0f});
  for (auto op :
       {dist::ReduceOp::Sum, dist::ReduceOp::Mean, dist::ReduceOp::Max, dist::ReduceOp::Min}) {
    s.all_reduce(t, op);
    CHECK(torch::equal(t, torch::tensor({1.0f, -2.0f})));
  }
  s.broadcast(t, 0);
  auto gathered = s.all_gather(t);
  REQUIRE(gathered.size() == 1);
  CHECK(torch::equal(gathered[0], t));
  CHECK(gathered[0].data_ptr() != t.data_ptr());
  CHECK_THROWS_WITH(s.broadcast(t, 1), Catch::Contains("broadcast from rank 1 in a run of 1"));
  CHECK_THROWS_WITH(s.load_state_dict({{"x", c10::IValue(1)}}),
                    Catch::Contains("the single_device strategy has no state"));
}

TEST_CASE("ScopeGuard accepts non-copyable RAII scopes only", "[concepts][scope_guard]") {
  STATIC_REQUIRE(ScopeGuard<NullGuard>);
  STATIC_REQUIRE(ScopeGuard<DefaultDtypeGuard<c10::kDouble>>);
  STATIC_REQUIRE(ScopeGuard<loom::testing::RecordingGuard>);
  STATIC_REQUIRE_FALSE(ScopeGuard<CopyableGuard>);
  STATIC_REQUIRE_FALSE(ScopeGuard<ThrowingGuard>);
  STATIC_REQUIRE_FALSE(ScopeGuard<int>);
  STATIC_REQUIRE_FALSE(ScopeGuard<NullGuard&>);
}

TEST_CASE("PrecisionPolicy accepts shipped, minimal and custom policies", "[concepts][precision]") {
  STATIC_REQUIRE(PrecisionPolicy<Fp32>);
  STATIC_REQUIRE(PrecisionPolicy<PrecisionArchetype<-1>>);
  STATIC_REQUIRE(PrecisionPolicy<loom::testing::RecordingPrecision>);
  STATIC_REQUIRE(Fp32::precision() == "32-true");
}

TEST_CASE("PrecisionPolicy rejects a policy that lacks any one row", "[concepts][precision]") {
  STATIC_REQUIRE(
      precision_rows_all_required(std::make_integer_sequence<int, loom::testing::p_rows - 1>{}));
  STATIC_REQUIRE(loom::testing::p_movable == 0);
  // Each row's own check is the one that fails.
  using testing::p_has_state_dict;
  using testing::p_precision_has_convert_module;
  using testing::p_precision_has_optimizer_step;
  STATIC_REQUIRE_FALSE(loom::detail::precision_has_convert_module<
                       PrecisionArchetype<p_precision_has_convert_module>>);
  STATIC_REQUIRE(loom::detail::precision_has_convert_input<
                 PrecisionArchetype<p_precision_has_convert_module>>);
  STATIC_REQUIRE_FALSE(loom::detail::precision_has_optimizer_step<
                       PrecisionArchetype<p_precision_has_optimizer_step>>);
  STATIC_REQUIRE_FALSE(loom::detail::has_state_dict<PrecisionArchetype<p_has_state_dict>>);
  STATIC_REQUIRE_FALSE(Checkpointable<PrecisionArchetype<p_has_state_dict>>);
  STATIC_REQUIRE_FALSE(PrecisionPolicy<WrongReturn>);
  STATIC_REQUIRE_FALSE(PrecisionPolicy<CopyableContext>);
  STATIC_REQUIRE_FALSE(PrecisionPolicy<c10::Half>);
  STATIC_REQUIRE_FALSE(PrecisionPolicy<Cpu>);
}

TEST_CASE("DevicePolicy accepts shipped, minimal and custom policies", "[concepts][device]") {
  STATIC_REQUIRE(DevicePolicy<Cpu>);
  STATIC_REQUIRE(DevicePolicy<DeviceArchetype<-1>>);
  STATIC_REQUIRE(DevicePolicy<loom::testing::RecordingDevice>);
  STATIC_REQUIRE(Cpu::ddp_backend() == "gloo");
  STATIC_REQUIRE(Cpu::device_type() == c10::kCPU);
  STATIC_REQUIRE(Cpu::name() == "cpu");
}

TEST_CASE("DevicePolicy rejects a policy that lacks any one row", "[concepts][device]") {
  STATIC_REQUIRE(
      device_rows_all_required(std::make_integer_sequence<int, loom::testing::d_rows - 1>{}));
  STATIC_REQUIRE(loom::testing::d_movable == 0);
  STATIC_REQUIRE_FALSE(Checkpointable<DeviceArchetype<testing::d_has_teardown>>);
  STATIC_REQUIRE_FALSE(DevicePolicy<BadBackend>);
  STATIC_REQUIRE_FALSE(loom::detail::device_has_ddp_backend<BadBackend>);
  STATIC_REQUIRE_FALSE(DevicePolicy<RuntimeNamedDevice>);
  STATIC_REQUIRE_FALSE(DevicePolicy<c10::Device>);
  STATIC_REQUIRE_FALSE(DevicePolicy<Fp32>);
}

TEST_CASE("Checkpointable is shared by every family", "[concepts][checkpointable]") {
  STATIC_REQUIRE(Checkpointable<SingleProcess>);
  STATIC_REQUIRE(Checkpointable<Cpu>);
  STATIC_REQUIRE(Checkpointable<Cuda>);
  STATIC_REQUIRE(Checkpointable<Fp32>);
  STATIC_REQUIRE(Checkpointable<Fp16Mixed>);
  STATIC_REQUIRE_FALSE(Checkpointable<int>);
}

TEST_CASE("Runtime's order check knows which family each policy belongs to",
          "[concepts][runtime]") {
  STATIC_REQUIRE(loom::detail::family_of<Cpu>(loom::detail::families{}) == 0);
  STATIC_REQUIRE(loom::detail::family_of<Fp32>(loom::detail::families{}) == 1);
  STATIC_REQUIRE(loom::detail::family_of<c10::Half>(loom::detail::families{}) == -1);
  STATIC_REQUIRE(loom::detail::policies_in_order<Cpu, Fp32>());
  STATIC_REQUIRE(loom::detail::policies_in_order<c10::Device, Fp32>());  // a mistake, not disorder
  STATIC_REQUIRE_FALSE(loom::detail::policies_in_order<Fp32, Cpu>());
  STATIC_REQUIRE_FALSE(loom::detail::policies_in_order<Cpu, Cpu>());
}

TEST_CASE("A runtime of empty policies holds only its loggers and its setup flag",
          "[concepts][runtime]") {
  STATIC_REQUIRE(std::is_empty_v<Cpu>);
  STATIC_REQUIRE(std::is_empty_v<Fp32>);
  struct LoggersAndFlag {
    loom::Loggers loggers;
    bool set_up;
  };
  STATIC_REQUIRE(sizeof(Runtime<Cpu, Fp32>) == sizeof(LoggersAndFlag));
  STATIC_REQUIRE(Runtime<Cpu, Fp32>::precision_name() == "32-true");
  // A runtime of the minimal archetypes instantiates too.
  STATIC_REQUIRE(sizeof(Runtime<DeviceArchetype<-1>, PrecisionArchetype<-1>>) > 0);
}

TEST_CASE("Batch accepts nested supported types only", "[concepts][batch]") {
  STATIC_REQUIRE(Batch<at::Tensor>);
  STATIC_REQUIRE(Batch<std::tuple<at::Tensor, std::vector<std::string>, int>>);
  STATIC_REQUIRE(Batch<std::map<std::string, std::optional<at::Tensor>>>);
  STATIC_REQUIRE(Batch<torch::data::Example<>>);
  STATIC_REQUIRE_FALSE(Batch<CopyableGuard>);
  STATIC_REQUIRE_FALSE(Batch<std::vector<CopyableGuard>>);
  STATIC_REQUIRE_FALSE(Batch<std::tuple<at::Tensor, std::map<std::string, CopyableGuard>>>);
}
