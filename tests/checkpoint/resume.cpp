// The trainer of loom's resume tests (tests/checkpoint/resume_matrix.py): a small MLP with
// dropout, a shuffled DistributedSampler, an optimizer and an LR scheduler, under any
// precision, one process or loom::Ddp (torchrun's environment).
//
//   loom_resume precision=P optimizer=O steps=N [save_at=K save=FILE] [resume=FILE] out=FILE
//               [seed=S] [kill_after_save=1] [big_mb=M]
//
// From scratch (no resume=): seeds everything with S + rank, trains N steps; at step K it
// writes the whole state to `save` (and with kill_after_save=1 stops there). With resume=FILE
// it builds everything afresh, seeded differently on purpose, loads FILE and trains to step N.
// At the end it writes the whole state to `out`: straight and resumed runs must write the
// same bits. big_mb=M adds an M MiB tensor to the state (for the interrupted-save test) and
// saves it again and again to `save` until killed.
//
//   loom_resume ... dir=DIR [every=5] [step_ms=T] [async=1] out=FILE
//
// A run that survives (tests/checkpoint/resume_matrix.py preempt, elastic, orphan): resumes
// from the newest checkpoint in DIR if there is one (loom::Checkpoints), saves every `every`
// steps, stops on SIGTERM/SIGINT/SIGUSR1 (loom::StopSignal, agreed by all ranks) after saving
// the step it reached, with exit code 128 + the signal; prints "rank R step N" after each step
// (sleeping T ms, so that a test can catch it mid-run) and its pid and attempt at the start.
// async=1 saves with {.async = true} (a background write; waited for at the end); with big_mb
// the big tensor holds the step's number when it is saved, and changes right after.
// resize=1 resumes with {.world_size_may_change = true} (a directory another number of ranks
// wrote); after the resume, resumed_out=FILE gets the state as loaded (before any step).
// rank0_saves=1 makes the Python mistake `if (rank == 0) ckpt.save(...)` (tests of the error).
//
// strategy=ddp (the default) | zero1 | zero2 | zero2_sharded (loom::Zero, its stage, and the
// sharded checkpoint form) | gradient_average (tests/support/gradient_average.hpp, a strategy
// written on the public seam); timeout_ms=T is the process group's timeout.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <ATen/ATen.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <loom/dist/stop_signal.hpp>
#include <loom/dist/zero.hpp>
#include <loom/loom.hpp>
#include <loom/state/checkpoints.hpp>

#include "../support/gradient_average.hpp"

namespace {

using Args = std::map<std::string, std::string>;

std::string arg(const Args& a, const std::string& key, const std::string& fallback = "") {
  auto it = a.find(key);
  return it == a.end() ? fallback : it->second;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& name,
                                                        std::vector<at::Tensor> params) {
  if (name == "sgd") {
    return std::make_unique<loom::optim::SGD>(params, loom::optim::SGDOptions(0.05).momentum(0.9));
  }
  if (name == "adam") {
    return std::make_unique<loom::optim::Adam>(params, loom::optim::AdamOptions(1e-2).eps(1e-4));
  }
  if (name == "torch_sgd") {
    return std::make_unique<torch::optim::SGD>(params,
                                               torch::optim::SGDOptions(0.05).momentum(0.9));
  }
  if (name == "torch_adam") {
    return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-2).eps(1e-4));
  }
  throw loom::Error("loom_resume: unknown optimizer '" + name + "'");
}

