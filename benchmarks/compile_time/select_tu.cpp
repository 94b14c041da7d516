// Compile-time cost of choosing a runtime by name: one translation unit as a command-line
// program writes it (examples/04_cli), loom::with_runtime over a generic training step. Built
// as is, with_runtime compiles the step for every device x precision pair (2 x 7); with
// -DLOOM_SELECT_LIMITED, for loom::devices<Cpu> x loom::precisions<Fp32, Bf16Mixed> only (1 x 2).
// Not part of the build (docs/runtime.md#choosing-a-runtime-at-run-time quotes the figures):
//
//   /usr/bin/time -f %e g++-12 -std=gnu++20 -O3 -DNDEBUG -I include -isystem $TORCH_INCLUDE
//       -isystem $TORCH_INCLUDE/torch/csrc/api/include [-DLOOM_SELECT_LIMITED]
//       -c benchmarks/compile_time/select_tu.cpp -o /dev/null
#include <string>

#include <loom/select.hpp>

#include "common_model.hpp"

namespace F = torch::nn::functional;

double train_one_step(const std::string& device, const std::string& precision) {
  auto step = [&](auto& rt) {
    torch::nn::Sequential model(torch::nn::Linear(16, 32), torch::nn::ReLU(),
                                torch::nn::Linear(32, 4));
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
    rt.setup(model, opt);
    auto x = rt.to_device(torch::randn({8, 16}));
    auto y = rt.to_device(torch::randint(4, {8}));
    auto loss = F::cross_entropy(rt.forward(model, x), y);
    at::Tensor l = rt.backward(loss, model);
    rt.optimizer_step(opt);
    return l.item<double>();
  };
#ifdef LOOM_SELECT_LIMITED
  return loom::with_runtime<loom::devices<loom::Cpu>,
                            loom::precisions<loom::Fp32, loom::Bf16Mixed>>(device, precision, step);
#else
  return loom::with_runtime(device, precision, step);
#endif
}
