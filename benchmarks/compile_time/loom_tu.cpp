// Compile-time cost, loom's side: Runtime<Device, Precision> instantiated for every shipped
// device x precision pair, each exercising setup, to_device, forward, backward and the
// optimizer step. Its twin hand_tu.cpp writes the same steps by hand on the same torch
// headers. Compiled only by scripts/run_benchmarks.sh (g++ -std=c++20 -O2 -c), never linked.
#include <loom/loom.hpp>

#include "common_model.hpp"

namespace F = torch::nn::functional;

template <class D, class P>
at::Tensor exercise(torch::nn::Sequential& model, torch::optim::SGD& opt, const at::Tensor& x,
                    const at::Tensor& y) {
  loom::Runtime<D, P> rt;
  rt.setup(model, opt);
  auto out = rt.forward(model, rt.to_device(x));
  auto loss = F::cross_entropy(out, rt.to_device(y));
  auto l = rt.backward(loss, model);
  rt.optimizer_step(opt);
  opt.zero_grad();
  return l;
}

#define LOOM_EXERCISE(D)                                                                       \
  template at::Tensor exercise<D, loom::Fp32>(torch::nn::Sequential&, torch::optim::SGD&,      \
                                              const at::Tensor&, const at::Tensor&);           \
  template at::Tensor exercise<D, loom::Fp64>(torch::nn::Sequential&, torch::optim::SGD&,      \
                                              const at::Tensor&, const at::Tensor&);           \
  template at::Tensor exercise<D, loom::Fp16True>(torch::nn::Sequential&, torch::optim::SGD&,  \
                                                  const at::Tensor&, const at::Tensor&);       \
  template at::Tensor exercise<D, loom::Bf16True>(torch::nn::Sequential&, torch::optim::SGD&,  \
                                                  const at::Tensor&, const at::Tensor&);       \
  template at::Tensor exercise<D, loom::Fp16Mixed>(torch::nn::Sequential&, torch::optim::SGD&, \
                                                   const at::Tensor&, const at::Tensor&);      \
  template at::Tensor exercise<D, loom::Bf16Mixed>(torch::nn::Sequential&, torch::optim::SGD&, \
                                                   const at::Tensor&, const at::Tensor&);

LOOM_EXERCISE(loom::Cpu)
#ifdef LOOM_WITH_CUDA
LOOM_EXERCISE(loom::Cuda)
#endif
