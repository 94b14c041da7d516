#pragma once
// The activation checkpointing tests' model (CPU and CUDA): blocks of Linear-GELU-Dropout, a
// twin with the same weights, one training step plainly or in checkpointed segments, and the
// bitwise comparison of two models' gradients.
#include <cstddef>
#include <cstdint>
#include <utility>

#include <ATen/ATen.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include "support/catch.hpp"

#include <loom/nn/activation_checkpoint.hpp>

namespace loom::testing {

/// `blocks` blocks of Linear(width)-GELU-Dropout(0.25), then Linear(width, out).
inline torch::nn::Sequential dropout_mlp(int64_t blocks, int64_t width, int64_t out) {
  torch::nn::Sequential s;
  for (int64_t i = 0; i < blocks; ++i) {
    s->push_back(torch::nn::Linear(width, width));
    s->push_back(torch::nn::GELU());
    s->push_back(torch::nn::Dropout(0.25));
  }
  s->push_back(torch::nn::Linear(width, out));
  return s;
}

/// Two models of dropout_mlp's shape with the same weights.
inline std::pair<torch::nn::Sequential, torch::nn::Sequential> dropout_mlp_twins(int64_t blocks,
                                                                                 int64_t width,
                                                                                 int64_t out) {
  torch::manual_seed(5);
  auto a = dropout_mlp(blocks, width, out);
  auto b = dropout_mlp(blocks, width, out);
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < a->parameters().size(); ++i) {
    b->parameters()[i].copy_(a->parameters()[i]);
  }
  return {a, b};
}

/// One step's gradients through `rt`, the model run plainly (segments 0) or in `segments`
/// checkpointed segments, with the same dropout masks for both (seed 99); returns the loss.
template <class RT>
at::Tensor dropout_mlp_step(RT& rt, torch::nn::Sequential& model, int64_t segments,
                            const at::Tensor& x) {
  torch::manual_seed(99);  // the CPU and every CUDA generator
  at::Tensor out = rt.forward(
      [&](const at::Tensor& in) {
        return segments == 0 ? model->forward(in)
                             : loom::checkpoint_sequential(model, segments, in);
      },
      x);
  at::Tensor loss = out.square().mean();
  rt.backward(loss, model);
  return loss;
}

/// Every parameter's gradient of `a` equals `b`'s, bit for bit.
inline void check_same_grads(const torch::nn::Sequential& a, const torch::nn::Sequential& b) {
  const auto pa = a->named_parameters(), pb = b->named_parameters();
  REQUIRE(pa.size() == pb.size());
  for (std::size_t i = 0; i < pa.size(); ++i) {
    INFO(pa[i].key());
    REQUIRE(pa[i].value().grad().defined());
    REQUIRE(pb[i].value().grad().defined());
    CHECK(pa[i].value().grad().device() == pb[i].value().grad().device());
    CHECK(at::equal(pa[i].value().grad(), pb[i].value().grad()));
  }
}

}  // namespace loom::testing
