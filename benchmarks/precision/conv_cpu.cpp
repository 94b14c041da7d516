// What each precision costs on the CPU, for a small ConvNet and, for comparison, an MLP:
// training steps per second through loom::with_runtime("cpu", name, ...) for every precision
// that runs on a CPU, and the same steps written by hand in plain LibTorch (at::autocast set by
// hand for the mixed ones), to show whether a slow precision is loom's doing or LibTorch's;
// and 32-true and bf16-mixed again under loom::DeterministicMode, its cost.
//
//   loom_bench_conv_cpu [--model conv|mlp] [--rounds 3] [--seconds 1.0] [--threads 1]
//
//   conv  Conv2d(1, 16, 3, pad 1) - ReLU - MaxPool 2 - Conv2d(16, 32, 3, pad 1) - ReLU -
//         MaxPool 2 - Linear(32*7*7, 10)
//   mlp   Linear(784, 256) - ReLU - Linear(256, 10)
//
// Both train on 8 fixed synthetic batches of 64 images (1x28x28, normal noise, 10 classes)
// with Adam (lr 1e-3; eps 1e-4 for 16-true, whose fp16 optimizer state turns 1e-8 into 0).
// Each variant trains its own model from the same initial weights on the same batch order:
// 2 warm-up steps, then `--rounds` rounds in which every variant in turn runs a timed block of
// at least `--seconds` (and 2 steps). Printed, as a Markdown table: each variant's median
// block, in samples/s (wall time) and in the thread's CPU time per step, which leaves out time
// the scheduler gave to other processes. The fp16 precisions make loom warn once (TORCH_WARN,
// on stderr) when they first run on the CPU.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/utils.h>

#include <loom/deterministic.hpp>
#include <loom/loom.hpp>

#include "../common/hand_step.hpp"

namespace {

constexpr int64_t kBatch = 64, kBatches = 8, kClasses = 10;

struct Args {
  bool conv = true;
  int rounds = 3;
  double seconds = 1.0;
  int threads = 1;
};

/// The ConvNet or the MLP; the same initial weights for every variant (seeded).
struct NetImpl : torch::nn::Module {
  explicit NetImpl(bool conv) : conv_(conv) {
    torch::manual_seed(0);
    if (conv_) {
      c1 = register_module("c1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 16, 3).padding(1)));
      c2 = register_module("c2", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1)));
      l1 = register_module("l1", torch::nn::Linear(32 * 7 * 7, kClasses));
    } else {
      l1 = register_module("l1", torch::nn::Linear(28 * 28, 256));
      l2 = register_module("l2", torch::nn::Linear(256, kClasses));
    }
  }
  at::Tensor forward(const at::Tensor& x) {  // (B, 1, 28, 28) -> (B, 10)
    if (conv_) {
      auto h = torch::max_pool2d(torch::relu(c1(x)), 2);  // (B, 16, 14, 14)
      h = torch::max_pool2d(torch::relu(c2(h)), 2);       // (B, 32, 7, 7)
      return l1(h.flatten(1));
    }
    return l2(torch::relu(l1(x.flatten(1))));
  }
  bool conv_;
  torch::nn::Conv2d c1{nullptr}, c2{nullptr};
  torch::nn::Linear l1{nullptr}, l2{nullptr};
};
TORCH_MODULE(Net);

struct Data {
  std::vector<at::Tensor> x, y;  // (B, 1, 28, 28) f32, (B,) i64
  Data() {
    torch::manual_seed(1234);
    for (int64_t i = 0; i < kBatches; ++i) {
      x.push_back(torch::randn({kBatch, 1, 28, 28}));
      y.push_back(torch::randint(kClasses, {kBatch}, torch::kLong));
    }
  }
};

torch::optim::Adam make_adam(Net& net, bool fp16_state) {
  return torch::optim::Adam(net->parameters(),
                            torch::optim::AdamOptions(1e-3).eps(fp16_state ? 1e-4 : 1e-8));
}

/// One training step on batch i; returns the loss. Each variant owns its model and optimizer.
using Step = std::function<double(int64_t)>;

namespace F = torch::nn::functional;

