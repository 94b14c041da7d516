// Quick start: an MLP learns Fashion-MNIST through loom::Runtime<Device, Precision>.
//
//   quickstart --data build/data/fashion-mnist [--device cpu] [--precision 32-true]
//              [--epochs 1] [--max-steps N] [--batch-size 64] [--lr 1e-3]
//
// --device and --precision take Composer's and Lightning's names ("cuda", "bf16-mixed", ...):
// loom::with_runtime turns the two strings into a Runtime type, and train_and_evaluate is
// compiled once per device x precision pair.
// Prints the dtypes the model sees, then step, loss and samples/s as it trains, then the
// test accuracy; exits 1 if the model did not learn (accuracy below 70%).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

#include <torch/data/dataloader.h>
#include <torch/data/datasets/map.h>
#include <torch/data/datasets/mnist.h>
#include <torch/data/transforms/stack.h>
#include <torch/data/transforms/tensor.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <loom/loom.hpp>

namespace {

struct Options {
  std::string data = "data/fashion-mnist";
  std::string device = "cpu";
  std::string precision = "32-true";
  int epochs = 1;
  int64_t max_steps = -1;
  int64_t batch_size = 64;
  double lr = 1e-3;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument("missing value after " + std::string(a));
      return argv[++i];
    };
    if (a == "--data") o.data = value();
    else if (a == "--device") o.device = value();
    else if (a == "--precision") o.precision = value();
    else if (a == "--epochs") o.epochs = std::stoi(value());
    else if (a == "--max-steps") o.max_steps = std::stoll(value());
    else if (a == "--batch-size") o.batch_size = std::stoll(value());
    else if (a == "--lr") o.lr = std::stod(value());
    else if (a == "--help" || a == "-h") {
      std::printf(
          "usage: quickstart [--data DIR] [--device NAME] [--precision NAME] [--epochs N]\n"
          "                  [--max-steps N] [--batch-size N] [--lr X]\n"
          "  --device     cpu (default), cuda, gpu or auto\n"
          "  --precision  one of %s\n",
          std::string(loom::precision::allowed_names).c_str());
      std::exit(0);
    } else {
      throw std::invalid_argument("unknown argument " + std::string(a));
    }
  }
  return o;
}

torch::nn::Sequential make_model() {
  return torch::nn::Sequential(torch::nn::Flatten(), torch::nn::Linear(28 * 28, 256),
                               torch::nn::ReLU(), torch::nn::Linear(256, 10));
}

auto dataset(const std::string& root, torch::data::datasets::MNIST::Mode mode) {
  // Fashion-MNIST's pixel mean and standard deviation.
  return torch::data::datasets::MNIST(root, mode)
      .map(torch::data::transforms::Normalize<>(0.2860, 0.3530))
      .map(torch::data::transforms::Stack<>());
}

/// Trains and evaluates with any runtime: the device and precision are its template arguments.
template <class RT>
double train_and_evaluate(RT& rt, const Options& o) {
  using Mode = torch::data::datasets::MNIST::Mode;
  torch::nn::Sequential model{nullptr};
  {
    [[maybe_unused]] auto init = rt.module_init_context();
    model = make_model();
  }
  // In fp16 Adam's default eps (1e-8) rounds to 0, and a zero second moment then divides by
  // zero: true-fp16 training needs an eps fp16 can represent.
  constexpr bool fp16_weights = std::is_same_v<typename RT::precision_policy, loom::Fp16True>;
  torch::optim::Adam opt(model->parameters(),
                         torch::optim::AdamOptions(o.lr).eps(fp16_weights ? 1e-4 : 1e-8));
  rt.setup(model, opt);

  auto train_set = dataset(o.data, Mode::kTrain);
  const auto n_train = *train_set.size();
  auto train_loader = torch::data::make_data_loader(
      std::move(train_set), torch::data::DataLoaderOptions(o.batch_size));

  std::printf("training an MLP on Fashion-MNIST (%zu images), %s on %s\n", n_train,
              std::string(RT::precision_name()).c_str(), std::string(rt.device().name()).c_str());
  int64_t step = 0, seen = 0;
  double running = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (int epoch = 0; epoch < o.epochs && step != o.max_steps; ++epoch) {
    model->train();
    for (auto& batch : rt.dataloader(*train_loader)) {
      if (step == o.max_steps) break;
      at::Tensor logits;
      if (step == 0) {
        // What the precision does, observed: weights, the input and the activation inside
        // the forward context, and the output handed back outside it.
        c10::ScalarType input{}, hidden{};
        logits = rt.forward(
            [&](const at::Tensor& x) {
              input = x.scalar_type();
              auto h = model[1]->as<torch::nn::Linear>()->forward(x.flatten(1));
              hidden = h.scalar_type();
              return model->forward(x);
            },
            batch.data);
        std::printf("dtypes: weights %s, input %s, activation %s inside forward, output %s\n",
                    c10::toString(model->parameters()[0].scalar_type()), c10::toString(input),
                    c10::toString(hidden), c10::toString(logits.scalar_type()));
      } else {
        logits = rt.forward(model, batch.data);                         // (B, 10)
      }
      auto loss = torch::nn::functional::cross_entropy(logits, batch.target);
      running += rt.backward(loss, model).template item<double>();
      rt.optimizer_step(opt);
      opt.zero_grad();
      ++step;
      seen += batch.data.size(0);
      if (step % 100 == 0) {
        double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("epoch %d step %5lld  loss %.4f  %8.0f samples/s\n", epoch,
                    static_cast<long long>(step), running / 100, seen / secs);
        std::fflush(stdout);
        running = 0;
      }
    }
  }

  model->eval();
  torch::NoGradGuard no_grad;
  auto test_set = dataset(o.data, Mode::kTest);
  auto test_loader =
      torch::data::make_data_loader(std::move(test_set), torch::data::DataLoaderOptions(1000));
  int64_t correct = 0, total = 0;
  for (auto& batch : rt.dataloader(*test_loader)) {
    auto logits = rt.forward(model, batch.data);
    correct += logits.argmax(1).eq(batch.target).sum().template item<int64_t>();
    total += batch.data.size(0);
  }
  return static_cast<double>(correct) / static_cast<double>(total);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Options o = parse(argc, argv);
    torch::manual_seed(0);
    double accuracy = loom::with_runtime(o.device, o.precision,
                                         [&](auto& rt) { return train_and_evaluate(rt, o); });
    bool learned = accuracy >= 0.70;
    std::printf("test accuracy %.2f%%: %s\n", 100 * accuracy, learned ? "learned" : "did NOT learn");
    return learned ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "quickstart: %s\n", e.what());
    return 2;
  }
}
