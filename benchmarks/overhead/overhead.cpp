// Zero overhead, measured: one training step of a small MLP (fixed seed, fixed data) written
// three ways, for each of the six precisions that run on the CPU:
//
//   hand     plain LibTorch: casts for -true, at::autocast set/get + nesting + clear_cache for
//            -mixed, manual loss scaling with the two ATen AMP ops for 16-mixed
//   loom     loom::Runtime<loom::Cpu, P>: to_device, forward, backward, optimizer_step
//   virtual  the same hooks behind virtual functions (virtual_plugins.hpp), Lightning-like
//
// All three train their own copy of the same model on the same batches and must end with the
// same parameters (checked, printed as max_abs_diff).
//
//   loom_bench_overhead --mode wall  [--rounds 15] [--block 40]   wall time, interleaved blocks
//   loom_bench_overhead --mode count [--steps 20]                 under callgrind, see below
//
// --mode count is meant for
//   valgrind --tool=callgrind --instr-atstart=no loom_bench_overhead --mode count
// It starts instrumentation after LibTorch's static initialisation, then for every
// (precision, impl) zeroes the counters, runs --steps steps after a warm-up and dumps them
// as the part "<precision>/<impl>" (callgrind.out.<pid>.<n>). Run natively it only trains.
// Output: one JSON object on stdout. Threads: --threads (default 1: the model is tiny).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <ATen/autocast_mode.h>
#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/_amp_update_scale.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#else
#define CALLGRIND_START_INSTRUMENTATION
#define CALLGRIND_ZERO_STATS
#define CALLGRIND_DUMP_STATS_AT(name) ((void)(name))
#endif

#include <loom/loom.hpp>

#include "../common/hand_step.hpp"
#include "virtual_plugins.hpp"

