// A character-level transformer language model on text every Debian machine ships (the licence
// texts under /usr/share/common-licenses), trained through loom::Runtime with what a real run
// uses: the precision chosen at run time, AdamW with weight decay on the matrices only, a
// linear warm-up then cosine schedule, gradient clipping, gradient accumulation, loggers, an EMA
// of the weights for evaluation, and a checkpoint directory a killed run resumes from.
//
//   char_lm [--text FILE_OR_DIR ...] [--device cpu] [--precision 32-true] [--steps 600]
//           [--max-steps N] [--batch-size 16] [--accumulate 2] [--block 64] [--width 64]
//           [--layers 2] [--heads 4] [--lr 3e-3] [--warmup-steps 20] [--clip 1.0]
//           [--ema-decay 0.99] [--checkpoint-activations] [--log-dir DIR] [--checkpoint-dir DIR
//           [--checkpoint-every 100]
//           [--keep 3] [--async-save]] [--sample 200] [--profile DIR]
//
// --steps plans the run (the schedule anneals to 0 at --steps); --max-steps stops it earlier,
// as a cluster's time limit would: run it again with the same --checkpoint-dir and it resumes
// from the newest checkpoint, with the same bits as a run that never stopped (the batches of
// step s are drawn from a generator seeded with s, so they do not depend on the RNG's past).
// --checkpoint-activations runs every transformer block through loom::activation_checkpoint:
// its activations are rebuilt in backward instead of kept, and training gives the same bits.
// --profile DIR records steps 7-9 of the run with loom::Profiler (after 5 steps of waiting and
// 2 of warming up): DIR/rank-R.step-9.pt.trace.json, which Perfetto and TensorBoard's
// profiler plugin open, and the window's ten most expensive operators printed.
// Ends with the validation loss of the trained weights and of their EMA, a sample of text from
// the EMA weights, and "learned" when the validation loss fell well below the uniform guess's.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <CLI/CLI.hpp>

#include <loom/dist/stop_signal.hpp>
#include <loom/loggers/csv_logger.hpp>
#include <loom/loggers/progress_bar.hpp>
#include <loom/loom.hpp>
#include <loom/optim/ema.hpp>
#include <loom/profiler.hpp>
#include <loom/state/checkpoints.hpp>

#include "common/char_lm.hpp"
#include "common/checkpoint_flags.hpp"

namespace {

using examples::Block;
using examples::CharLM;
using examples::loss_of;
using examples::read_text;
using examples::Vocabulary;
using examples::windows;

struct Options {
  std::vector<std::string> text{"/usr/share/common-licenses"};
  std::string device = "cpu";
  std::string precision = "32-true";
  int64_t steps = 600;
  int64_t max_steps = -1;
  int64_t batch_size = 16;
  int64_t accumulate = 2;
  int64_t block = 64;
  int64_t width = 64;
  int64_t layers = 2;
  int64_t heads = 4;
  double lr = 3e-3;
  int64_t warmup_steps = 20;
  double clip = 1.0;
  double ema_decay = 0.99;
  bool checkpoint_activations = false;
  int64_t sample = 200;
  std::string log_dir;
  std::string profile_dir;
  examples::CheckpointFlags checkpoints;
};

/// A run stopped by a signal after saving its step; main exits with `code`.
struct Stopped {
  int code;
};

/// `n` characters after `prompt`, each drawn from the model's distribution (seeded).
template <class RT, class Model>
std::string sample(RT& rt, Model& model, const Vocabulary& vocab, const std::string& prompt,
                   int64_t n, int64_t block) {
  at::NoGradGuard no_grad;
  model->eval();
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(7);
  at::Tensor ids = vocab.encode(prompt).unsqueeze(0);
  std::string out = prompt;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = std::min<int64_t>(ids.size(1), block);
    const at::Tensor logits = rt.forward(model, rt.to_device(ids.narrow(1, ids.size(1) - t, t)));
    const at::Tensor probs = logits.select(1, t - 1).to(at::kCPU, at::kFloat).softmax(-1);
    const at::Tensor next = at::multinomial(probs, 1, /*replacement=*/false, gen);
    out.push_back(vocab.decode(next.item<int64_t>()));
    ids = at::cat({ids, next}, 1);
  }
  model->train();
  return out;
}

