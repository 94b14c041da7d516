// The loom side of tests/dist/fsdp_parity.py: a model of three blocks (each a loom::FsdpUnit)
// and a head trained under loom::Fsdp (or loom::Ddp), its parameters written whole at the end.
//
//   loom_fsdp_worker dir=DIR samples=N steps=S [strategy=fsdp|ddp|zero|single] [accumulate=K]
//                    [clip=C] [policy=bf16] [checkpoint=1] [reshard=0] [tag=NAME]
//                    [save_at=I] [load=FILE start=I [resave=FILE]] [sharded=1] [dcp=1] [async=1]
//                    [empty=1] [reset=SEED] [seed=SEED]
//
// Reads DIR/init.bin (the parameters, f32, in the module's order), DIR/x.bin (N x 15 f32) and
// DIR/y.bin (N int64); step i trains on rows [8i, 8i + 8), each rank its half, in K
// micro-batches (all but the last under no_backward_sync); policy=bf16: FSDP2's
// MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=f32); checkpoint=1: each block's body
// under loom::activation_checkpoint; reshard=0: reshard_after_forward off. Writes
// DIR/TAG_rankR.bin (the whole parameters, f32) and, with C > 0, DIR/TAG_rankR.norms (the norm
// clip_gradients returned at every step). save_at=I: rt.save to DIR/ckpt_TAG.pt (the model and
// the optimizer) before step I, and the whole parameters then to DIR/TAG_saved_rankR.bin;
// load=FILE: rt.load before the first step, which is `start`; with resave=FILE the loaded
// state is saved again at once to FILE and the run ends; sharded=1: rt.save writes each rank's
// pieces (FsdpCheckpoint::Sharded); dcp=1: a DCP directory (FsdpCheckpoint::Dcp), DIR/ckpt_TAG.dcp
// for save_at; async=1: the save_at save by loom::Checkpoints with {.async = true} instead, as
// DIR/ckpts_TAG/step-I.pt, written while the steps after it run (waited for at the end).
// After load=, each rank prints how many parameters have optimizer state ("optimizer states
// after load: N of M"). empty=1: the model built under loom::EmptyInit (no values
// until load= or reset=); reset=SEED: rt.reset_parameters after setup, seeded; seed=SEED: the
// model built normally with that seed instead of read from init.bin. strategy=single: one
// process.
// device=cuda: on the CUDA device of the local rank (NCCL), the peak of allocated bytes printed.
#include <cstdint>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/torch.h>

#include <loom/loom.hpp>
#include <loom/state/checkpoints.hpp>

namespace {

std::map<std::string, std::string> g_args;

std::string arg(const std::string& key, const std::string& fallback) {
  const auto it = g_args.find(key);
  return it == g_args.end() ? fallback : it->second;
}
int iarg(const std::string& key, int fallback) {
  return std::stoi(arg(key, std::to_string(fallback)));
}

template <class T>
std::vector<T> read_raw(const std::string& path, std::size_t n) {
  std::vector<T> out(n);
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(n * sizeof(T)));
  if (!in) throw loom::Error("fsdp_worker: cannot read " + path);
  return out;
}

constexpr int64_t width = 15, hidden = 32, classes = 5;

/// fsdp_parity.py's Block: x + down(tanh(up(norm(x)))), the body checkpointed or not.
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(bool checkpoint) : checkpoint_(checkpoint) {
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})));
    up = register_module("up", torch::nn::Linear(width, hidden));
    down = register_module("down", torch::nn::Linear(hidden, width));
  }
  at::Tensor forward(at::Tensor x) {
    auto body = [this](const at::Tensor& in) { return in + down(torch::tanh(up(norm(in)))); };
    return checkpoint_ ? loom::activation_checkpoint(parameters(), body, x) : body(x);
  }
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear up{nullptr}, down{nullptr};
  bool checkpoint_;
};
TORCH_MODULE(Block);

/// The model of fsdp_parity.py: three blocks, each a unit, then a LayerNorm and the head in
/// the root; row counts 15 and 5 leave the last rank's pieces padded. Built in registration
/// order (a constructor's arguments are built in an unspecified order), as reset_parameters
/// initializes them.
torch::nn::Sequential make_model(bool checkpoint) {
  torch::nn::Sequential model;
  for (int i = 0; i < 3; ++i) model->push_back(loom::FsdpUnit<Block>(checkpoint));
  model->push_back(torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})));
  model->push_back(torch::nn::Linear(width, classes));
  return model;
}

