// Extension point: a custom device policy.
//
//   custom_device [--threads 1] [--epochs 3] [--batches 10] [--batch-size 64]
//
// "counting-cpu" is the host CPU with two additions: prepare() pins LibTorch's intra-op thread
// count (so a run's speed does not depend on how many cores the machine has), and every move
// is counted (what a profiling or tracing device would hook). A device derives from
// loom::device::Defaults<Self>, names itself with three constants and overrides only what
// differs; an override that still wants the default behaviour calls the base explicitly.
// Trains a small regression MLP on generated data and prints what the device did; exits 1 if
// the loss did not fall.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <ATen/Parallel.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <CLI/CLI.hpp>

#include <loom/loom.hpp>

#include <loom/loggers/progress_bar.hpp>

/// What CountingCpu moved.
struct MoveCounts {
  int64_t modules = 0;
  int64_t tensors = 0;
  int64_t bytes = 0;
};

/// The CPU, with a fixed intra-op thread count and a count of every module and tensor moved.
class CountingCpu : public loom::device::Defaults<CountingCpu> {
  using Base = loom::device::Defaults<CountingCpu>;

 public:
  static constexpr c10::DeviceType device_type() { return c10::kCPU; }
  static constexpr std::string_view name() { return "counting-cpu"; }
  static constexpr std::string_view ddp_backend() { return "gloo"; }

  explicit CountingCpu(int threads) : threads_(threads) {}

  /// Runs first in Runtime::setup. Idempotent, as the concept asks: the same count again
  /// changes nothing.
  void prepare() {
    if (threads_ > 0) at::set_num_threads(threads_);
  }

  void module_to_device(torch::nn::Module& module) {
    ++counts_->modules;
    Base::module_to_device(module);
  }

  /// const, with the base's exact signature: a non-const overload would hide the default
  /// from const callers such as Runtime::to_device.
  at::Tensor tensor_to_device(const at::Tensor& t) const {
    ++counts_->tensors;
    counts_->bytes += static_cast<int64_t>(t.nbytes());
    return Base::tensor_to_device(t);
  }

  /// The counts go into Runtime::state_dict() as "device.tensors_moved", and back.
  loom::StateDict state_dict() const { return {{"tensors_moved", counts_->tensors}}; }
  void load_state_dict(const loom::StateDict& state) {
    if (auto it = state.find("tensors_moved"); it != state.end()) {
      counts_->tensors = it->second.toInt();
    }
  }

  int threads() const { return threads_; }
  const MoveCounts& counts() const { return *counts_; }

 private:
  int threads_;
  // Shared, not a plain member: the data loader moves batches through its own copy of the
  // device, and those moves must land in the same counts.
  std::shared_ptr<MoveCounts> counts_ = std::make_shared<MoveCounts>();
};

static_assert(loom::DevicePolicy<CountingCpu>);
// Overrides, not new members beside the defaults (a misspelt name would compile and be ignored).
static_assert(!loom::is_default(&CountingCpu::prepare));
static_assert(!loom::is_default(&CountingCpu::tensor_to_device));
static_assert(loom::is_default(&CountingCpu::optimizer_to_device));

namespace {

struct Options {
  int threads = 1;
  int epochs = 3;
  int64_t batches = 10;
  int64_t batch_size = 64;
};

/// Generated regression batches: y = tanh(x . w) plus a little noise, w scaled so that x . w
/// has unit variance (tanh neither saturated nor linear).
std::vector<std::pair<at::Tensor, at::Tensor>> make_batches(int64_t n, int64_t size) {
  auto w = torch::randn({8, 1}) / std::sqrt(8.0);  // (8, 1) f32
  std::vector<std::pair<at::Tensor, at::Tensor>> batches;
  for (int64_t i = 0; i < n; ++i) {
    auto x = torch::randn({size, 8});                                    // (B, 8) f32
    auto y = torch::tanh(x.matmul(w)) + 0.05 * torch::randn({size, 1});  // (B, 1) f32
    batches.emplace_back(x, y);
  }
  return batches;
}

int run(const Options& o) {
  loom::Runtime<CountingCpu, loom::Fp32> rt(CountingCpu(o.threads));
  torch::nn::Sequential model(torch::nn::Linear(8, 32), torch::nn::Tanh(),
                              torch::nn::Linear(32, 1));
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-2));
  rt.setup(model, opt);  // prepare, convert_module (none in fp32), module_to_device
  std::printf("%s: prepare() pinned %d intra-op thread(s); LibTorch now uses %d\n",
              std::string(rt.device().name()).c_str(), rt.device().threads(),
              at::get_num_threads());

  auto batches = make_batches(o.batches, o.batch_size);
  loom::ProgressBar progress(o.epochs * o.batches, 5);
  double first_loss = 0;
  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    // Any range of batches works as a source; each batch is moved as it is reached.
    for (auto& [x, y] : rt.dataloader(batches)) {
      auto pred = rt.forward(model, x);                      // (B, 1) f32
      auto loss = torch::nn::functional::mse_loss(pred, y);  // () f32
      double l = rt.backward(loss, model).item<double>();
      rt.optimizer_step(opt);
      opt.zero_grad();
      if (progress.steps() == 0) first_loss = l;
      progress.step(x.size(0), l);
    }
  }
  progress.finish();

  const auto& c = rt.device().counts();
  std::printf("moved %lld module(s) and %lld tensors (%.1f KiB) in %lld batches\n",
              static_cast<long long>(c.modules), static_cast<long long>(c.tensors),
              static_cast<double>(c.bytes) / 1024, static_cast<long long>(o.epochs * o.batches));
  auto state = rt.state_dict();
  std::printf("state_dict: device.tensors_moved = %lld\n",
              static_cast<long long>(state.at("device.tensors_moved").toInt()));

  const double last_loss = progress.mean_loss();
  const bool fell = last_loss < 0.7 * first_loss;
  std::printf("loss %.4f -> %.4f: %s\n", first_loss, last_loss, fell ? "fell" : "did NOT fall");
  return fell ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Trains through a custom \"counting-cpu\" device policy.", "custom_device"};
  app.option_defaults()->always_capture_default();
  app.add_option("--threads", o.threads, "intra-op threads prepare() sets (0: leave as is)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--epochs", o.epochs)->check(CLI::PositiveNumber);
  app.add_option("--batches", o.batches, "generated batches per epoch")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", o.batch_size)->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  try {
    torch::manual_seed(0);
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "custom_device: %s\n", e.what());
    return 2;
  }
}
