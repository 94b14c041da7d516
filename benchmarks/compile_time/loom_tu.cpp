// Compile-time cost, loom's side: a training translation unit as a user writes it. It
// includes what training needs (runtime.hpp and the policies, not the checkpoint format) and
// instantiates Runtime<Device, Precision> for every shipped device x precision pair, fp8-mixed
// included, plus Runtime<Cpu, Fp32, Ddp>; each exercises setup, to_device, forward, backward
// and the optimizer step. Its twin hand_tu.cpp writes the same steps by hand on the torch
// headers these loom headers name. Compiled only by benchmarks/compile_time/measure.py
// (g++ -std=c++20 -O2 -c), never linked.
#include <loom/device/cpu.hpp>
#ifdef LOOM_WITH_CUDA
#include <loom/device/cuda.hpp>
#endif
#include <loom/dist/ddp.hpp>
#include <loom/precision/fp32.hpp>
#include <loom/precision/fp64.hpp>
#include <loom/precision/fp8.hpp>
#include <loom/precision/half.hpp>
#include <loom/precision/mixed.hpp>
#include <loom/runtime.hpp>

#include "common_model.hpp"

namespace F = torch::nn::functional;

template <class D, class P, class S = loom::SingleProcess>
at::Tensor exercise(torch::nn::Sequential& model, torch::optim::SGD& opt, const at::Tensor& x,
                    const at::Tensor& y) {
  loom::Runtime<D, P, S> rt;
  rt.setup(model, opt);
  auto out = rt.forward(model, rt.to_device(x));
  auto loss = F::cross_entropy(out, rt.to_device(y));
  auto l = rt.backward(loss, model);
  rt.optimizer_step(opt);
  opt.zero_grad();
  return l;
}

#define LOOM_EXERCISE_ONE(D, P, S)                                                  \
  template at::Tensor exercise<D, P, S>(torch::nn::Sequential&, torch::optim::SGD&, \
                                        const at::Tensor&, const at::Tensor&);
#define LOOM_EXERCISE(D)                                     \
  LOOM_EXERCISE_ONE(D, loom::Fp32, loom::SingleProcess)      \
  LOOM_EXERCISE_ONE(D, loom::Fp64, loom::SingleProcess)      \
  LOOM_EXERCISE_ONE(D, loom::Fp16True, loom::SingleProcess)  \
  LOOM_EXERCISE_ONE(D, loom::Bf16True, loom::SingleProcess)  \
  LOOM_EXERCISE_ONE(D, loom::Fp16Mixed, loom::SingleProcess) \
  LOOM_EXERCISE_ONE(D, loom::Bf16Mixed, loom::SingleProcess) \
  LOOM_EXERCISE_ONE(D, loom::Fp8Mixed, loom::SingleProcess)

LOOM_EXERCISE(loom::Cpu)
#ifdef LOOM_WITH_CUDA
LOOM_EXERCISE(loom::Cuda)
#endif
LOOM_EXERCISE_ONE(loom::Cpu, loom::Fp32, loom::Ddp)