template <class D, class S>
int train(S strategy) {
  const std::string dir = arg("dir", ".");
  const int steps = iarg("steps", 20), k = iarg("accumulate", 1), global = 8;
  const int n = iarg("samples", steps * global);
  const double clip = std::stod(arg("clip", "0"));
  loom::Runtime<D, loom::Fp32, S> rt(D(), loom::Fp32(), std::move(strategy));
  auto& s = rt.strategy();
  const bool empty = arg("empty", "0") == "1", seeded = !arg("seed", "").empty();
  if (seeded) torch::manual_seed(std::stoull(arg("seed", "")));
  torch::nn::Sequential model{nullptr};
  {
    std::optional<loom::EmptyInit> meta;
    if (empty) meta.emplace();
    model = make_model(arg("checkpoint", "0") == "1");
  }
  std::int64_t total = 0;
  for (const auto& p : model->parameters()) total += p.numel();
  if (!empty && !seeded) {
    torch::NoGradGuard g;
    auto init = read_raw<float>(dir + "/init.bin", static_cast<std::size_t>(total));
    std::size_t at = 0;
    for (auto& p : model->parameters()) {
      p.copy_(torch::from_blob(init.data() + at, p.sizes(), torch::kFloat));
      at += static_cast<std::size_t>(p.numel());
    }
  }
  auto xs = read_raw<float>(dir + "/x.bin", static_cast<std::size_t>(n * width));
  auto ys = read_raw<std::int64_t>(dir + "/y.bin", static_cast<std::size_t>(n));
  const auto X = torch::from_blob(xs.data(), {n, width}, torch::kFloat).clone();
  const auto Y = torch::from_blob(ys.data(), {n}, torch::kLong).clone();
  loom::optim::AdamW opt(model->parameters(), loom::optim::AdamWOptions(1e-2).weight_decay(0.01));
  rt.setup(model, opt);
  if (const std::string seed = arg("reset", ""); !seed.empty()) {
    torch::manual_seed(std::stoull(seed));
    rt.reset_parameters(model);
  }
  const int world = s.world_size(), per = global / world;
  loom::State state{{"model", model}, {"optimizer", opt}};
  // The whole parameters to DIR/NAME_rankR.bin: under Fsdp gathered from every rank's pieces
  // (full_tensor()).
  auto write_whole = [&](const std::string& tag) {
    std::vector<at::Tensor> whole;
    if constexpr (std::is_same_v<S, loom::Fsdp>) {
      for (const auto& t : s.full_parameters()) whole.push_back(t.reshape({-1}));
    } else {
      for (const auto& p : model->parameters()) whole.push_back(p.detach().reshape({-1}));
    }
    const auto flat = at::cat(whole).cpu().contiguous();
    std::ofstream out(dir + "/" + tag + "_rank" + std::to_string(s.rank()) + ".bin",
                      std::ios::binary);
    out.write(reinterpret_cast<const char*>(flat.data_ptr<float>()),
              static_cast<std::streamsize>(flat.numel() * 4));
    return flat.numel();
  };
  int first = 0;
  if (const std::string from = arg("load", ""); !from.empty()) {
    rt.load(from, state);
    first = iarg("start", 0);
    std::cout << "fsdp worker rank " << s.rank()
              << ": optimizer states after load: " << opt.state().size() << " of "
              << model->parameters().size() << std::endl;
    if (const std::string to = arg("resave", ""); !to.empty()) {
      rt.save(to, state);  // loaded at this world size and strategy, saved again
      write_whole(arg("tag", "loom"));
      std::cout << "fsdp worker: loaded " << from << " and saved " << to << std::endl;
      rt.teardown();
      return 0;
    }
  }
  const int save_at = iarg("save_at", -1);
  std::vector<double> norms;
  // The bytes of whole parameters each unit holds after the first forward and backward.
  std::string whole_after_forward, whole_after_backward;
  auto whole_bytes = [&](const char* when) {
    std::string line = std::string("fsdp whole bytes after ") + when + ":";
    if constexpr (std::is_same_v<S, loom::Fsdp>) {
      for (const auto& u : s.units()) {
        line += " '" + u.path + "'=" + std::to_string(u.whole_bytes);
      }
    }
    return line;
  };
  loom::Checkpoints ckpts(dir + "/ckpts_" + arg("tag", "loom"));
  for (int step = first; step < steps; ++step) {
    if (step == save_at && arg("async", "0") == "1") {
      ckpts.save(rt, step, state, {.async = true});
      write_whole(arg("tag", "loom") + "_saved");
    } else if (step == save_at) {
      const char* ext = arg("dcp", "0") == "1" ? ".dcp" : ".pt";
      rt.save(dir + "/ckpt_" + arg("tag", "loom") + ext, state);
      write_whole(arg("tag", "loom") + "_saved");
    }
    opt.zero_grad();
    auto x = rt.to_device(X.narrow(0, step * global + s.rank() * per, per));
    auto y = rt.to_device(Y.narrow(0, step * global + s.rank() * per, per));
    auto xm = x.tensor_split(k), ym = y.tensor_split(k);
    for (int j = 0; j < k; ++j) {
      auto scope = rt.no_backward_sync(model, j + 1 < k);
      auto loss = torch::nn::functional::cross_entropy(
          rt.forward(model, xm[static_cast<std::size_t>(j)]), ym[static_cast<std::size_t>(j)]);
      if (step == first && j == 0) whole_after_forward = whole_bytes("forward");
      rt.backward(k > 1 ? loss / k : loss, model);
      if (step == first && j == 0) whole_after_backward = whole_bytes("backward");
    }
    if (clip > 0) norms.push_back(rt.clip_gradients(opt, clip).value());
    rt.optimizer_step(opt);
  }
  if constexpr (std::is_same_v<S, loom::Fsdp>) {
    if (s.rank() == 0) {
      std::cout << "fsdp units:";
      for (const auto& u : s.units()) std::cout << " '" << u.path << "'=" << u.parameters;
      std::cout << "\nfsdp gathers (prefetched):";
      for (const auto& u : s.units()) {
        std::cout << " '" << u.path << "'=" << u.gathers << " (" << u.prefetched << ")";
      }
      std::cout << "\n" << whole_after_forward << "\n" << whole_after_backward << std::endl;
    }
  }
  if constexpr (std::is_same_v<D, loom::Cuda>) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(c10::cuda::current_device());
    std::cout << "fsdp cuda rank " << s.rank() << ": peak allocated bytes "
              << stats.allocated_bytes[0].peak << std::endl;
  }
  ckpts.wait(rt);  // an asynchronous save's write, if any
  const auto written = write_whole(arg("tag", "loom"));
  const std::string name = dir + "/" + arg("tag", "loom") + "_rank" + std::to_string(s.rank());
  if (clip > 0) {
    std::ofstream file(name + ".norms");
    file << std::setprecision(17);
    for (const double v : norms) file << v << "\n";
  }
  std::cout << "fsdp worker: wrote " << written << " parameters" << std::endl;
  rt.teardown();
  return 0;
}

