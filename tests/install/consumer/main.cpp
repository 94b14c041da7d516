// A user's program: trains a linear model through loom::Runtime<Cpu, Fp32> (with loom::Ddp,
// in one process, when the package has loom::dist).
#include <cstdio>

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <loom/loom.hpp>

int main() {
  torch::manual_seed(0);
#ifdef LOOM_CONSUMER_DIST
  loom::Runtime<loom::Cpu, loom::Fp32, loom::Ddp> rt;
  const char* how = " through loom::Ddp";
#else
  loom::Runtime<loom::Cpu, loom::Fp32> rt;
  const char* how = "";
#endif
  torch::nn::Linear model(4, 1);
  torch::optim::SGD opt(model->parameters(), 0.1);
  rt.setup(model, opt);
  auto x = torch::randn({64, 4});
  auto y = x.sum(1, true);
  float first = 0, last = 0;
  const int steps = 50;
  for (int i = 0; i < steps; ++i) {
    auto out = rt.forward(model, rt.to_device(x));
    auto loss = torch::nn::functional::mse_loss(out, y);
    auto l = rt.backward(loss, model).item<float>();
    rt.optimizer_step(opt);
    opt.zero_grad();
    if (i == 0) first = l;
    last = l;
  }
  if (!(last < first * 0.1f)) {
    std::printf("consumer: did not learn (%f -> %f)\n", first, last);
    return 1;
  }
  std::printf("consumer: trained %d steps%s, loss %.4f -> %.4f\n", steps, how, first, last);
  return 0;
}
