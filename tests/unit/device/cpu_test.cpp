// loom::Cpu and the device defaults: names, tensor and module moves, optimizer-state moves
// (and registering unknown state types), no state, the inline data loader.
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/data/dataloader.h>
#include <torch/data/datasets/map.h>
#include <torch/data/datasets/tensor.h>
#include <torch/data/samplers/sequential.h>
#include <torch/data/transforms/stack.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include "support/catch.hpp"
#include "support/warnings.hpp"

#include <loom/loom.hpp>

using loom::Cpu;

namespace {

/// A device policy for the meta device: real moves, checked without an accelerator.
struct Meta : loom::device::Defaults<Meta> {
  static constexpr c10::DeviceType device_type() { return c10::kMeta; }
  static constexpr std::string_view name() { return "meta"; }
  static constexpr std::string_view ddp_backend() { return "gloo"; }
};

/// An optimizer state loom does not know.
struct CustomState : torch::optim::OptimizerParamState {
  at::Tensor buffer;
  std::unique_ptr<OptimizerParamState> clone() const override {
    return std::make_unique<CustomState>(*this);
  }
};

void one_step(torch::nn::Linear& model, torch::optim::Optimizer& opt) {
  opt.zero_grad();
  model->forward(at::ones({2, 3})).sum().backward();
  opt.step();
}

}  // namespace

TEST_CASE("Cpu names itself and its backend", "[device][cpu]") {
  Cpu cpu;
  CHECK(cpu.device() == c10::Device(c10::kCPU));
  CHECK(Cpu::name() == "cpu");
  CHECK(Cpu::ddp_backend() == "gloo");
  cpu.prepare();
  cpu.prepare();  // idempotent
}

TEST_CASE("Cpu::tensor_to_device returns a CPU tensor already there unchanged", "[device][cpu]") {
  Cpu cpu;
  auto t = at::ones({1, 1, 1, 1});
  auto m = cpu.tensor_to_device(t);
  CHECK(m.unsafeGetTensorImpl() == t.unsafeGetTensorImpl());
  CHECK(cpu.tensor_to_device(at::ones({2}, at::kHalf)).scalar_type() == at::kHalf);
}

TEST_CASE("Runtime::to_device moves every leaf of a nested batch", "[device][batch]") {
  loom::Runtime<Meta, loom::Fp32> rt;
  using Meta_ = std::map<std::string, std::vector<std::vector<int>>>;
  auto batch =
      std::make_tuple(at::ones({2, 3}), std::map<std::string, at::Tensor>{{"y", at::arange(2)}},
                      Meta_{{"shape", {{1, 2}, {3}}}}, std::vector<std::string>{"a", "b"});
  auto moved = rt.to_device(batch);
  CHECK(std::get<0>(moved).is_meta());
  CHECK(std::get<1>(moved).at("y").is_meta());
  CHECK(std::get<1>(moved).at("y").scalar_type() == at::kLong);
  CHECK(std::get<2>(moved) == std::get<2>(batch));
  CHECK((std::get<3>(moved) == std::vector<std::string>{"a", "b"}));

  loom::Runtime<Cpu, loom::Fp32> cpu_rt;
  auto same = cpu_rt.to_device(batch);
  CHECK(std::get<0>(same).unsafeGetTensorImpl() == std::get<0>(batch).unsafeGetTensorImpl());
}

TEST_CASE("module_to_device keeps parameter identity and dtypes", "[device][cpu]") {
  torch::nn::Sequential net(torch::nn::Linear(3, 4), torch::nn::BatchNorm1d(4));
  std::vector<c10::TensorImpl*> before;
  for (auto& p : net->parameters()) before.push_back(p.unsafeGetTensorImpl());
  torch::optim::SGD opt(net->parameters(), 0.1);
  Cpu cpu;
  cpu.module_to_device(*net);
  auto params = net->parameters();
  REQUIRE(params.size() == before.size());
  for (std::size_t i = 0; i < params.size(); ++i)
    CHECK(params[i].unsafeGetTensorImpl() == before[i]);
  auto buffers = net->named_buffers();
  CHECK(buffers["1.num_batches_tracked"].scalar_type() == at::kLong);
  // The optimizer built before the move still updates the parameters.
  auto w0 = params[0].clone();
  (net->forward(at::randn({5, 3})) * at::randn({5, 4})).sum().backward();
  opt.step();
  CHECK_FALSE(params[0].equal(w0));
}

TEST_CASE("optimizer_to_device moves Adam's state and leaves params and step", "[device][optim]") {
  torch::nn::Linear model(3, 2);
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-3).amsgrad(true));
  one_step(model, adam);
  Meta meta;
  auto& same = meta.optimizer_to_device(adam);
  CHECK(&same == &adam);
  REQUIRE(adam.state().size() == 2);
  for (auto& kv : adam.state()) {
    auto& s = static_cast<torch::optim::AdamParamState&>(*kv.second);
    CHECK(s.exp_avg().is_meta());
    CHECK(s.exp_avg_sq().is_meta());
    CHECK(s.max_exp_avg_sq().is_meta());
    CHECK(s.step() == 1);
  }
  for (auto& p : model->parameters()) CHECK(p.device().is_cpu());
}

