// Quick start: an MLP learns Fashion-MNIST through loom::Runtime<Device, Precision>.
//
//   quickstart --data build/data/fashion-mnist [--device cpu] [--precision 32-true]
//              [--epochs 1] [--max-steps N] [--batch-size 64] [--lr 1e-3]
//              [--warmup-steps N]
//              [--metrics metrics.csv [--log-every 10]] [--log-dir DIR]
//              [--checkpoint-dir DIR [--checkpoint-every 100] [--keep 3] [--async-save]]
//
// --device and --precision take Composer's and Lightning's names ("cuda", "bf16-mixed", ...):
// loom::with_runtime turns the two strings into a Runtime type, and train_and_evaluate is
// compiled once per device x precision pair.
// Prints the dtypes the model sees, then a progress bar (plain lines when stdout is not a
// terminal), then the test accuracy; exits 1 if the model did not learn (accuracy below 70%).
// --warmup-steps N > 0 schedules the lr: N steps of linear warm-up, then cosine annealing to 0
// at the last step (loom::optim::WarmupCosineLR, which only counts the steps that applied).
// --metrics writes a CSV (step,loss,lr,samples_per_s) that scripts/plot_metrics.py plots.
// --log-dir DIR logs through the runtime (rt.log, loom::CsvLogger): the loss every step (read
// once per flush), the lr, loom::SpeedMonitor's throughput and loom::MemoryMonitor's memory
// under Composer's names, in DIR/quickstart/version_N/metrics.csv (Lightning's layout), with
// the run's hyper-parameters in hparams.yaml.
// --checkpoint-dir DIR saves the whole training state (model, optimizer, the runtime's RNG and
// GradScaler, the lr schedule, the sampler's position, the step) to DIR/step-N.pt every
// --checkpoint-every steps, atomically, keeping the newest --keep (loom::Checkpoints), and the
// final state to DIR/final.pt. A run started on a DIR that holds a checkpoint resumes from the
// newest one that reads whole, mid-epoch included: the same bits as a run that never stopped
// (a DIR written under other settings, another --precision, is an error that changes nothing).
// --async-save writes the periodic checkpoints in a background thread (loom::Checkpoints'
// {.async = true}). SIGTERM, SIGINT or SIGUSR1 (a scheduler's preemption, Ctrl-C) saves the
// step reached and
// exits with 128 + the signal (143 for SIGTERM); run it again to continue. The files are
// torch.save files: Python opens them with torch.load (docs/checkpoints.md).
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <torch/data/dataloader.h>
#include <torch/data/datasets/map.h>
#include <torch/data/datasets/mnist.h>
#include <torch/data/transforms/stack.h>
#include <torch/data/transforms/tensor.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <CLI/CLI.hpp>

#include <loom/dist/stop_signal.hpp>
#include <loom/loom.hpp>
#include <loom/state/checkpoints.hpp>

#include <loom/loggers/progress_bar.hpp>
#include "common/checkpoint_flags.hpp"

namespace {

struct Options {
  std::string data = "data/fashion-mnist";
  std::string device = "cpu";
  std::string precision = "32-true";
  int epochs = 1;
  int64_t max_steps = -1;
  int64_t batch_size = 64;
  double lr = 1e-3;
  int64_t warmup_steps = 0;  // 0: a constant lr
  std::string metrics;       // empty: no CSV
  int64_t log_every = 10;
  std::string log_dir;  // empty: no loggers
  examples::CheckpointFlags checkpoints;
};

/// A run stopped by a signal after saving its step; main exits with `code`.
struct Stopped {
  int code;
};

/// The --metrics CSV: a row every `every` steps with the mean loss of those steps, the
/// learning rate and the throughput over them, so a plot shows the trend, not step noise.
class MetricsLog {
 public:
  MetricsLog(const std::string& path, int64_t every) : every_(every), last_(Clock::now()) {
    if (path.empty()) return;
    file_ = std::fopen(path.c_str(), "w");
    if (file_ == nullptr) throw std::runtime_error("cannot write the metrics file " + path);
    std::fprintf(file_, "step,loss,lr,samples_per_s\n");
  }
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  ~MetricsLog() {
    if (file_ != nullptr) std::fclose(file_);
  }