/// Throws unless the model is causal: changing the last character of every window must leave
/// the logits of all earlier positions as they were.
template <class RT, class Model>
void check_causal(RT& rt, Model& model, const at::Tensor& ids, const Options& o, int64_t vocab) {
  at::NoGradGuard no_grad;
  auto [x, y] = windows(ids, o.block, 2, 12345);
  at::Tensor changed = x.clone();
  changed.select(1, o.block - 1).add_(1).remainder_(vocab);
  const at::Tensor a = rt.forward(model, rt.to_device(x)).narrow(1, 0, o.block - 1);
  const at::Tensor b = rt.forward(model, rt.to_device(changed)).narrow(1, 0, o.block - 1);
  if (!at::allclose(a.to(at::kFloat), b.to(at::kFloat), 1e-3, 1e-3)) {
    throw std::runtime_error("the model sees the future: the causal mask does not hold");
  }
}

struct Result {
  double val_loss, ema_val_loss, uniform;
};

template <class RT>
Result train(RT& rt, const Options& o) {
  const std::string text = read_text(o.text);
  const Vocabulary vocab(text);
  const at::Tensor ids = vocab.encode(text);
  const int64_t split = ids.size(0) * 9 / 10;
  const at::Tensor train_ids = ids.narrow(0, 0, split),
                   val_ids = ids.narrow(0, split, ids.size(0) - split);
  if (val_ids.size(0) <= o.block + 1) throw std::runtime_error("the text is too short for --block");

  CharLM<Block> model{nullptr};
  {
    [[maybe_unused]] auto init = rt.module_init_context();
    model = CharLM<Block>(vocab.size(), o.block, o.width, o.layers, o.heads);
    model->recompute = o.checkpoint_activations;
  }
  // Weight decay on the matrices only (not on biases, LayerNorm or the embeddings), as GPT
  // trainers do: two parameter groups of one fused AdamW.
  std::vector<at::Tensor> decayed, plain;
  for (const auto& p : model->named_parameters()) {
    const bool matrix =
        p.value().dim() == 2 && p.key().find("tok.") != 0 && p.key().find("pos.") != 0;
    (matrix ? decayed : plain).push_back(p.value());
  }
  const double eps = std::is_same_v<typename RT::precision_policy, loom::Fp16True> ? 1e-4 : 1e-8;
  loom::optim::AdamW opt(
      {torch::optim::OptimizerParamGroup(
           decayed, std::make_unique<loom::optim::AdamWOptions>(
                        loom::optim::AdamWOptions(o.lr).weight_decay(0.1).eps(eps))),
       torch::optim::OptimizerParamGroup(
           plain, std::make_unique<loom::optim::AdamWOptions>(
                      loom::optim::AdamWOptions(o.lr).weight_decay(0.0).eps(eps)))},
      loom::optim::AdamWOptions(o.lr).eps(eps));
  rt.setup(model, opt);
  // The EMA holds the model's tensors as setup left them.
  loom::optim::EMA ema(*model, {.decay = o.ema_decay});
  check_causal(rt, model, train_ids, o, vocab.size());
  loom::optim::WarmupCosineLR schedule(
      opt, {.warmup_steps = o.warmup_steps, .total_steps = o.steps, .warmup_start_factor = 0.1});

  int64_t n_params = 0;
  for (const auto& p : model->parameters()) n_params += p.numel();
  std::printf(
      "char_lm: %lld characters (%lld kinds), a %lld-layer transformer of %lld parameters, "
      "%s on %s\n",
      static_cast<long long>(ids.size(0)), static_cast<long long>(vocab.size()),
      static_cast<long long>(o.layers), static_cast<long long>(n_params),
      std::string(RT::precision_name()).c_str(), std::string(rt.device().name()).c_str());

  if (!o.log_dir.empty()) {
    auto csv = std::make_shared<loom::CsvLogger>(o.log_dir, loom::LogDirOptions{.name = "char_lm"});
    rt.add_logger(csv);
    rt.log_hyperparams({{"precision", std::string(RT::precision_name())},
                        {"steps", o.steps},
                        {"batch_size", o.batch_size},
                        {"accumulate", o.accumulate},
                        {"lr", o.lr},
                        {"width", o.width},
                        {"layers", o.layers}});
    std::printf("logging to %s\n", csv->metrics_file().string().c_str());
  }

  int64_t step = 0;
  loom::State state{{"model", model},        {"optimizer", opt}, {"runtime", rt},
                    {"scheduler", schedule}, {"ema", ema},       {"step", step}};
  std::optional<loom::Checkpoints> ckpt;
  if (!o.checkpoints.dir.empty()) {
    ckpt.emplace(o.checkpoints.dir, loom::CheckpointsOptions{.keep_last = o.checkpoints.keep});
    if (auto resumed = ckpt->resume(rt, state)) {
      std::printf("resumed from %s at step %lld\n", ckpt->path(*resumed).string().c_str(),
                  static_cast<long long>(step));
    }
  }
  const int64_t last = o.max_steps >= 0 ? std::min(o.steps, o.max_steps) : o.steps;
  loom::StopSignal stop;
  loom::ProgressBar progress(last, 50, "train", {.initial = step});  // a resumed run's step
  loom::SpeedMonitor speed({.window_size = 20});
  auto save = [&](bool in_background = false) {
    if (ckpt) ckpt->save(rt, step, state, {.sync = true, .async = in_background});
  };
  // --profile: steps 7-9 of this run recorded (5 waiting, 2 warming up), one trace.
  std::optional<loom::Profiler> prof;
  if (!o.profile_dir.empty()) {
    prof.emplace(loom::ProfilerOptions{
        .schedule = loom::ProfilerSchedule{.wait = 5, .warmup = 2, .active = 3, .repeat = 1},
        .dir = o.profile_dir,
        .on_trace_ready = [](loom::Profiler& p) {
          std::printf("profile: %s\n%s", p.last_trace().string().c_str(),
                      p.table("self_cpu_time_total", 10).c_str());
        }});
    prof->start();
  }
  while (step < last) {
    // Accumulation: the micro-batches' gradients add up; under Ddp only the last backward
    // all-reduces. Each micro-batch's loss is divided so the step sees their mean.
    at::Tensor step_loss;
    for (int64_t m = 0; m < o.accumulate; ++m) {
      auto scope = rt.no_backward_sync(model, m + 1 < o.accumulate);
      auto [x, y] =
          windows(train_ids, o.block, o.batch_size, static_cast<uint64_t>(step * o.accumulate + m));
      const at::Tensor loss =
          loss_of(rt, model, rt.to_device(x), rt.to_device(y)) / static_cast<double>(o.accumulate);
      const at::Tensor l = rt.backward(loss, model);
      step_loss = step_loss.defined() ? step_loss + l : l;
    }
    const loom::GradNorm norm = rt.clip_gradients(opt, o.clip);  // on the device
    const loom::StepResult applied = rt.optimizer_step(opt);
    schedule.step(applied);  // a skipped 16-mixed step does not advance the schedule
    ema.update();
    opt.zero_grad();
    const double lr = opt.param_groups()[0].options().get_lr();
    rt.log_dict({{"train/loss", step_loss}, {"train/grad_norm", norm.tensor()}, {"lr", lr}}, step);
    rt.log_dict(speed.step(o.batch_size * o.accumulate), step);
    ++step;
    progress.step(o.batch_size * o.accumulate, step_loss);  // read only when printed
    if (prof) prof->step();
    if (step % o.checkpoints.every == 0 && step < last) save(o.checkpoints.async_save);
    if (stop.should_stop(rt)) {
      progress.finish();
      save();
      std::printf("stopped by signal %d at step %lld%s\n", stop.signal(),
                  static_cast<long long>(step), ckpt ? ", saved" : " (no --checkpoint-dir)");
      throw Stopped{stop.exit_code()};
    }
  }
  progress.finish();
  if (prof) prof->stop();
  if (ckpt) {
    save();
    ckpt->wait(rt);
    const auto final_path = ckpt->dir() / "final.pt";
    rt.save(final_path, state);
    std::printf("checkpoint: step %lld saved, final state in %s\n", static_cast<long long>(step),
                final_path.string().c_str());
  }

  Result r{};
  r.uniform = std::log(static_cast<double>(vocab.size()));
  r.val_loss = examples::validation_loss(rt, model, val_ids, o.block, o.batch_size);
  {
    auto averaged = ema.swap();  // the EMA's weights in the model until the scope ends
    r.ema_val_loss = examples::validation_loss(rt, model, val_ids, o.block, o.batch_size);
    if (o.sample > 0) {
      std::printf("sample (EMA weights):\n%s\n",
                  sample(rt, model, vocab, "This License", o.sample, o.block).c_str());
    }
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Trains a character-level transformer on text through loom::Runtime.", "char_lm"};
  app.option_defaults()->always_capture_default();
  app.add_option("--text", o.text, "text files, or directories of them");
  app.add_option("--device", o.device, "cpu, cuda, gpu or auto");
  app.add_option("--precision", o.precision,
                 "one of " + std::string(loom::precision::allowed_names));
  app.add_option("--steps", o.steps, "optimizer steps the run plans (the schedule's length)")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-steps", o.max_steps, "stop at this step (-1: at --steps); resume later");
  app.add_option("--batch-size", o.batch_size, "windows per micro-batch")
      ->check(CLI::PositiveNumber);
  app.add_option("--accumulate", o.accumulate, "micro-batches per optimizer step")
      ->check(CLI::PositiveNumber);
  app.add_option("--block", o.block, "characters of context")->check(CLI::Range(2, 4096));
  app.add_option("--width", o.width, "embedding width")->check(CLI::PositiveNumber);
  app.add_option("--layers", o.layers, "transformer blocks")->check(CLI::PositiveNumber);
  app.add_option("--heads", o.heads, "attention heads (dividing --width)")
      ->check(CLI::PositiveNumber);
  app.add_option("--lr", o.lr, "AdamW's peak learning rate")->check(CLI::PositiveNumber);
  app.add_option("--warmup-steps", o.warmup_steps, "linear warm-up steps, then cosine to 0")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--clip", o.clip, "clip the gradient norm to this (0: no clipping)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--checkpoint-activations", o.checkpoint_activations,
               "rebuild each block's activations in backward (less memory, the same bits)");
  app.add_option("--ema-decay", o.ema_decay, "decay of the weights' EMA")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--sample", o.sample, "characters to sample at the end (0: none)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--log-dir", o.log_dir,
                 "log loss, grad norm, lr and throughput to DIR/char_lm/version_N/metrics.csv");
  app.add_option("--profile", o.profile_dir,
                 "record steps 7-9 with loom::Profiler: DIR/rank-R.step-9.pt.trace.json");
  o.checkpoints.add_to(app, " (run again after --max-steps or a signal to continue)");
  CLI11_PARSE(app, argc, argv);
  if (o.width % o.heads != 0) {
    std::fprintf(stderr, "char_lm: --heads %lld does not divide --width %lld\n",
                 static_cast<long long>(o.heads), static_cast<long long>(o.width));
    return 2;
  }
  if (o.warmup_steps >= o.steps) {
    std::fprintf(stderr, "char_lm: --warmup-steps must be below --steps\n");
    return 2;
  }

  try {
    torch::manual_seed(0);
    const Result r =
        loom::with_runtime(o.device, o.precision, [&](auto& rt) { return train(rt, o); });
    // Learned: well below the loss of guessing every character uniformly.
    const bool learned = r.val_loss < r.uniform - 1.0;
    std::printf("validation loss %.4f (EMA weights %.4f), uniform guess %.4f: %s\n", r.val_loss,
                r.ema_val_loss, r.uniform, learned ? "learned" : "did NOT learn");
    return learned ? 0 : 1;
  } catch (const Stopped& s) {
    return s.code;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "char_lm: %s\n", e.what());
    return 2;
  }
}