TEST_CASE("optimizer_to_device moves SGD momentum and skips undefined buffers", "[device][optim]") {
  torch::nn::Linear model(3, 2);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  one_step(model, sgd);
  loom::device::move_optimizer_state(sgd, c10::Device(c10::kMeta));
  for (auto& kv : sgd.state()) {
    CHECK(static_cast<torch::optim::SGDParamState&>(*kv.second).momentum_buffer().is_meta());
  }
  torch::optim::SGD plain(model->parameters(), 0.1);  // no momentum: no state at all
  one_step(model, plain);
  CHECK_NOTHROW(Meta().optimizer_to_device(plain));
}

TEST_CASE("optimizer_to_device refuses unknown state types until registered", "[device][optim]") {
  torch::nn::Linear model(3, 2);
  torch::optim::SGD sgd(model->parameters(), 0.1);
  auto key = model->weight.unsafeGetTensorImpl();
  auto state = std::make_unique<CustomState>();
  state->buffer = at::ones({2});
  sgd.state()[key] = std::move(state);
  Meta meta;
  CHECK_THROWS_WITH(meta.optimizer_to_device(sgd),
                    Catch::Matchers::Contains("CustomState") &&
                        Catch::Matchers::Contains("register_optimizer_state"));
  loom::device::register_optimizer_state<CustomState>(
      [](CustomState& s, const c10::Device& d) { s.buffer = s.buffer.to(d); });
  meta.optimizer_to_device(sgd);
  CHECK(static_cast<CustomState&>(*sgd.state()[key]).buffer.is_meta());
}

TEST_CASE("Cpu's state is the CPU generator's, as torch.get_rng_state()", "[device][cpu][state]") {
  Cpu cpu;
  at::manual_seed(7);
  const auto state = cpu.state_dict();
  REQUIRE(state.size() == 1);
  const at::Tensor rng = state.at("torch").toTensor();
  CHECK(rng.scalar_type() == at::kByte);
  CHECK(rng.numel() == 5056);  // the mt19937 state and the normal cache, as Python's
  const at::Tensor first = at::rand({16});
  CHECK_FALSE(at::rand({16}).equal(first));
  cpu.load_state_dict(state);
  CHECK(at::rand({16}).equal(first));  // resumed where the state was taken
  // The CUDA generator of a state saved by loom::Cuda has no meaning here: ignored.
  CHECK_NOTHROW(cpu.load_state_dict({{"torch.cuda", at::zeros({16}, at::kByte)}}));
  CHECK_NOTHROW(cpu.load_state_dict({}));
  loom::testing::WarningCatcher warnings;
  CHECK_NOTHROW(cpu.load_state_dict({{"torch", at::zeros({3}, at::kByte)}}));
  REQUIRE(warnings.messages.size() == 1);
  CHECK_THAT(warnings.messages[0], Catch::Matchers::Contains("RNG state was not restored"));
  CHECK_THROWS_WITH(
      cpu.load_state_dict({{"rng", at::ones({1})}}),
      Catch::Matchers::Equals("loom::device::Cpu::load_state_dict: unexpected key(s) \"rng\""));
  CHECK_THROWS_WITH(
      cpu.load_state_dict({{"torch", 1}}),
      Catch::Matchers::Equals(
          "loom::device::Cpu::load_state_dict: key \"torch\": expected a tensor, got an int"));
}

TEST_CASE("dataloader_to_device yields every batch in order through prefetch_fn",
          "[device][data]") {
  std::vector<std::tuple<at::Tensor, int>> source;
  for (int i = 0; i < 5; ++i) source.emplace_back(at::full({2}, float(i)), i);
  Meta meta;
  int calls = 0;
  auto view = meta.dataloader_to_device(source, [&](std::tuple<at::Tensor, int> b) {
    ++calls;
    CHECK(std::get<0>(b).is_meta());  // moved before prefetch_fn sees it
    std::get<1>(b) *= 10;
    return b;
  });
  std::vector<int> seen;
  for (auto& b : view) seen.push_back(std::get<1>(b));
  CHECK((seen == std::vector<int>{0, 10, 20, 30, 40}));
  CHECK(calls == 5);
  // A second pass starts again.
  std::size_t n = 0;
  for (auto& b : view) n += std::get<1>(b) >= 0;
  CHECK(n == 5);
}

TEST_CASE("dataloader_to_device wraps a torch::data loader, last batch kept", "[device][data]") {
  auto dataset = torch::data::datasets::TensorDataset(at::arange(10).to(at::kFloat).unsqueeze(1))
                     .map(torch::data::transforms::Stack<torch::data::TensorExample>());
  auto loader = torch::data::make_data_loader(std::move(dataset),
                                              torch::data::samplers::SequentialSampler(10), 4);
  loom::Runtime<Cpu, loom::Fp32> rt;
  std::vector<int64_t> sizes;
  float sum = 0;
  for (auto& b : rt.dataloader(*loader)) {
    sizes.push_back(b.data.size(0));
    sum += b.data.sum().item<float>();
  }
  CHECK((sizes == std::vector<int64_t>{4, 4, 2}));
  CHECK(sum == 45.f);
}
