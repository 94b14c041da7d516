// Extension point: a custom precision policy.
//
//   custom_precision [--device cpu] [--steps 40] [--batch-size 128] [--lr 1e-2]
//
// "pure-bf16" keeps weights and inputs in bf16 and hands outputs back in fp32, so the loss and
// everything after the model stay fp32. Unlike the shipped "bf16-true" it leaves LibTorch's
// default dtype alone: tensors the model creates inside forward stay fp32.
// A policy derives from loom::precision::Defaults<Self> and writes only what differs; the
// other members (backward, optimizer_step, clipping, state, ...) come from the base.
// Trains a small MLP on generated data and prints the dtypes and the falling loss; exits 1 if
// the loss did not fall.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>
#include <utility>

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <CLI/CLI.hpp>

#include <loom/loom.hpp>

#include <loom/loggers/progress_bar.hpp>

/// bf16 weights and inputs, fp32 outputs; no autocast, no loss scaling (bf16 has fp32's range).
struct PureBf16 : loom::precision::Defaults<PureBf16> {
  static constexpr std::string_view precision() { return "pure-bf16"; }

  /// In place (set_data): an optimizer built before setup() keeps its parameters.
  void convert_module(torch::nn::Module& module) const {
    loom::precision::cast_module(module, c10::kBFloat16);
  }
  /// Floating leaves only: labels and ids (int64) must not become bf16.
  at::Tensor convert_input(const at::Tensor& t) const {
    return loom::precision::cast_floating(t, c10::kBFloat16);
  }
  /// Back to the default dtype, so a loss computed on the output is fp32.
  at::Tensor convert_output(const at::Tensor& t) const {
    return loom::precision::cast_to_default(t);
  }
};

// The whole PrecisionPolicy surface, checked here rather than at the first Runtime<...>.
static_assert(loom::PrecisionPolicy<PureBf16>);
// A misspelt override (say `convert_inputs`, or a missing const) compiles and silently keeps
// the default; these fail to compile instead.
static_assert(!loom::is_default(&PureBf16::convert_module));
static_assert(!loom::is_default(&PureBf16::convert_input));
static_assert(!loom::is_default(&PureBf16::convert_output));
// What was not written is inherited: a plain backward, no loss scaling.
static_assert(loom::is_default(&PureBf16::backward));

namespace {

struct Options {
  std::string device = "cpu";
  int64_t steps = 40;
  int64_t batch_size = 128;
  double lr = 1e-2;
};

/// Generated data a small MLP can learn in a few dozen steps: the class of a point is the
/// largest of four fixed random projections of it.
std::pair<at::Tensor, at::Tensor> make_data(int64_t n) {
  auto x = torch::randn({n, 16});        // (N, 16) f32
  auto teacher = torch::randn({16, 4});  // (16, 4) f32
  auto y = x.matmul(teacher).argmax(1);  // (N,) i64
  return {x, y};
}

template <class RT>
int train(RT& rt, const Options& o) {
  torch::nn::Sequential model(torch::nn::Linear(16, 64), torch::nn::ReLU(),
                              torch::nn::Linear(64, 4));
  // Built before setup(): cast_module keeps each parameter's TensorImpl, so Adam follows it
  // to bf16 (and its moments are bf16 too: no fp32 master copy in this policy).
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(o.lr));
  rt.setup(model, opt);

  auto [x, y] = make_data(4096);
  const int64_t n_batches = x.size(0) / o.batch_size;
  std::printf("%s on %s: parameters %s\n", std::string(RT::precision_name()).c_str(),
              std::string(rt.device().name()).c_str(),
              c10::toString(model->parameters()[0].scalar_type()));

  loom::ProgressBar progress(o.steps, 10);
  double first_loss = 0;
  for (int64_t step = 0; step < o.steps; ++step) {
    const int64_t start = step % n_batches * o.batch_size;
    auto batch = rt.to_device(std::pair(x.narrow(0, start, o.batch_size),    // (B, 16) f32
                                        y.narrow(0, start, o.batch_size)));  // (B,) i64
    c10::ScalarType seen{};
    auto logits = rt.forward(
        [&](const at::Tensor& input) {
          seen = input.scalar_type();  // after convert_input
          return model->forward(input);
        },
        batch.first);  // (B, 4) f32, after convert_output
    if (step == 0) {
      std::printf("input %s inside forward, output %s\n", c10::toString(seen),
                  c10::toString(logits.scalar_type()));
    }
    auto loss = torch::nn::functional::cross_entropy(logits, batch.second);  // () f32
    double l = rt.backward(loss, model).template item<double>();
    rt.optimizer_step(opt);
    opt.zero_grad();
    if (step == 0) first_loss = l;
    progress.step(o.batch_size, l);
  }
  progress.finish();

  const double last_loss = progress.mean_loss();  // the last 20 steps: one step is noisy
  const bool fell = last_loss < 0.7 * first_loss;
  std::printf("loss %.4f -> %.4f: %s\n", first_loss, last_loss, fell ? "fell" : "did NOT fall");
  return fell ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Trains a small MLP under a custom \"pure-bf16\" precision policy.",
               "custom_precision"};
  app.option_defaults()->always_capture_default();
  app.add_option("--device", o.device, "cpu, cuda, gpu or auto");
  app.add_option("--steps", o.steps, "training steps")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", o.batch_size)->check(CLI::Range(1, 4096));
  app.add_option("--lr", o.lr, "Adam's learning rate")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  try {
    torch::manual_seed(0);
    // A custom policy goes where a shipped one would; only the device is chosen at run time.
    return loom::device::with_device(o.device, [&](auto device) {
      loom::Runtime<decltype(device), PureBf16> rt(std::move(device));
      return train(rt, o);
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "custom_precision: %s\n", e.what());
    return 2;
  }
}