/// A runtime with_runtime built for ("cpu", name), kept with its model and optimizer.
template <class RT>
struct LoomTrainer {
  LoomTrainer(RT runtime, const Args& a)
      : rt(std::move(runtime)),
        net(a.conv),
        opt(make_adam(net, RT::precision_name() == "16-true")) {
    rt.setup(net, opt);
  }
  double step(const Data& d, int64_t i) {
    auto x = rt.to_device(d.x[i]);
    auto y = rt.to_device(d.y[i]);
    auto loss = F::cross_entropy(rt.forward(net, x), y);
    double l = rt.backward(loss, net).template item<double>();
    rt.optimizer_step(opt);
    opt.zero_grad();
    return l;
  }
  RT rt;
  Net net;
  torch::optim::Adam opt;
};

Step loom_step(std::string_view name, const Args& a, const Data& d) {
  return loom::with_runtime("cpu", name, [&](auto& rt) -> Step {
    using RT = std::remove_reference_t<decltype(rt)>;
    auto t = std::make_shared<LoomTrainer<RT>>(std::move(rt), a);
    return [t, &d](int64_t i) { return t->step(d, i); };
  });
}

/// A model and its optimizer for the steps written by hand; the model is cast to `dtype` first
/// (32-true, 16-true; the mixed steps keep fp32 weights).
struct HandState {
  HandState(const Args& a, c10::ScalarType dtype)
      : net(a.conv), opt((net->to(dtype), make_adam(net, dtype == at::kHalf))) {}
  Net net;
  torch::optim::Adam opt;
  hand::Scale scale{at::full({}, 65536.0, at::kFloat), at::zeros({}, at::kInt)};
};

/// Plain LibTorch: 32-true, or the model and inputs cast to `dtype` (16-true).
Step hand_true_step(const Args& a, const Data& d, c10::ScalarType dtype) {
  auto s = std::make_shared<HandState>(a, dtype);
  return [s, &d, dtype](int64_t i) {
    auto out = s->net->forward(d.x[i].to(dtype)).to(at::kFloat);
    auto loss = F::cross_entropy(out, d.y[i]);
    loss.backward();
    s->opt.step();
    s->opt.zero_grad();
    return loss.item<double>();
  };
}

/// Plain LibTorch with CPU autocast set by hand; fp16 scales the loss (hand_step.hpp).
Step hand_mixed_step(const Args& a, const Data& d, c10::ScalarType dtype) {
  auto s = std::make_shared<HandState>(a, at::kFloat);
  return [s, &d, dtype](int64_t i) {
    at::Tensor out;
    {
      const bool prev_enabled = at::autocast::is_autocast_enabled(c10::kCPU);
      const auto prev_dtype = at::autocast::get_autocast_dtype(c10::kCPU);
      at::autocast::set_autocast_enabled(c10::kCPU, true);
      at::autocast::set_autocast_dtype(c10::kCPU, dtype);
      at::autocast::increment_nesting();
      out = s->net->forward(d.x[i].to(dtype));
      if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
      at::autocast::set_autocast_enabled(c10::kCPU, prev_enabled);
      at::autocast::set_autocast_dtype(c10::kCPU, prev_dtype);
    }
    auto loss = F::cross_entropy(out.to(at::kFloat), d.y[i]);
    if (dtype == at::kHalf) {
      hand::scaled_backward_and_step(loss, *s->net, s->opt, s->scale);
    } else {
      loss.backward();
      s->opt.step();
    }
    s->opt.zero_grad();
    return loss.item<double>();
  };
}

