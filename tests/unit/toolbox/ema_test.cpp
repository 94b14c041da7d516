// loom::optim::EMA: AveragedModel's arithmetic and state bit for bit (hidden case
// [ema][parity], ctest toolbox.ema_parity), resuming, the swap for evaluation, rt.save, and
// its errors.
#include "support/catch.hpp"
#include "support/sync_counter.hpp"

#include <unistd.h>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <loom/checkpoint/io.hpp>
#include <loom/loom.hpp>
#include <loom/optim/ema.hpp>
#include <loom/state/module.hpp>

using loom::testing::SyncCounter;

namespace {

torch::nn::Sequential make_model() {
  return torch::nn::Sequential(torch::nn::Linear(6, 5), torch::nn::BatchNorm1d(5),
                               torch::nn::ReLU(), torch::nn::Linear(5, 2));
}

// Every tensor of `got` (an EMA state) equals `want`'s (Python's), same keys in the same order,
// same dtypes, bitwise.
void same_state(const loom::state::Dict& got, const c10::IValue& want, const std::string& what) {
  const auto w = want.toGenericDict();
  REQUIRE(got.size() == w.size());
  auto g = got.begin();
  for (auto it = w.begin(); it != w.end(); ++it, ++g) {
    INFO(what << ": " << it->key().toStringRef());
    REQUIRE(g->key().toStringRef() == it->key().toStringRef());
    const auto a = g->value().toTensor(), b = it->value().toTensor();
    CHECK(a.scalar_type() == b.scalar_type());
    CHECK(a.sizes() == b.sizes());
    CHECK(at::equal(a, b));
  }
}

}  // namespace

TEST_CASE("EMA is AveragedModel with get_ema_multi_avg_fn, bit for bit, and resumes",
          "[.][ema][parity]") {
  const char* path = std::getenv("LOOM_EMA_PARITY_FILE");
  if (path == nullptr) FAIL("LOOM_EMA_PARITY_FILE is not set");
  const auto fixture = loom::checkpoint::load_value(path).toGenericDict();
  const double decay = fixture.at("decay").toDouble();
  const auto states = fixture.at("states").toList();
  REQUIRE(states.size() == 101);

  auto model = make_model();
  loom::state::load_module_state(*model, states.get(0), "states.0");
  loom::optim::EMA ema(*model, {.decay = decay});
  loom::state::Dict at50 = loom::state::new_dict();
  {
    SyncCounter counter;
    for (std::size_t i = 1; i <= 100; ++i) {
      loom::state::load_module_state(*model, states.get(i), "states");
      ema.update();
      if (i == 50) {  // a copy: the state's tensors are the EMA's own, as Python's are
        for (const auto& e : ema.state_dict()) at50.insert(e.key(), e.value().toTensor().clone());
      }
    }
    CHECK(SyncCounter::count() == 0);  // Python reads n_averaged == 0 every update; loom never
  }
  same_state(at50, fixture.at("ema50"), "after 50 updates");
  same_state(ema.state_dict(), fixture.at("ema100"), "after 100 updates");
  CHECK(ema.n_averaged() == 100);

  // Resumed from the state after 50 updates (loom's, then Python's): the same 100th state.
  for (const auto& saved : {c10::IValue(at50), fixture.at("ema50")}) {
    auto resumed_model = make_model();
    loom::state::load_module_state(*resumed_model, states.get(50), "states.50");
    loom::optim::EMA resumed(*resumed_model, {.decay = decay});
    resumed.load_state_dict(saved);
    CHECK(resumed.n_averaged() == 50);
    for (std::size_t i = 51; i <= 100; ++i) {
      loom::state::load_module_state(*resumed_model, states.get(i), "states");
      resumed.update();
    }
    same_state(resumed.state_dict(), fixture.at("ema100"), "resumed");
  }
  loom::checkpoint::save_value(std::string(path) + ".cpp.pt", c10::IValue(ema.state_dict()));
}

