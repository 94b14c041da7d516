// loom::Published with the learner on CUDA and the readers on the CPU: the copies run on a side
// stream into pinned memory, nothing waits on the host, and every version a reader gets holds
// exactly the weights the learner had when it published that version.
// Registered with label gpu only under LOOM_BUILD_GPU_TESTS; compiled everywhere.
#include <cstdint>
#include <vector>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include "support/catch.hpp"
#include "support/sync_counter.hpp"

#include <loom/optim/adam.hpp>
#include <loom/published.hpp>

TEST_CASE("Published copies CUDA weights to CPU snapshots on a side stream, each version whole",
          "[gpu][published]") {
  torch::manual_seed(0);
  torch::nn::Sequential net(torch::nn::Linear(64, 256), torch::nn::ReLU(),
                            torch::nn::Linear(256, 8));
  net->to(at::kCUDA);
  loom::optim::AdamW opt(net->parameters(), loom::optim::AdamWOptions(1e-2));
  loom::Published<torch::nn::Sequential> published(net, {.device = c10::Device(c10::kCPU)});
  auto first = published.latest();
  CHECK(first.version() == 0);
  for (const auto& p : first->parameters()) {
    CHECK(p.device().is_cpu());
    CHECK(p.is_pinned());
  }
  const at::Tensor x = torch::randn({32, 64}, at::kCUDA);
  std::vector<std::vector<at::Tensor>> weights;  // the learner's at each version, read later
  {
    loom::testing::SyncCounter syncs;
    for (int step = 1; step <= 20; ++step) {
      opt.zero_grad();
      net->forward(x).square().mean().backward();
      opt.step();
      published.publish(net);  // no host wait: the copy and its event stay on the GPU
      std::vector<at::Tensor> w;
      for (const auto& p : net->parameters()) w.push_back(p.detach().clone());  // on the GPU
      weights.push_back(std::move(w));
    }
    CHECK(loom::testing::SyncCounter::count() == 0);
  }
  c10::cuda::device_synchronize();
  published.poll();  // the last copy has completed: its version becomes the latest
  auto last = published.latest();
  CHECK(last.version() == 20);
  const auto params = last->parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    CHECK(at::equal(params[i], weights.back()[i].cpu()));
  }
  // Version 0 is still whole while held.
  std::size_t i = 0;
  torch::manual_seed(0);
  torch::nn::Sequential fresh(torch::nn::Linear(64, 256), torch::nn::ReLU(),
                              torch::nn::Linear(256, 8));
  for (const auto& p : first->parameters()) CHECK(at::equal(p, fresh->parameters()[i++]));
}
