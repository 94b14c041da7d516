// The loom side of tests/profiler/profiler_parity.py: an MLP (Linear(16, 32), ReLU,
// Linear(32, 4), each Linear running aten::linear as Python's does) trained 12 steps with loom's
// fused AdamW on seeded data under loom::Profiler with schedule(wait=1, warmup=1, active=2,
// repeat=2), each window's trace written to DIR.
//
//   loom_profiler_tool DIR [ddp]
//   loom_profiler_tool schedule WAIT WARMUP ACTIVE REPEAT SKIP_FIRST SKIP_FIRST_WAIT STEPS
//
// ddp: under loom::Ddp (torchrun's ranks, gloo), each rank its own traces. Prints each
// window's trace and the last window's key-averages table. schedule: prints the action
// loom::ProfilerSchedule gives each of steps 0..STEPS-1 (NONE, WARMUP, RECORD,
// RECORD_AND_SAVE), one a line. A failure is printed ("error: ..."), exit 1.
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <loom/loom.hpp>
#include <loom/profiler.hpp>

namespace {

/// Python's nn.Linear, operator for operator: aten::linear (LibTorch's torch::nn::Linear calls
/// aten::addmm directly, without the aten::linear above it that Python's runs).
struct PyLinearImpl : torch::nn::Module {
  PyLinearImpl(int64_t in, int64_t out)
      : weight(register_parameter("weight", torch::randn({out, in}) * 0.1)),
        bias(register_parameter("bias", torch::zeros({out}))) {}
  torch::Tensor forward(const torch::Tensor& x) { return at::linear(x, weight, bias); }
  torch::Tensor weight, bias;
};
TORCH_MODULE(PyLinear);

template <class S>
int train(const std::string& dir, S strategy) {
  loom::Runtime<loom::Cpu, loom::Fp32, S> rt(loom::Cpu(), loom::Fp32(), std::move(strategy));
  torch::manual_seed(0);
  torch::nn::Sequential model(PyLinear(16, 32), torch::nn::ReLU(), PyLinear(32, 4));
  loom::optim::AdamW opt(model->parameters(), loom::optim::AdamWOptions(1e-3));
  rt.setup(model, opt);
  // Every batch made before the profiler starts: a step runs the model and the optimizer only.
  std::vector<torch::Tensor> xs, ys;
  for (int i = 0; i < 12; ++i) {
    xs.push_back(torch::randn({8, 16}));
    ys.push_back(torch::randint(0, 4, {8}));
  }
  loom::Profiler prof(
      {.schedule = loom::ProfilerSchedule{.wait = 1, .warmup = 1, .active = 2, .repeat = 2},
       .dir = dir,
       .backend = "gloo",
       .on_trace_ready = [](loom::Profiler& p) {
         std::cout << "loom profiler: a window handed over at step " << p.step_num() << ": "
                   << p.events().size() << " events, trace " << p.last_trace().string()
                   << std::endl;
       }});
  prof.start();
  for (std::size_t i = 0; i < xs.size(); ++i) {
    opt.zero_grad();
    torch::Tensor loss;
    {
      loom::RecordFunction scope("loom_forward");
      loss = torch::nn::functional::cross_entropy(rt.forward(model, xs[i]), ys[i]);
    }
    rt.backward(loss, model);
    rt.optimizer_step(opt);
    prof.step();
  }
  prof.stop();
  std::cout << "loom profiler: " << prof.traces().size() << " traces\n"
            << prof.table("cpu_time_total", 12) << std::flush;
  rt.teardown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 9 && std::string(argv[1]) == "schedule") {
    try {
      const loom::ProfilerSchedule s{.wait = std::stoll(argv[2]),
                                     .warmup = std::stoll(argv[3]),
                                     .active = std::stoll(argv[4]),
                                     .repeat = std::stoll(argv[5]),
                                     .skip_first = std::stoll(argv[6]),
                                     .skip_first_wait = std::string(argv[7]) != "0"};
      const char* names[] = {"NONE", "WARMUP", "RECORD", "RECORD_AND_SAVE"};
      for (int64_t step = 0; step < std::stoll(argv[8]); ++step) {
        std::cout << names[static_cast<int>(s(step))] << "\n";
      }
      return 0;
    } catch (const std::exception& e) {
      std::cout << "error: " << e.what() << std::endl;
      return 1;
    }
  }
  if (argc < 2 || argc > 3) {
    std::cerr << "usage: loom_profiler_tool DIR [ddp] | schedule W U A R S F N\n";
    return 2;
  }
  try {
    if (argc == 3 && std::string(argv[2]) == "ddp") return train(argv[1], loom::Ddp());
    return train(argv[1], loom::SingleProcess());
  } catch (const std::exception& e) {
    std::cout << "error: " << e.what() << std::endl;
    return 1;
  }
}
