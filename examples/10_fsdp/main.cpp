// The character-level transformer of 08_char_lm with its parameters sharded over the ranks by
// loom::Fsdp (PyTorch's FSDP2): each transformer block a loom::FsdpUnit, the rest the root. The
// model is built under loom::EmptyInit, so no rank ever allocates it whole: rt.setup gives each
// rank its pieces, and their values come from the newest checkpoint in --checkpoint-dir (each
// rank reading only its rows of the sharded files) or, on a fresh start, from the layers' own
// initializers (rt.reset_parameters: the same values on any number of ranks). Checkpoints are
// sharded: every rank writes its own pieces.
//
//   torchrun --standalone --nproc-per-node=2 --no-python fsdp_char_lm
//            --checkpoint-dir DIR [--text FILE_OR_DIR ...] [--steps 120] [--max-steps N]
//            [--batch-size 8] [--block 64] [--width 64] [--layers 2] [--heads 4] [--lr 3e-3]
//            [--clip 1.0] [--checkpoint-every 30] [--keep 2]
//
// --batch-size is per rank. --max-steps stops the run early, as a time limit would: run it
// again with the same --checkpoint-dir (on any number of ranks) and it resumes there. Ends
// with the validation loss and "learned" when it fell well below the uniform guess's.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/modules/activation.h>
#include <CLI/CLI.hpp>

#include <loom/dist/fsdp.hpp>
#include <loom/loom.hpp>
#include <loom/nn/empty_init.hpp>
#include <loom/nn/fsdp_unit.hpp>
#include <loom/state/checkpoints.hpp>

#include "common/char_lm.hpp"
#include "common/checkpoint_flags.hpp"

