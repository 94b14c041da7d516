// One hook call, static (loom::Runtime's policy member, inlined) against virtual (a
// Lightning-like PrecisionPlugin, virtual_plugins.hpp), per hook and precision:
//
//   forward_context   open and close the forward scope (32-true: nothing; bf16-mixed: autocast)
//   convert_input     a (16, 32) f32 input (32-true: returns it; bf16-mixed: a cast)
//   post_backward     detach the loss (every precision)
//
// The virtual plugin comes from an out-of-line factory chosen by name, so the compiler cannot
// see its dynamic type. Run by scripts/run_benchmarks.sh.
#include <string_view>

#include <benchmark/benchmark.h>
#include <torch/nn/module.h>

#include <loom/loom.hpp>

#include "virtual_plugins.hpp"

namespace {

template <class P>
struct Static {
  loom::Runtime<loom::Cpu, P> rt;
  torch::nn::Module module;
  at::Tensor x = at::randn({16, 32});
  at::Tensor loss = at::randn({});
};

template <class P>
struct Virtual {
  std::unique_ptr<vbench::PrecisionPlugin> plugin = vbench::make_plugin(P::precision(), c10::kCPU);
  torch::nn::Module module;
  at::Tensor x = at::randn({16, 32});
  at::Tensor loss = at::randn({});
};

template <class P>
void static_forward_context(benchmark::State& state) {
  Static<P> s;
  for (auto _ : state) {
    auto guard = s.rt.forward_context();
    benchmark::ClobberMemory();
  }
}

template <class P>
void virtual_forward_context(benchmark::State& state) {
  Virtual<P> s;
  for (auto _ : state) {
    auto ctx = s.plugin->forward_context();
    benchmark::ClobberMemory();
  }
}

template <class P>
void static_convert_input(benchmark::State& state) {
  Static<P> s;
  for (auto _ : state) {
    at::Tensor t = s.rt.precision().convert_input(s.x);
    benchmark::DoNotOptimize(t.unsafeGetTensorImpl());
  }
}

template <class P>
void virtual_convert_input(benchmark::State& state) {
  Virtual<P> s;
  for (auto _ : state) {
    at::Tensor t = s.plugin->convert_input(s.x);
    benchmark::DoNotOptimize(t.unsafeGetTensorImpl());
  }
}

template <class P>
void static_post_backward(benchmark::State& state) {
  Static<P> s;
  for (auto _ : state) {
    at::Tensor t = s.rt.precision().post_backward(s.loss, s.module);
    benchmark::DoNotOptimize(t.unsafeGetTensorImpl());
  }
}

template <class P>
void virtual_post_backward(benchmark::State& state) {
  Virtual<P> s;
  for (auto _ : state) {
    at::Tensor t = s.plugin->post_backward(s.loss, s.module);
    benchmark::DoNotOptimize(t.unsafeGetTensorImpl());
  }
}

#define LOOM_HOOK_BENCH(hook)                                                     \
  BENCHMARK(static_##hook<loom::Fp32>)->Name("static/" #hook "/32-true");         \
  BENCHMARK(virtual_##hook<loom::Fp32>)->Name("virtual/" #hook "/32-true");       \
  BENCHMARK(static_##hook<loom::Bf16Mixed>)->Name("static/" #hook "/bf16-mixed"); \
  BENCHMARK(virtual_##hook<loom::Bf16Mixed>)->Name("virtual/" #hook "/bf16-mixed");

LOOM_HOOK_BENCH(forward_context)
LOOM_HOOK_BENCH(convert_input)
LOOM_HOOK_BENCH(post_backward)

}  // namespace

int main(int argc, char** argv) {
  at::set_num_threads(1);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