template <class RT>
int run(RT& rt, const Args& a) {
  const int64_t steps = std::stoll(arg(a, "steps", "20"));
  const int64_t save_at = std::stoll(arg(a, "save_at", "-1"));
  const std::string resume = arg(a, "resume"), save = arg(a, "save"), out = arg(a, "out");
  const int rank = rt.strategy().rank();
  // Seeded differently when resuming: whatever matches must come from the checkpoint.
  loom::seed_everything(std::stoull(arg(a, "seed", "1")) + (resume.empty() ? 0 : 1000), rank);

  // The data: fixed, from a generator of its own (the same on every rank and in every run).
  at::Generator data_gen = at::make_generator<at::CPUGeneratorImpl>(42);
  const at::Tensor X = at::randn({96, 6}, data_gen);
  const at::Tensor Y = X.matmul(at::randn({6, 3}, data_gen)).argmax(1);

  torch::nn::Sequential model{nullptr};
  {
    [[maybe_unused]] auto init = rt.module_init_context();
    model = torch::nn::Sequential(torch::nn::Linear(6, 32), torch::nn::ReLU(),
                                  torch::nn::Dropout(0.3), torch::nn::Linear(32, 3));
  }
  auto opt = make_optimizer(arg(a, "optimizer", "adam"), model->parameters());
  rt.setup(model, *opt);
  loom::optim::WarmupCosineOptions schedule;
  schedule.warmup_steps = 3;
  schedule.total_steps = steps;
  loom::optim::WarmupCosineLR sched(*opt, schedule);
  loom::DistributedSampler sampler(96, rt.strategy(), /*shuffle=*/true, /*seed=*/7);
  int64_t step = 0;
  at::Tensor big = at::zeros({std::stoll(arg(a, "big_mb", "0")) * 262144});
  loom::State state{{"model", model},     {"optimizer", *opt},  {"runtime", rt},
                    {"scheduler", sched}, {"sampler", sampler}, {"step", step}};
  if (big.numel() > 0) state.emplace_back("big", big);

  const std::string dir = arg(a, "dir");
  const int64_t every = std::stoll(arg(a, "every", "5"));
  const int64_t step_ms = std::stoll(arg(a, "step_ms", "0"));
  const loom::CheckpointSaveOptions save_options{.sync = true, .async = arg(a, "async") == "1"};
  std::optional<loom::Checkpoints> ckpt;
  std::optional<loom::StopSignal> stop;
  std::optional<int64_t> resumed;
  if (!dir.empty()) {
    ckpt.emplace(dir, loom::CheckpointsOptions{.keep_last = 2});
    stop.emplace();
    resumed = ckpt->resume(rt, state, {.world_size_may_change = arg(a, "resize") == "1"});
    if (const std::string resumed_out = arg(a, "resumed_out"); !resumed_out.empty()) {
      rt.save(resumed_out, state);
    }
    const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
    std::printf("loom_resume: rank %d pid %d attempt %s %s %lld\n", rank,
                static_cast<int>(::getpid()), attempt ? attempt : "-",
                resumed ? "resumed from step" : "fresh, step",
                static_cast<long long>(resumed.value_or(0)));
    std::fflush(stdout);
  }
  if (resume.empty() && !resumed) {
    sampler.set_epoch(0);
    sampler.reset();
  } else if (!resume.empty()) {
    rt.load(resume, state);
  }
  while (step < steps) {
    auto idx = sampler.next(8);
    if (!idx) {
      sampler.set_epoch(sampler.epoch() + 1);
      sampler.reset();
      continue;
    }
    std::vector<int64_t> rows(idx->begin(), idx->end());
    const at::Tensor index = at::tensor(rows, at::kLong);
    auto x = rt.to_device(X.index_select(0, index));
    auto y = rt.to_device(Y.index_select(0, index));
    auto loss = at::cross_entropy_loss(rt.forward(model, x), y);
    rt.backward(loss, model);
    auto applied = rt.optimizer_step(*opt);
    sched.step(applied);
    opt->zero_grad();
    ++step;
    if (ckpt) {
      std::printf("loom_resume: rank %d step %lld\n", rank, static_cast<long long>(step));
      std::fflush(stdout);
      if (step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
      if (stop->should_stop(rt)) {
        ckpt->save(rt, step, state);  // synchronous: the process leaves next
        std::printf("loom_resume: rank %d stopped by signal %d after saving step %lld\n", rank,
                    stop->signal(), static_cast<long long>(step));
        return stop->exit_code();
      }
      if (step % every == 0 && arg(a, "rank0_saves") == "1") {
        if (rank == 0) ckpt->save(rt, step, state);  // the mistake: save is collective
      } else if (step % every == 0) {
        if (big.numel() > 0) big.fill_(static_cast<double>(step));
        ckpt->save(rt, step, state, save_options);
        if (big.numel() > 0) big.fill_(-1.0);  // an asynchronous save copied it already
      }
    }
    if (step == save_at) {
      rt.save(save, state);
      if (big.numel() > 0) {
        std::printf("loom_resume: saved once; saving again until killed\n");
        std::fflush(stdout);
        for (int64_t v = 1;; ++v) {
          big.fill_(static_cast<double>(v));
          rt.save(save, state);
        }
      }
      if (arg(a, "kill_after_save") == "1") return 0;
    }
  }
  if (ckpt) ckpt->wait(rt);  // an asynchronous save's error is thrown here, on every rank
  rt.save(out, state);
  rt.teardown();
  std::printf("loom_resume: rank %d of %d, %lld steps, precision %s, epoch %llu\n", rank,
              rt.strategy().world_size(), static_cast<long long>(step),
              std::string(RT::precision_name()).c_str(),
              static_cast<unsigned long long>(sampler.epoch()));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    const auto eq = s.find('=');
    if (eq == std::string::npos) {
      std::fprintf(stderr, "loom_resume: arguments are key=value, got '%s'\n", s.c_str());
      return 2;
    }
    a[s.substr(0, eq)] = s.substr(eq + 1);
  }
  try {
    loom::DdpOptions ddp;
    ddp.timeout = std::chrono::milliseconds(std::stoll(arg(a, "timeout_ms", "300000")));
    const std::string strategy = arg(a, "strategy", "ddp");
    return loom::with_precision(arg(a, "precision", "32-true"), [&](auto precision) {
      using P = decltype(precision);
      if (strategy == "ddp") {
        loom::Runtime<loom::Cpu, P, loom::Ddp> rt(loom::Cpu(), precision, loom::Ddp(ddp));
        return run(rt, a);
      }
      if (strategy == "gradient_average") {
        loom::dist::GroupOptions group;
        group.timeout = ddp.timeout;
        loom::Runtime<loom::Cpu, P, loom_test::GradientAverage> rt(
            loom::Cpu(), precision, loom_test::GradientAverage(group));
        return run(rt, a);
      }
      loom::ZeroOptions zero;
      zero.ddp = ddp;
      if (strategy == "zero1") {
        zero.stage = 1;
      } else if (strategy == "zero2" || strategy == "zero2_sharded") {
        zero.stage = 2;
        if (strategy == "zero2_sharded") zero.checkpoint = loom::ZeroCheckpoint::Sharded;
      } else {
        throw loom::Error(
            "loom_resume: strategy is ddp, zero1, zero2, zero2_sharded or gradient_average, not '" +
            strategy + "'");
      }
      loom::Runtime<loom::Cpu, P, loom::Zero> rt(loom::Cpu(), precision, loom::Zero(zero));
      return run(rt, a);
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom_resume: %s\n", e.what());
    return 1;
  }
}