namespace {

constexpr int64_t kIn = 32, kHidden = 64, kClasses = 10, kBatch = 16, kBatches = 8;
constexpr double kLr = 0.01, kMomentum = 0.9;

struct MlpImpl : torch::nn::Module {
  MlpImpl()
      : l1(register_module("l1", torch::nn::Linear(kIn, kHidden))),
        l2(register_module("l2", torch::nn::Linear(kHidden, kHidden))),
        l3(register_module("l3", torch::nn::Linear(kHidden, kClasses))) {}
  at::Tensor forward(const at::Tensor& x) {  // (B, 32) -> (B, 10)
    return l3(torch::relu(l2(torch::relu(l1(x)))));
  }
  torch::nn::Linear l1, l2, l3;
};
TORCH_MODULE(Mlp);

Mlp make_model() {
  torch::manual_seed(0);
  return Mlp();
}

torch::optim::SGD make_sgd(Mlp& m) {
  return torch::optim::SGD(m->parameters(), torch::optim::SGDOptions(kLr).momentum(kMomentum));
}

struct Data {
  std::vector<at::Tensor> x, y;  // (B, 32) f32, (B,) i64
  Data() {
    torch::manual_seed(1234);
    for (int64_t i = 0; i < kBatches; ++i) {
      x.push_back(torch::randn({kBatch, kIn}));
      y.push_back(torch::randint(kClasses, {kBatch}, torch::kLong));
    }
  }
};

namespace F = torch::nn::functional;
const c10::Device kDev(c10::kCPU);

// ---- hand-written LibTorch, one function per kind of precision ------------------------------

/// 32-true.
at::Tensor hand_fp32(Mlp& model, torch::optim::SGD& opt, const at::Tensor& xb,
                     const at::Tensor& yb) {
  auto x = xb.to(kDev);
  auto y = yb.to(kDev);
  auto loss = F::cross_entropy(model->forward(x), y);
  loss.backward();
  opt.step();
  opt.zero_grad();
  return loss.detach();
}

/// 64-true, 16-true, bf16-true: the model was cast once (model->to(D)); cast the input in and
/// the output back to fp32 for the loss.
template <c10::ScalarType D>
at::Tensor hand_true(Mlp& model, torch::optim::SGD& opt, const at::Tensor& xb,
                     const at::Tensor& yb) {
  auto x = xb.to(kDev);
  auto y = yb.to(kDev);
  auto out = model->forward(x.to(D)).to(at::kFloat);
  auto loss = F::cross_entropy(out, y);
  loss.backward();
  opt.step();
  opt.zero_grad();
  return loss.detach();
}

/// The loss scale of 16-mixed, by hand: two 0-dim tensors.
struct HandScale : hand::Scale {
  HandScale() : hand::Scale{at::full({}, 65536.0, at::kFloat), at::zeros({}, at::kInt)} {}
};

/// bf16-mixed and 16-mixed: autocast around the forward, by hand; 16-mixed scales the loss,
/// unscales and checks the gradients, skips a non-finite step and updates the scale.
template <c10::ScalarType D, bool Scaled>
at::Tensor hand_mixed(Mlp& model, torch::optim::SGD& opt, const at::Tensor& xb,
                      const at::Tensor& yb, HandScale& s) {
  auto x = xb.to(kDev);
  auto y = yb.to(kDev);
  at::Tensor out;
  {
    const bool prev_enabled = at::autocast::is_autocast_enabled(c10::kCPU);
    const auto prev_dtype = at::autocast::get_autocast_dtype(c10::kCPU);
    const bool prev_cache = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_enabled(c10::kCPU, true);
    at::autocast::set_autocast_dtype(c10::kCPU, D);
    at::autocast::increment_nesting();
    at::autocast::set_autocast_cache_enabled(true);
    out = model->forward(x.to(D));
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(c10::kCPU, prev_enabled);
    at::autocast::set_autocast_dtype(c10::kCPU, prev_dtype);
    at::autocast::set_autocast_cache_enabled(prev_cache);
  }
  auto loss = F::cross_entropy(out.to(at::kFloat), y);
  if constexpr (Scaled) {
    hand::scaled_backward_and_step(loss, *model, opt, s);
  } else {
    loss.backward();
    opt.step();
  }
  opt.zero_grad();
  return loss.detach();
}

// ---- the three trainers ----------------------------------------------------------------------

template <class P>
struct HandTrainer {
  Mlp model = make_model();
  torch::optim::SGD opt = [this] {
    model->to(kDev);
    if constexpr (!std::is_same_v<P, loom::Fp32> && !std::is_same_v<P, loom::Fp16Mixed> &&
                  !std::is_same_v<P, loom::Bf16Mixed>) {
      model->to(P::dtype());
    }
    return make_sgd(model);
  }();
  HandScale scale;
  at::Tensor step(const at::Tensor& x, const at::Tensor& y) {
    if constexpr (std::is_same_v<P, loom::Fp32>)
      return hand_fp32(model, opt, x, y);
    else if constexpr (std::is_same_v<P, loom::Fp16Mixed>)
      return hand_mixed<c10::kHalf, true>(model, opt, x, y, scale);
    else if constexpr (std::is_same_v<P, loom::Bf16Mixed>)
      return hand_mixed<c10::kBFloat16, false>(model, opt, x, y, scale);
    else
      return hand_true<P::dtype()>(model, opt, x, y);
  }
};

template <class P>
struct LoomTrainer {
  loom::Runtime<loom::Cpu, P> rt;
  Mlp model = make_model();
  torch::optim::SGD opt = make_sgd(model);
  LoomTrainer() { rt.setup(model, opt); }
  at::Tensor step(const at::Tensor& xb, const at::Tensor& yb) {
    auto x = rt.to_device(xb);
    auto y = rt.to_device(yb);
    auto out = rt.forward(model, x);
    auto loss = F::cross_entropy(out, y);
    auto l = rt.backward(loss, model);
    rt.optimizer_step(opt);
    opt.zero_grad();
    return l;
  }
};

template <class P>
struct VirtualTrainer {
  vbench::DynamicFabric fabric{"cpu", P::precision()};
  Mlp model = make_model();
  torch::optim::SGD opt = make_sgd(model);
  VirtualTrainer() { fabric.setup(*model); }
  at::Tensor step(const at::Tensor& xb, const at::Tensor& yb) {
    auto x = fabric.to_device(xb);
    auto y = fabric.to_device(yb);
    auto out = fabric.forward(model, x);
    auto loss = F::cross_entropy(out, y);
    auto l = fabric.backward(loss, *model);
    fabric.optimizer_step(opt);
    opt.zero_grad();
    return l;
  }
};

template <class T>
[[gnu::noinline]] void run_steps(T& t, const Data& d, int64_t& i, int n) {
  for (int k = 0; k < n; ++k, ++i) {
    at::Tensor l = t.step(d.x[i % kBatches], d.y[i % kBatches]);
    (void)l;
  }
}

double max_abs_diff(Mlp& a, Mlp& b) {
  double m = 0;
  auto pa = a->parameters(), pb = b->parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    m = std::max(m, (pa[i].to(at::kDouble) - pb[i].to(at::kDouble)).abs().max().item<double>());
  }
  return m;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Options {
  std::string mode = "wall";
  int rounds = 15, block = 40, steps = 20, warmup = 10, threads = 1;
  std::string only;  // one precision name, or all
};

template <class P>
void wall(const Options& o, const Data& d, bool first) {
  HandTrainer<P> hand;
  LoomTrainer<P> lm;
  VirtualTrainer<P> virt;
  int64_t ih = 0, il = 0, iv = 0;
  run_steps(hand, d, ih, o.warmup);
  run_steps(lm, d, il, o.warmup);
  run_steps(virt, d, iv, o.warmup);
  // Per block: wall time and this thread's CPU time (the steps run on this thread only, with
  // --threads 1), so that time the scheduler gives to other processes can be told apart.
  struct Series {
    std::vector<double> wall, cpu;
  } h, l, v;
  std::vector<double> rl, rv, cl, cv;
  auto time = [&](auto& t, int64_t& i, Series& s) {
    timespec c0{}, c1{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
    auto t0 = std::chrono::steady_clock::now();
    run_steps(t, d, i, o.block);
    auto t1 = std::chrono::steady_clock::now();
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
    s.wall.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / o.block);
    s.cpu.push_back(((c1.tv_sec - c0.tv_sec) * 1e9 + double(c1.tv_nsec - c0.tv_nsec)) / o.block);
  };
  for (int r = 0; r < o.rounds; ++r) {  // rotate the order so that no impl always runs first
    switch (r % 3) {
      case 0:
        time(hand, ih, h);
        time(lm, il, l);
        time(virt, iv, v);
        break;
      case 1:
        time(lm, il, l);
        time(virt, iv, v);
        time(hand, ih, h);
        break;
      default:
        time(virt, iv, v);
        time(hand, ih, h);
        time(lm, il, l);
        break;
    }
    rl.push_back(l.wall.back() / h.wall.back());
    rv.push_back(v.wall.back() / h.wall.back());
    cl.push_back(l.cpu.back() / h.cpu.back());
    cv.push_back(v.cpu.back() / h.cpu.back());
  }
  std::printf(
      "%s    {\"precision\": \"%s\", \"hand_ns_per_step\": %.1f, \"loom_ns_per_step\": %.1f, "
      "\"virtual_ns_per_step\": %.1f, \"loom_over_hand\": %.4f, \"virtual_over_hand\": %.4f, "
      "\"hand_cpu_ns_per_step\": %.1f, \"loom_cpu_ns_per_step\": %.1f, "
      "\"virtual_cpu_ns_per_step\": %.1f, \"loom_over_hand_cpu\": %.4f, "
      "\"virtual_over_hand_cpu\": %.4f, "
      "\"max_abs_diff_loom_hand\": %.3g, \"max_abs_diff_virtual_hand\": %.3g}",
      first ? "" : ",\n", std::string(P::precision()).c_str(), median(h.wall), median(l.wall),
      median(v.wall), median(rl), median(rv), median(h.cpu), median(l.cpu), median(v.cpu),
      median(cl), median(cv), max_abs_diff(hand.model, lm.model),
      max_abs_diff(virt.model, hand.model));
}

template <class P>
void count(const Options& o, const Data& d, bool first) {
  const std::string name(P::precision());
  auto measure = [&](auto& t, const char* impl) {
    int64_t i = 0;
    run_steps(t, d, i, o.warmup);
    CALLGRIND_ZERO_STATS;
    run_steps(t, d, i, o.steps);
    const std::string part = name + "/" + impl;  // outlives the client request
    CALLGRIND_DUMP_STATS_AT(part.c_str());
  };
  HandTrainer<P> hand;
  measure(hand, "hand");
  LoomTrainer<P> lm;
  measure(lm, "loom");
  VirtualTrainer<P> virt;
  measure(virt, "virtual");
  std::printf(
      "%s    {\"precision\": \"%s\", \"steps\": %d, \"max_abs_diff_loom_hand\": %.3g, "
      "\"max_abs_diff_virtual_hand\": %.3g}",
      first ? "" : ",\n", name.c_str(), o.steps, max_abs_diff(hand.model, lm.model),
      max_abs_diff(virt.model, hand.model));
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string_view a = argv[i];
    const char* v = argv[i + 1];
    if (a == "--mode")
      o.mode = v;
    else if (a == "--rounds")
      o.rounds = std::atoi(v);
    else if (a == "--block")
      o.block = std::atoi(v);
    else if (a == "--steps")
      o.steps = std::atoi(v);
    else if (a == "--warmup")
      o.warmup = std::atoi(v);
    else if (a == "--threads")
      o.threads = std::atoi(v);
    else if (a == "--precision")
      o.only = v;
    else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  at::set_num_threads(o.threads);
  if (o.mode == "count") CALLGRIND_START_INSTRUMENTATION;
  Data d;
  std::printf(
      "{\"mode\": \"%s\", \"threads\": %d, \"model\": \"MLP %lld-%lld-%lld-%lld, batch %lld, "
      "SGD momentum\", \"results\": [\n",
      o.mode.c_str(), o.threads, (long long)kIn, (long long)kHidden, (long long)kHidden,
      (long long)kClasses, (long long)kBatch);
  bool first = true;
  for (std::string_view name :
       {"32-true", "64-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed"}) {
    if (!o.only.empty() && o.only != name) continue;
    loom::with_precision(name, [&](auto policy) {
      using P = decltype(policy);
      if (o.mode == "count")
        count<P>(o, d, first);
      else
        wall<P>(o, d, first);
    });
    first = false;
    std::fflush(stdout);
  }
  std::printf("\n]}\n");
  return 0;
}