TEST_CASE("EMA swaps its weights into the model and back without copies", "[ema]") {
  auto model = make_model();
  loom::optim::EMA ema(*model, {.half_life = 1.0, .update_every = 2});
  CHECK(ema.decay() == 0.25);  // 0.5 ^ (2 / 1)
  const auto weight = model[0]->as<torch::nn::Linear>()->weight;
  const at::Tensor before = weight.detach().clone();
  ema.update();  // call 1: not an update
  CHECK(ema.n_averaged() == 0);
  ema.update();  // call 2: the first update copies
  CHECK(ema.n_averaged() == 1);
  {
    at::NoGradGuard no_grad;
    weight.add_(1.0);
  }
  ema.update();
  ema.update();  // 0.25 * w + 0.75 * (w + 1)
  const auto averaged = ema.averaged()[0].second.clone();
  CHECK(at::allclose(averaged, before + 0.75));
  const void* model_storage = weight.data_ptr();
  {
    auto scope = ema.swap();
    CHECK(at::equal(weight, averaged));
    CHECK(weight.requires_grad());
    CHECK(weight.data_ptr() != model_storage);
  }
  CHECK(at::equal(weight, before + 1.0));
  CHECK(weight.data_ptr() == model_storage);  // the model's own memory again
}

TEST_CASE("EMA goes through rt.save and rt.load as AveragedModel's state", "[ema]") {
  const auto dir =
      std::filesystem::temp_directory_path() / ("loom_ema_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  loom::Runtime<loom::Cpu, loom::Fp32> rt;
  auto model = make_model();
  rt.setup(model);
  loom::optim::EMA ema(*model);
  ema.update();
  ema.update();
  rt.save(dir / "ema.pt", loom::State{{"ema", ema}});
  const auto file = loom::checkpoint::load_value(dir / "ema.pt").toGenericDict();
  const auto saved = file.at("ema").toGenericDict();
  CHECK(saved.begin()->key().toStringRef() == "n_averaged");
  CHECK(saved.at("n_averaged").toTensor().item<int64_t>() == 2);
  CHECK(saved.contains("module.1.running_var"));

  auto other_model = make_model();
  loom::optim::EMA other(*other_model);
  rt.load(dir / "ema.pt", loom::State{{"ema", other}});
  CHECK(other.n_averaged() == 2);
  CHECK(at::equal(other.averaged()[0].second, ema.averaged()[0].second));
  std::filesystem::remove_all(dir);
}

TEST_CASE("EMA resumes in phase with update_every", "[ema]") {
  auto model = make_model();
  loom::optim::EMA ema(*model, {.decay = 0.5, .update_every = 3});
  for (int i = 0; i < 6; ++i) ema.update();  // updates at calls 3 and 6
  REQUIRE(ema.n_averaged() == 2);
  const auto state = ema.state_dict();
  loom::optim::EMA resumed(*model, {.decay = 0.5, .update_every = 3});
  resumed.update();  // calls counted before the load do not shift the phase
  resumed.update();
  resumed.load_state_dict(c10::IValue(state));
  for (int i = 0; i < 2; ++i) {  // calls 7 and 8: no update, in either
    ema.update();
    resumed.update();
  }
  CHECK(resumed.n_averaged() == 2);
  ema.update();  // call 9: both update
  resumed.update();
  CHECK(ema.n_averaged() == 3);
  CHECK(resumed.n_averaged() == 3);
}

TEST_CASE("EMA refuses bad settings and states", "[ema]") {
  auto model = make_model();
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(loom::optim::EMA(*model, {.decay = 1.5}),
                    Contains("loom::optim::EMA: Invalid decay value 1.5"));
  CHECK_THROWS_WITH(loom::optim::EMA(*model, {.decay = 0.9, .half_life = 10}),
                    Contains("give exactly one of decay and half_life"));
  CHECK_THROWS_WITH(loom::optim::EMA(*model, {.decay = 0.9, .update_every = 0}),
                    Contains("update_every must be at least 1"));
  loom::optim::EMA ema(*model);
  auto state = ema.state_dict();
  state.insert_or_assign("module.0.weight", at::zeros({2, 2}));
  CHECK_THROWS_WITH(ema.load_state_dict(state),
                    Contains("key \"module.0.weight\": has shape [2, 2], the model's is [5, 6]"));
  state = ema.state_dict();
  state.insert("module.extra", at::zeros({1}));
  CHECK_THROWS_WITH(ema.load_state_dict(state), Contains("unexpected key(s) \"module.extra\""));
}
