// loom::optim on CUDA: the 16-mixed step with a fused optimizer makes no host sync (torch's
// sync debug mode set to error turns any cudaStreamSynchronize / synchronizing copy into an
// exception, and no aten::item / _local_scalar_dense is counted), and an LR scheduler decides
// a device-side step result one step later without one. Label gpu; compiled everywhere.
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include "support/catch.hpp"
#include "support/sync_counter.hpp"
#include "support/warnings.hpp"

#include <loom/device/cuda.hpp>
#include <loom/optim/adam.hpp>
#include <loom/optim/lr_scheduler.hpp>
#include <loom/optim/sgd.hpp>
#include <loom/precision/mixed.hpp>
#include <loom/runtime.hpp>

using loom::device::Cuda;
using loom::testing::SyncCounter;

namespace {

// torch.cuda.set_sync_debug_mode("error") while alive.
class SyncIsError {
 public:
  SyncIsError() : before_(c10::cuda::warning_state().get_sync_debug_mode()) {
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
  }
  ~SyncIsError() { c10::cuda::warning_state().set_sync_debug_mode(before_); }
  SyncIsError(const SyncIsError&) = delete;
  SyncIsError& operator=(const SyncIsError&) = delete;

 private:
  c10::cuda::SyncDebugMode before_;
};

using Rt = loom::Runtime<Cuda, loom::precision::Fp16Mixed>;

Rt runtime() {
  loom::amp::GradScalerOptions o;
  o.init_scale = 256.0;
  return Rt(Cuda(0), loom::precision::Fp16Mixed(o));
}

// Warm steps, then `steps` steps under the error mode; returns the counted host reads.
template <class Optimizer>
int syncs(Optimizer& opt, torch::nn::Linear& m, Rt& rt, int steps) {
  rt.setup(m, opt);
  const auto x = at::randn({32, 16}, at::TensorOptions(at::kCUDA));
  for (int i = 0; i < 2; ++i) {
    opt.zero_grad();
    rt.backward(rt.forward(m, x).sum(), m);
    REQUIRE(rt.optimizer_step(opt).applied());
  }
  SyncIsError error_on_sync;
  SyncCounter counter;
  for (int i = 0; i < steps; ++i) {
    opt.zero_grad();
    rt.backward(rt.forward(m, x).sum(), m);
    auto result = rt.optimizer_step(opt);
    CHECK_FALSE(result.known());
  }
  return SyncCounter::count();
}

}  // namespace

TEST_CASE("16-mixed on CUDA with loom's fused optimizers makes no host sync", "[gpu]") {
  loom::testing::WarningCatcher quiet;
  {
    torch::manual_seed(3);
    torch::nn::Linear m(16, 4);
    loom::optim::Adam opt(m->parameters(), loom::optim::AdamOptions(1e-2));
    auto rt = runtime();
    CHECK(syncs(opt, m, rt, 5) == 0);
  }
  {
    torch::manual_seed(3);
    torch::nn::Linear m(16, 4);
    loom::optim::SGD opt(m->parameters(), loom::optim::SGDOptions(1e-2).momentum(0.9));
    auto rt = runtime();
    CHECK(syncs(opt, m, rt, 5) == 0);
  }
  {
    torch::manual_seed(3);
    torch::nn::Linear m(16, 4);
    loom::optim::AdamW opt(m->parameters(), loom::optim::AdamWOptions(1e-2));
    auto rt = runtime();
    CHECK(syncs(opt, m, rt, 5) == 0);
  }
  {  // the controls: LibTorch's Adam needs the flag on the host, and so does reading a result
    torch::manual_seed(3);
    torch::nn::Linear m(16, 4);
    torch::optim::Adam opt(m->parameters(), torch::optim::AdamOptions(1e-2));
    auto rt = runtime();
    CHECK_THROWS(syncs(opt, m, rt, 1));
  }
  {
    torch::manual_seed(3);
    torch::nn::Linear m(16, 4);
    loom::optim::Adam opt(m->parameters(), loom::optim::AdamOptions(1e-2));
    auto rt = runtime();
    rt.setup(m, opt);
    rt.backward(rt.forward(m, at::randn({4, 16}, at::TensorOptions(at::kCUDA))).sum(), m);
    auto result = rt.optimizer_step(opt);
    {
      SyncIsError error_on_sync;
      CHECK_THROWS(result.applied());
    }
    CHECK(result.applied());
  }
}

TEST_CASE("An LR scheduler decides a CUDA step result one step later, without a sync", "[gpu]") {
  const std::vector<int> mask{1, 1, 0, 1, 0, 0, 1, 1, 1, 0, 1, 1};
  // What the host-side decision gives after steps [0, n) plus one optimistic applied step.
  auto reference = [&](std::size_t n, bool optimistic) {
    auto q = at::zeros({2});
    loom::optim::SGD o({q}, loom::optim::SGDOptions(0.1).momentum(0.9));
    loom::optim::StepLR s(o, 2, 0.5);
    for (std::size_t i = 0; i < n; ++i) s.step(loom::StepResult(mask[i] != 0));
    if (optimistic) s.step();
    return std::make_pair(o.param_groups()[0].options().get_lr(), s.last_epoch());
  };

  auto p = at::zeros({2}, at::TensorOptions(at::kCUDA));
  loom::optim::SGD opt({p}, loom::optim::SGDOptions(0.1).momentum(0.9));
  loom::optim::StepLR sched(opt, 2, 0.5);
  std::vector<at::Tensor> flags;
  for (int m : mask) flags.push_back(at::full({}, m ? 0.0f : 1.0f, at::TensorOptions(at::kCUDA)));
  {
    SyncIsError error_on_sync;
    SyncCounter counter;
    for (std::size_t i = 0; i < mask.size(); ++i) {
      sched.step(loom::StepResult(flags[i]));
      CHECK(sched.pending());
      const auto [lr, epoch] = reference(i, true);
      CHECK(opt.param_groups()[0].options().get_lr() == lr);
      CHECK(sched.last_epoch() == epoch);
    }
    sched.settle();
    CHECK(SyncCounter::count() == 0);
  }
  CHECK_FALSE(sched.pending());
  const auto [lr, epoch] = reference(mask.size(), false);
  CHECK(opt.param_groups()[0].options().get_lr() == lr);
  CHECK(sched.last_epoch() == epoch);
}