namespace {

using Model = examples::CharLM<loom::FsdpUnit<examples::Block>>;
using Runtime = loom::Runtime<loom::Cpu, loom::Fp32, loom::Fsdp>;

struct Options {
  std::vector<std::string> text{"/usr/share/common-licenses"};
  int64_t steps = 120;
  int64_t max_steps = -1;
  int64_t batch_size = 8;
  int64_t block = 64;
  int64_t width = 64;
  int64_t layers = 2;
  int64_t heads = 4;
  double lr = 3e-3;
  double clip = 1.0;
  examples::CheckpointFlags checkpoints;
};

/// The layers' own initializers (loom::nn::reset_parameters), and MultiheadAttention's, which
/// LibTorch's reset_parameters list leaves to the program: its input projection drawn
/// (Xavier), its biases zero.
bool initialize(torch::nn::Module& m) {
  if (auto* attn = dynamic_cast<torch::nn::MultiheadAttentionImpl*>(&m)) {
    attn->_reset_parameters();
    return true;
  }
  return loom::nn::reset_parameters(m);
}

int train(const Options& o) {
  loom::FsdpOptions fsdp;
  fsdp.checkpoint = loom::FsdpCheckpoint::Sharded;  // each rank writes its own pieces
  Runtime rt(loom::Cpu{}, loom::Fp32{}, loom::Fsdp(fsdp));
  const int rank = rt.strategy().rank(), world = rt.strategy().world_size();

  const std::string text = examples::read_text(o.text);
  const examples::Vocabulary vocab(text);
  const at::Tensor ids = vocab.encode(text);
  const int64_t split = ids.size(0) * 9 / 10;
  const at::Tensor train_ids = ids.narrow(0, 0, split),
                   val_ids = ids.narrow(0, split, ids.size(0) - split);
  if (val_ids.size(0) <= o.block + 1) throw std::runtime_error("the text is too short for --block");

  Model model{nullptr};
  {
    loom::EmptyInit empty;  // meta tensors: no memory, no values
    model = Model(vocab.size(), o.block, o.width, o.layers, o.heads);
  }
  int64_t n_params = 0;
  for (const auto& p : model->parameters()) n_params += p.numel();
  loom::optim::AdamW opt(model->parameters(), loom::optim::AdamWOptions(o.lr).weight_decay(0.1));
  rt.setup(model, opt);  // each rank allocates its pieces of every parameter

  int64_t step = 0;
  loom::State state{{"model", model}, {"optimizer", opt}, {"runtime", rt}, {"step", step}};
  loom::Checkpoints ckpt(o.checkpoints.dir, {.keep_last = o.checkpoints.keep});
  if (auto resumed = ckpt.resume(rt, state, {.world_size_may_change = true})) {
    if (rank == 0) {
      std::printf("resumed from %s at step %lld\n", ckpt.path(*resumed).string().c_str(),
                  static_cast<long long>(step));
    }
  } else {
    torch::manual_seed(0);
    rt.reset_parameters(model, initialize);
  }
  int64_t held = 0;
  for (const auto& p : model->parameters()) held += p.numel();
  if (rank == 0) {
    std::printf(
        "fsdp_char_lm: a %lld-layer transformer of %lld parameters on %d rank(s), %lld "
        "of them held by rank 0 (%zu units)\n",
        static_cast<long long>(o.layers), static_cast<long long>(n_params), world,
        static_cast<long long>(held), rt.strategy().units().size());
  }

  const int64_t last = o.max_steps >= 0 ? std::min(o.steps, o.max_steps) : o.steps;
  while (step < last) {
    // Each rank its own windows of the step, drawn from a generator seeded with both.
    auto [x, y] = examples::windows(train_ids, o.block, o.batch_size,
                                    static_cast<uint64_t>(step * world + rank));
    const at::Tensor loss = examples::loss_of(rt, model, rt.to_device(x), rt.to_device(y));
    rt.backward(loss, model);
    rt.clip_gradients(opt, o.clip);
    rt.optimizer_step(opt);
    opt.zero_grad();
    ++step;
    if (step % o.checkpoints.every == 0 || step == last) ckpt.save(rt, step, state);
    if (rank == 0 && step % 20 == 0) {
      std::printf("step %lld: loss %.4f\n", static_cast<long long>(step), loss.item<double>());
    }
  }
  ckpt.wait(rt);
  if (rank == 0) {
    std::printf("checkpoint: step %lld saved in %s (sharded)\n", static_cast<long long>(step),
                o.checkpoints.dir.c_str());
  }
  const double uniform = std::log(static_cast<double>(vocab.size()));
  const double val = examples::validation_loss(rt, model, val_ids, o.block, o.batch_size);
  const bool learned = step < o.steps || val < uniform - 1.0;
  if (rank == 0) {
    std::printf("validation loss %.4f, uniform guess %.4f: %s\n", val, uniform,
                step < o.steps ? "stopped early"
                : learned      ? "learned"
                               : "did NOT learn");
  }
  rt.teardown();
  return learned ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  o.checkpoints.every = 30;
  o.checkpoints.keep = 2;
  CLI::App app{"Trains a character-level transformer sharded over the ranks by loom::Fsdp.",
               "fsdp_char_lm"};
  app.option_defaults()->always_capture_default();
  app.add_option("--text", o.text, "text files, or directories of them");
  app.add_option("--steps", o.steps, "optimizer steps")->check(CLI::PositiveNumber);
  app.add_option("--max-steps", o.max_steps, "stop at this step (-1: at --steps); resume later");
  app.add_option("--batch-size", o.batch_size, "windows per rank")->check(CLI::PositiveNumber);
  app.add_option("--block", o.block, "characters of context")->check(CLI::Range(2, 4096));
  app.add_option("--width", o.width, "embedding width")->check(CLI::PositiveNumber);
  app.add_option("--layers", o.layers, "transformer blocks (one unit each)")
      ->check(CLI::PositiveNumber);
  app.add_option("--heads", o.heads, "attention heads (dividing --width)")
      ->check(CLI::PositiveNumber);
  app.add_option("--lr", o.lr, "AdamW's learning rate")->check(CLI::PositiveNumber);
  app.add_option("--clip", o.clip, "clip the gradient norm to this")->check(CLI::PositiveNumber);
  o.checkpoints.add_to(app, " (run again after --max-steps to continue)");
  app.get_option("--checkpoint-dir")->required();
  CLI11_PARSE(app, argc, argv);
  if (o.width % o.heads != 0) {
    std::fprintf(stderr, "fsdp_char_lm: --heads %lld does not divide --width %lld\n",
                 static_cast<long long>(o.heads), static_cast<long long>(o.width));
    return 2;
  }
  try {
    return train(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdp_char_lm: %s\n", e.what());
    return 2;
  }
}
