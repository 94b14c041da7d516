// Extension point: choosing the device and the precision from the command line.
//
//   cli [--device cpu] [--precision 16-mixed] [--steps 30]
//       [--init-scale 65536] [--growth-interval 2000] [--growth-factor 2] [--backoff-factor 0.5]
//       [--no-loss-scaling] [--cuda-index N]
//
// loom::with_runtime(device, precision, fn, options) turns two strings into a
// loom::Runtime<Device, Precision> and calls fn with it; fn is a generic lambda, compiled once
// per device x precision pair, so the training code below is written once for all of them.
// The options configure the policies with_runtime builds: the GradScaler of 16-mixed (the
// other precisions have none and ignore it) and the CUDA device's index. rt.loss_scale() is
// read the same way under every precision: 1 where there is no loss scaling.
// A bad name fails before any training, with a message listing the allowed names (exit 2).
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <utility>

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <CLI/CLI.hpp>

#include <loom/loom.hpp>

#include <loom/loggers/progress_bar.hpp>

namespace {

struct Options {
  std::string device = "cpu";
  std::string precision = "32-true";
  int64_t steps = 30;
  int64_t batch_size = 128;
  double lr = 0.05;
};

/// The class of a point is the largest of four fixed random projections of it.
std::pair<at::Tensor, at::Tensor> make_data(int64_t n) {
  auto x = torch::randn({n, 16});                      // (N, 16) f32
  auto y = x.matmul(torch::randn({16, 4})).argmax(1);  // (N,) i64
  return {x, y};
}

/// The same training code for every runtime with_runtime can build.
template <class RT>
int train(RT& rt, const Options& o) {
  torch::nn::Sequential model{nullptr};
  {
    // Under "-true" precisions the weights are created in the precision's dtype.
    [[maybe_unused]] auto init = rt.module_init_context();
    model = torch::nn::Sequential(torch::nn::Linear(16, 64), torch::nn::ReLU(),
                                  torch::nn::Linear(64, 4));
  }
  // SGD rather than Adam: Adam's default eps (1e-8) is 0 in fp16, which 16-true would hit.
  loom::optim::SGD opt(model->parameters(), loom::optim::SGDOptions(o.lr).momentum(0.9));
  rt.setup(model, opt);

  auto [x, y] = rt.to_device(make_data(o.steps * o.batch_size));
  std::printf("%s on %s: parameters %s\n", std::string(RT::precision_name()).c_str(),
              std::string(rt.device().name()).c_str(),
              c10::toString(model->parameters()[0].scalar_type()));

  const double first_scale = rt.loss_scale();
  int64_t skipped = 0;
  double first_loss = 0;
  loom::ProgressBar progress(o.steps, 10);
  for (int64_t step = 0; step < o.steps; ++step) {
    auto input = x.narrow(0, step * o.batch_size, o.batch_size);       // (B, 16) f32
    auto target = y.narrow(0, step * o.batch_size, o.batch_size);      // (B,) i64
    auto logits = rt.forward(model, input);                            // (B, 4) f32
    auto loss = torch::nn::functional::cross_entropy(logits, target);  // () f32
    double l = rt.backward(loss, model).template item<double>();
    // 16-mixed skips a step whose gradients overflowed, and lowers the scale.
    if (!rt.optimizer_step(opt)) ++skipped;
    opt.zero_grad();
    if (step == 0) first_loss = l;
    progress.step(o.batch_size, l);
  }
  progress.finish();

  std::printf("loss scale %g -> %g, %lld step(s) skipped\n", first_scale, rt.loss_scale(),
              static_cast<long long>(skipped));
  const double last_loss = progress.mean_loss();
  const bool fell = last_loss < 0.7 * first_loss;
  std::printf("loss %.4f -> %.4f: %s\n", first_loss, last_loss, fell ? "fell" : "did NOT fall");
  return fell ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  // Start from the library's defaults, so the flags only override what they name.
  loom::RuntimeOptions options;
  auto& scaler = options.precision.grad_scaler;
  bool no_loss_scaling = false;
  int cuda_index = -1;

  CLI::App app{"Trains a small MLP with the device and precision named on the command line.",
               "cli"};
  app.option_defaults()->always_capture_default();
  app.add_option("--device", o.device, "cpu, cuda, gpu or auto");
  app.add_option("--precision", o.precision,
                 "one of " + std::string(loom::precision::allowed_names));
  app.add_option("--steps", o.steps, "training steps")->check(CLI::PositiveNumber);
  app.add_option("--lr", o.lr, "SGD's learning rate")->check(CLI::PositiveNumber);
  const std::string scaling = "16-mixed loss scaling";
  app.add_option("--init-scale", scaler.init_scale, "the scale before the first step")
      ->group(scaling)
      ->check(CLI::PositiveNumber);
  app.add_option("--growth-interval", scaler.growth_interval,
                 "clean steps in a row before the scale grows")
      ->group(scaling)
      ->check(CLI::PositiveNumber);
  app.add_option("--growth-factor", scaler.growth_factor, "must be > 1")->group(scaling);
  app.add_option("--backoff-factor", scaler.backoff_factor, "in (0, 1)")->group(scaling);
  app.add_flag("--no-loss-scaling", no_loss_scaling, "turn the GradScaler off")->group(scaling);
  app.add_option("--cuda-index", cuda_index, "the GPU to use (-1: LOCAL_RANK, else 0)")
      ->check(CLI::Range(-1, 1023));
  CLI11_PARSE(app, argc, argv);
  scaler.enabled = !no_loss_scaling;
  if (cuda_index >= 0) options.cuda.index = static_cast<c10::DeviceIndex>(cuda_index);

  try {
    torch::manual_seed(0);
    // Unknown names throw loom::Error naming the allowed ones; the GradScaler checks its
    // options when 16-mixed builds it.
    return loom::with_runtime(
        o.device, o.precision, [&](auto& rt) { return train(rt, o); }, options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cli: %s\n", e.what());
    return 2;
  }
}
