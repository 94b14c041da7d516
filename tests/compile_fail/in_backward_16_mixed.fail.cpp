// expect-error: loom::optim::OptimizerInBackward: 16-mixed scales the loss
#include <torch/nn/modules/linear.h>

#include <loom/loom.hpp>
#include <loom/optim/in_backward.hpp>

void make(torch::nn::Linear& model) {
#ifdef LOOM_FAIL
  loom::Runtime<loom::Cpu, loom::Fp16Mixed> rt(loom::Cpu{});
#else
  loom::Runtime<loom::Cpu, loom::Bf16Mixed> rt(loom::Cpu{});
#endif
  loom::optim::OptimizerInBackward<loom::optim::AdamW> opt(rt, model->named_parameters(),
                                                           loom::optim::AdamWOptions(1e-3));
}