  void step(int64_t step, double loss, int64_t samples, double lr) {
    if (file_ == nullptr) return;
    loss_ += loss;
    samples_ += samples;
    if (++steps_ == every_) write(step, lr);
  }
  /// Writes the steps since the last row, if any: the last row is the last step.
  void finish(int64_t step, double lr) {
    if (file_ != nullptr && steps_ > 0) write(step, lr);
  }

 private:
  using Clock = std::chrono::steady_clock;
  void write(int64_t step, double lr) {
    auto now = Clock::now();
    double secs = std::max(std::chrono::duration<double>(now - last_).count(), 1e-9);
    std::fprintf(file_, "%lld,%.6g,%.6g,%.1f\n", static_cast<long long>(step),
                 loss_ / static_cast<double>(steps_), lr, static_cast<double>(samples_) / secs);
    std::fflush(file_);  // a run that is stopped early still leaves a readable file
    loss_ = 0;
    samples_ = steps_ = 0;
    last_ = now;
  }

  std::FILE* file_ = nullptr;
  int64_t every_;
  Clock::time_point last_;
  double loss_ = 0;
  int64_t samples_ = 0, steps_ = 0;
};

torch::nn::Sequential make_model() {
  return torch::nn::Sequential(torch::nn::Flatten(), torch::nn::Linear(28 * 28, 256),
                               torch::nn::ReLU(), torch::nn::Linear(256, 10));
}

auto dataset(const std::string& root, torch::data::datasets::MNIST::Mode mode) {
  // Fashion-MNIST's pixel mean and standard deviation.
  return torch::data::datasets::MNIST(root, mode)
      .map(torch::data::transforms::Normalize<>(0.2860, 0.3530))
      .map(torch::data::transforms::Stack<>());
}

/// Trains and evaluates with any runtime: the device and precision are its template arguments.
template <class RT>
double train_and_evaluate(RT& rt, const Options& o) {
  using Mode = torch::data::datasets::MNIST::Mode;
  torch::nn::Sequential model{nullptr};
  {
    [[maybe_unused]] auto init = rt.module_init_context();
    model = make_model();
  }
  // In fp16 Adam's default eps (1e-8) rounds to 0, and a zero second moment then divides by
  // zero: true-fp16 training needs an eps fp16 can represent.
  constexpr bool fp16_weights = std::is_same_v<typename RT::precision_policy, loom::Fp16True>;
  // loom's fused Adam: one kernel per step (Python's Adam(fused=True)); under 16-mixed the
  // whole step runs without a host sync (docs/optim.md).
  loom::optim::Adam opt(model->parameters(),
                        loom::optim::AdamOptions(o.lr).eps(fp16_weights ? 1e-4 : 1e-8));
  rt.setup(model, opt);

  auto train_set = dataset(o.data, Mode::kTrain);
  const auto n_train = *train_set.size();
  // Shuffled by epoch from a seed of its own (no global RNG), with its epoch and position
  // in the checkpoint: a resumed run sees the same batches as one that never stopped.
  loom::DistributedSampler sampler(n_train, rt.strategy(), /*shuffle=*/true, /*seed=*/0);
  // The loader draws from `sampler` itself (a loader owns the sampler it is given).
  auto train_loader = torch::data::make_data_loader(std::move(train_set), loom::SamplerRef(sampler),
                                                    torch::data::DataLoaderOptions(o.batch_size));

  std::printf("training an MLP on Fashion-MNIST (%zu images), %s on %s\n", n_train,
              std::string(RT::precision_name()).c_str(), std::string(rt.device().name()).c_str());
  const auto n_batches = static_cast<int64_t>((n_train + o.batch_size - 1) / o.batch_size);
  int64_t total_steps = o.epochs * n_batches;
  if (o.max_steps >= 0) total_steps = std::min(total_steps, o.max_steps);
  MetricsLog metrics(o.metrics, o.log_every);
  auto lr = [&] { return opt.param_groups()[0].options().get_lr(); };
  std::optional<loom::optim::WarmupCosineLR> schedule;
  if (o.warmup_steps > 0) {
    schedule.emplace(opt, loom::optim::WarmupCosineOptions{.warmup_steps = o.warmup_steps,
                                                           .total_steps = total_steps,
                                                           .warmup_start_factor = 0.1});
    std::printf("lr schedule: warm-up over %lld steps from %g, then cosine to 0 at step %lld\n",
                static_cast<long long>(o.warmup_steps), lr(), static_cast<long long>(total_steps));
  }
  loom::SpeedMonitor speed({.window_size = 20});
  loom::MemoryMonitor memory(rt.device().device());
  if (!o.log_dir.empty()) {
    auto csv =
        std::make_shared<loom::CsvLogger>(o.log_dir, loom::LogDirOptions{.name = "quickstart"});
    rt.add_logger(csv);
    rt.log_hyperparams({{"precision", std::string(RT::precision_name())},
                        {"batch_size", o.batch_size},
                        {"lr", o.lr},
                        {"warmup_steps", o.warmup_steps}});
    std::printf("logging to %s\n", csv->metrics_file().string().c_str());
  }
  int64_t step = 0;
  // What a checkpoint holds, by name; rt.save writes it, rt.load restores it in place.
  loom::State state{
      {"model", model}, {"optimizer", opt}, {"runtime", rt}, {"sampler", sampler}, {"step", step}};
  if (schedule) state.emplace_back("scheduler", *schedule);
  std::optional<loom::Checkpoints> ckpt;
  if (!o.checkpoints.dir.empty()) {
    ckpt.emplace(o.checkpoints.dir, loom::CheckpointsOptions{.keep_last = o.checkpoints.keep});
    if (auto resumed = ckpt->resume(rt, state)) {  // the newest checkpoint that reads
      std::printf("resumed from %s at step %lld\n", ckpt->path(*resumed).string().c_str(),
                  static_cast<long long>(step));
    }
  }
  loom::StopSignal stop;  // SIGTERM, SIGINT, SIGUSR1: save the step reached, then leave
  const int64_t start = step;
  loom::ProgressBar progress(total_steps - start);
  // --async-save: the periodic saves copy the state and write it in the background while
  // training goes on; the last save before leaving is synchronous (it waits for the one
  // before it, whose error, if any, every rank throws).
  auto save = [&](bool in_background = false) {
    if (ckpt) ckpt->save(rt, step, state, {.sync = true, .async = in_background});
  };
  for (auto epoch = static_cast<int>(sampler.epoch()); epoch < o.epochs && step != o.max_steps;
       ++epoch) {
    model->train();
    // After a resume, the loaded epoch's first reset keeps the sampler's loaded position.
    sampler.set_epoch(static_cast<std::uint64_t>(epoch));
    for (auto& batch : rt.dataloader(*train_loader)) {
      at::Tensor logits;
      if (step == 0) {
        // What the precision does, observed: weights, the input and the activation inside
        // the forward context, and the output handed back outside it.
        c10::ScalarType input{}, hidden{};
        logits = rt.forward(
            [&](const at::Tensor& x) {
              input = x.scalar_type();
              // The first Linear (under fp8-mixed a loom::fp8::Linear): (B, 256).
              at::Tensor h = model->begin()[1].forward(x.flatten(1));
              hidden = h.scalar_type();
              return model->forward(x);
            },
            batch.data);
        std::printf("dtypes: weights %s, input %s, activation %s inside forward, output %s\n",
                    c10::toString(model->parameters()[0].scalar_type()), c10::toString(input),
                    c10::toString(hidden), c10::toString(logits.scalar_type()));
      } else {
        logits = rt.forward(model, batch.data);  // (B, 10) f32
      }
      auto loss = torch::nn::functional::cross_entropy(logits, batch.target);  // () f32
      // item() waits for the device; a long run on a GPU would read it only every few steps.
      const at::Tensor detached = rt.backward(loss, model);
      double l = detached.template item<double>();
      rt.log("train/loss", detached, step);   // copied on the device, read at the next flush
      auto applied = rt.optimizer_step(opt);  // a StepResult: read only if someone asks
      if (schedule) schedule->step(applied);  // advances only if the step was applied
      opt.zero_grad();
      ++step;
      progress.step(batch.data.size(0), l);
      metrics.step(step, l, batch.data.size(0), lr());
      auto monitored = speed.step(batch.data.size(0));
      monitored.emplace_back("lr", lr());
      if (step % 50 == 0) {
        for (auto& m : memory.report()) monitored.push_back(std::move(m));
      }
      rt.log_dict(monitored, step - 1);  // the step's own index, as the loss above
      if (step % o.checkpoints.every == 0) save(o.checkpoints.async_save);
      if (stop.should_stop(rt)) {
        progress.finish();
        if (step % o.checkpoints.every != 0) save();
        std::printf("stopped by signal %d at step %lld%s\n", stop.signal(),
                    static_cast<long long>(step), ckpt ? ", saved" : " (no --checkpoint-dir)");
        throw Stopped{stop.exit_code()};
      }
      if (step == o.max_steps) break;  // before the loader fetches a batch it will not train on
    }
  }
  progress.finish();
  if (ckpt) {
    if (step % o.checkpoints.every != 0) save();
    ckpt->wait(rt);  // a background save still under way
    const auto final_path = ckpt->dir() / "final.pt";
    rt.save(final_path, state);
    std::printf("checkpoint: step %lld saved, final state in %s\n", static_cast<long long>(step),
                final_path.string().c_str());
  }
  metrics.finish(step, lr());
  if (schedule) std::printf("lr schedule: final lr %g\n", lr());
  if (!o.metrics.empty()) std::printf("metrics written to %s\n", o.metrics.c_str());

  model->eval();
  torch::NoGradGuard no_grad;
  auto test_set = dataset(o.data, Mode::kTest);
  auto test_loader =
      torch::data::make_data_loader(std::move(test_set), torch::data::DataLoaderOptions(1000));
  int64_t correct = 0, total = 0;
  for (auto& batch : rt.dataloader(*test_loader)) {
    auto logits = rt.forward(model, batch.data);
    correct += logits.argmax(1).eq(batch.target).sum().template item<int64_t>();
    total += batch.data.size(0);
  }
  return static_cast<double>(correct) / static_cast<double>(total);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Trains an MLP on Fashion-MNIST through loom::Runtime<Device, Precision>.",
               "quickstart"};
  app.option_defaults()->always_capture_default();
  app.add_option("--data", o.data, "directory with Fashion-MNIST's IDX files");
  app.add_option("--device", o.device, "cpu, cuda, gpu or auto");
  app.add_option("--precision", o.precision,
                 "one of " + std::string(loom::precision::allowed_names));
  app.add_option("--epochs", o.epochs, "passes over the training set")->check(CLI::PositiveNumber);
  app.add_option("--max-steps", o.max_steps, "stop after this many steps (-1: no limit)");
  app.add_option("--batch-size", o.batch_size)->check(CLI::PositiveNumber);
  app.add_option("--lr", o.lr, "Adam's learning rate")->check(CLI::PositiveNumber);
  app.add_option("--warmup-steps", o.warmup_steps,
                 "linear warm-up steps, then cosine annealing (0: constant lr)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--metrics", o.metrics, "write step,loss,lr,samples_per_s rows to this CSV");
  app.add_option("--log-every", o.log_every, "steps per metrics row")->check(CLI::PositiveNumber);
  app.add_option("--log-dir", o.log_dir,
                 "log the loss, lr, throughput and memory to DIR/quickstart/version_N/metrics.csv");
  o.checkpoints.add_to(app, "");
  CLI11_PARSE(app, argc, argv);

  try {
    torch::manual_seed(0);
    double accuracy = loom::with_runtime(o.device, o.precision,
                                         [&](auto& rt) { return train_and_evaluate(rt, o); });
    bool learned = accuracy >= 0.70;
    std::printf("test accuracy %.2f%%: %s\n", 100 * accuracy,
                learned ? "learned" : "did NOT learn");
    return learned ? 0 : 1;
  } catch (const Stopped& s) {
    return s.code;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "quickstart: %s\n", e.what());
    return 2;
  }
}