/// The calling thread's CPU time in seconds.
double thread_cpu_s() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string_view k = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (k == "--model" && v) {
      a.conv = std::strcmp(v, "mlp") != 0;
    } else if (k == "--rounds" && v) {
      a.rounds = std::max(1, std::atoi(v));
    } else if (k == "--seconds" && v) {
      a.seconds = std::atof(v);
    } else if (k == "--threads" && v) {
      a.threads = std::max(1, std::atoi(v));
    } else {
      std::fprintf(stderr,
                   "usage: loom_bench_conv_cpu [--model conv|mlp] [--rounds N] [--seconds S] "
                   "[--threads N]\n");
      std::exit(2);
    }
    ++i;
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  using clock = std::chrono::steady_clock;
  const Args a = parse(argc, argv);
  at::set_num_threads(a.threads);
  const Data d;

  struct Variant {
    std::string precision, how;
    Step step;
    std::vector<double> rates;   // samples/s (wall time), one per round
    std::vector<double> cpu_ms;  // the thread's CPU time per step, one per round
    double loss = 0;
    int64_t next = 0;            // the next batch: every variant sees the same sequence
    bool deterministic = false;  // runs under loom::DeterministicMode
  };
  const std::string hand = "LibTorch by hand";
  std::vector<Variant> v;
  auto add = [&](std::string precision, std::string how, Step step, bool det = false) {
    v.push_back({std::move(precision), std::move(how), std::move(step), {}, {}, 0.0, 0, det});
  };
  add("32-true", "loom", loom_step("32-true", a, d));
  add("32-true", hand, hand_true_step(a, d, at::kFloat));
  add("32-true", "loom, deterministic mode", loom_step("32-true", a, d), true);
  add("bf16-mixed", "loom", loom_step("bf16-mixed", a, d));
  add("bf16-mixed", "loom, deterministic mode", loom_step("bf16-mixed", a, d), true);
  add("bf16-mixed", hand, hand_mixed_step(a, d, at::kBFloat16));
  add("16-mixed", "loom", loom_step("16-mixed", a, d));
  add("16-mixed", hand, hand_mixed_step(a, d, at::kHalf));
  add("bf16-true", "loom", loom_step("bf16-true", a, d));
  add("16-true", "loom", loom_step("16-true", a, d));
  add("16-true", hand, hand_true_step(a, d, at::kHalf));

  // Rounds interleave the variants, so that a change in the machine's load hits all of them.
  for (auto& x : v) {
    std::optional<loom::DeterministicMode> det;
    if (x.deterministic) det.emplace();
    for (int w = 0; w < 2; ++w) x.loss = x.step(x.next++ % kBatches);
  }
  for (int r = 0; r < a.rounds; ++r) {
    for (auto& x : v) {
      std::optional<loom::DeterministicMode> det;
      if (x.deterministic) det.emplace();
      const auto t0 = clock::now();
      const double c0 = thread_cpu_s();
      int64_t steps = 0;
      double elapsed = 0;
      while (steps < 2 || elapsed < a.seconds) {
        x.loss = x.step(x.next++ % kBatches);
        ++steps;
        elapsed = std::chrono::duration<double>(clock::now() - t0).count();
      }
      x.rates.push_back(static_cast<double>(steps * kBatch) / elapsed);
      x.cpu_ms.push_back(1e3 * (thread_cpu_s() - c0) / static_cast<double>(steps));
    }
  }
  auto median = [](std::vector<double> r) {
    std::nth_element(r.begin(), r.begin() + r.size() / 2, r.end());
    return r[r.size() / 2];
  };

  // Thread CPU time leaves out the time the scheduler gave to other processes, so its ratios
  // hold on a loaded machine; with more than one torch thread it misses the workers' share.
  const double base_rate = median(v[0].rates), base_cpu = median(v[0].cpu_ms);
  std::printf(
      "model %s, batch %lld, Adam, %d torch thread(s), median of %d rounds of >= %.1f s\n\n",
      a.conv ? "conv" : "mlp", static_cast<long long>(kBatch), a.threads, a.rounds, a.seconds);
  std::printf(
      "| precision | step | samples/s | ms/step | x 32-true | CPU ms/step | x 32-true "
      "(CPU) | loss, last step |\n");
  std::printf("|---|---|---:|---:|---:|---:|---:|---:|\n");
  for (const auto& x : v) {
    const double rate = median(x.rates), cpu = median(x.cpu_ms);
    std::printf("| %s | %s | %.0f | %.2f | %.2f | %.2f | %.2f | %.4f |\n", x.precision.c_str(),
                x.how.c_str(), rate, 1e3 * kBatch / rate, rate / base_rate, cpu, base_cpu / cpu,
                x.loss);
  }
  return 0;
}
