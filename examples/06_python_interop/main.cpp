// From C++ to Python: train in C++, then open the checkpoint with stock PyTorch.
//
//   python_interop --data build/data/fashion-mnist --out model.pt [--max-steps 300]
//   python examples/06_python_interop/evaluate.py model.pt build/data/fashion-mnist
//
// The C++ side trains an MLP on Fashion-MNIST with loom's fused Adam, measures its test
// accuracy, and writes one checkpoint with rt.save: the model's state_dict, the optimizer in
// Python's layout, the runtime's state, two plain numbers and the class it predicted for each
// test image, in the file's order (an int64 tensor). The file is a torch.save file: evaluate.py
// opens it with torch.load(path) (weights_only=True, no allowlist, nothing from loom), loads the
// weights into the same torch.nn.Sequential and predicts the same class for every test image.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <torch/data/dataloader.h>
#include <torch/data/datasets/map.h>
#include <torch/data/datasets/mnist.h>
#include <torch/data/samplers/sequential.h>
#include <torch/data/transforms/stack.h>
#include <torch/data/transforms/tensor.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <CLI/CLI.hpp>

#include <loom/loom.hpp>

#include <loom/loggers/progress_bar.hpp>

namespace {

auto dataset(const std::string& root, torch::data::datasets::MNIST::Mode mode) {
  return torch::data::datasets::MNIST(root, mode)
      .map(torch::data::transforms::Normalize<>(0.2860, 0.3530))
      .map(torch::data::transforms::Stack<>());
}

}  // namespace

int main(int argc, char** argv) {
  std::string data = "data/fashion-mnist", out = "model.pt";
  int64_t max_steps = 300;
  CLI::App app{"Trains an MLP in C++ and saves a checkpoint stock PyTorch opens.",
               "python_interop"};
  app.option_defaults()->always_capture_default();
  app.add_option("--data", data, "directory with Fashion-MNIST's IDX files");
  app.add_option("--out", out, "the checkpoint to write");
  app.add_option("--max-steps", max_steps)->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    using Mode = torch::data::datasets::MNIST::Mode;
    loom::seed_everything(0);
    loom::Runtime<loom::Cpu, loom::Fp32> rt;
    // The names of Python's torch.nn.Sequential: 0 (Flatten), 1 (Linear), 2 (ReLU), 3.
    torch::nn::Sequential model(torch::nn::Flatten(), torch::nn::Linear(28 * 28, 256),
                                torch::nn::ReLU(), torch::nn::Linear(256, 10));
    loom::optim::Adam opt(model->parameters(), loom::optim::AdamOptions(1e-3));
    rt.setup(model, opt);
    auto loader = torch::data::make_data_loader(dataset(data, Mode::kTrain),
                                                torch::data::DataLoaderOptions(64));
    loom::ProgressBar progress(max_steps);
    int64_t step = 0;
    for (auto& batch : rt.dataloader(*loader)) {
      if (step == max_steps) break;
      auto loss = torch::nn::functional::cross_entropy(rt.forward(model, batch.data), batch.target);
      progress.step(batch.data.size(0), rt.backward(loss, model).item<double>());
      rt.optimizer_step(opt);
      opt.zero_grad();
      ++step;
    }
    progress.finish();

    model->eval();
    int64_t correct = 0, total = 0;
    std::vector<torch::Tensor> predicted;
    {
      torch::NoGradGuard no_grad;
      // In the file's order, so that evaluate.py compares its predictions image for image.
      auto test = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
          dataset(data, Mode::kTest), torch::data::DataLoaderOptions(1000));
      for (auto& batch : rt.dataloader(*test)) {
        auto classes = rt.forward(model, batch.data).argmax(1);
        correct += classes.eq(batch.target).sum().item<int64_t>();
        total += batch.data.size(0);
        predicted.push_back(classes.to(torch::kCPU, torch::kInt64));
      }
    }
    double accuracy = static_cast<double>(correct) / static_cast<double>(total);
    torch::Tensor predictions = torch::cat(predicted);
    rt.save(out, {{"model", model},
                  {"optimizer", opt},
                  {"runtime", rt},
                  {"step", step},
                  {"test_correct", correct},
                  {"test_accuracy", accuracy},
                  {"test_predictions", predictions}});
    std::printf("C++: %lld steps, test accuracy %.2f%% (%lld of %lld); saved %s\n",
                static_cast<long long>(step), 100 * accuracy, static_cast<long long>(correct),
                static_cast<long long>(total), out.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "python_interop: %s\n", e.what());
    return 2;
  }
}