/// The strategy the arguments name, on device D.
template <class D>
int run() {
  if (arg("strategy", "fsdp") == "ddp") return train<D>(loom::Ddp());
  if (arg("strategy", "fsdp") == "single") return train<D>(loom::SingleProcess());
  if (arg("strategy", "fsdp") == "zero") return train<D>(loom::Zero());
  loom::FsdpOptions options;
  options.reshard_after_forward = arg("reshard", "1") == "1";
  if (arg("sharded", "0") == "1") options.checkpoint = loom::FsdpCheckpoint::Sharded;
  if (arg("dcp", "0") == "1") options.checkpoint = loom::FsdpCheckpoint::Dcp;
  if (arg("policy", "") == "bf16") {
    options.mixed_precision.param_dtype = at::kBFloat16;
    options.mixed_precision.reduce_dtype = at::kFloat;
  }
  return train<D>(loom::Fsdp(options));
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto eq = a.find('=');
    if (eq == std::string::npos) {
      std::cerr << "fsdp_worker: arguments are key=value, not " << a << "\n";
      return 2;
    }
    g_args[a.substr(0, eq)] = a.substr(eq + 1);
  }
  try {
    if (arg("device", "cpu") == "cuda") return run<loom::Cuda>();
    return run<loom::Cpu>();
  } catch (const std::exception& e) {
    std::cerr << "fsdp_worker: " << e.what() << "\n";
    return 1;
  }
}
