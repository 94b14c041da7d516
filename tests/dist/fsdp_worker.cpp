// The loom side of tests/dist/fsdp_parity.py: a model of three blocks trained under loom::Fsdp
// (or loom::Ddp), its parameters written whole at the end.
//
//   loom_fsdp_worker dir=DIR samples=N steps=S [strategy=fsdp|ddp] [accumulate=K] [clip=C]
//                    [tag=NAME]
//
// Reads DIR/init.bin (the parameters, f32, in the module's order), DIR/x.bin (N x 8 f32) and
// DIR/y.bin (N int64); step i trains on rows [8i, 8i + 8), each rank its half, in K
// micro-batches (all but the last under no_backward_sync); writes DIR/TAG_rankR.bin (the whole
// parameters, f32) and, with C > 0, DIR/TAG_rankR.norms (the norm clip_gradients returned at
// every step).
#include <cstdint>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <loom/loom.hpp>

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

/// The model of fsdp_parity.py: odd row counts (15, 5) so that the last rank's piece is
/// padded, LayerNorms, three blocks.
torch::nn::Sequential make_model() {
  return torch::nn::Sequential(
      torch::nn::Linear(8, 15), torch::nn::Tanh(),
      torch::nn::LayerNorm(torch::nn::LayerNormOptions({15})), torch::nn::Linear(15, 32),
      torch::nn::Tanh(), torch::nn::Linear(32, 15),
      torch::nn::LayerNorm(torch::nn::LayerNormOptions({15})), torch::nn::Linear(15, 5));
}

template <class S>
int train(S strategy) {
  const std::string dir = arg("dir", ".");
  const int steps = iarg("steps", 20), k = iarg("accumulate", 1), global = 8;
  const int n = iarg("samples", steps * global);
  const double clip = std::stod(arg("clip", "0"));
  loom::Runtime<loom::Cpu, loom::Fp32, S> rt(loom::Cpu(), loom::Fp32(), std::move(strategy));
  auto& s = rt.strategy();
  auto model = make_model();
  std::int64_t total = 0;
  for (const auto& p : model->parameters()) total += p.numel();
  {
    torch::NoGradGuard g;
    auto init = read_raw<float>(dir + "/init.bin", static_cast<std::size_t>(total));
    std::size_t at = 0;
    for (auto& p : model->parameters()) {
      p.copy_(torch::from_blob(init.data() + at, p.sizes(), torch::kFloat));
      at += static_cast<std::size_t>(p.numel());
    }
  }
  auto xs = read_raw<float>(dir + "/x.bin", static_cast<std::size_t>(n) * 8);
  auto ys = read_raw<std::int64_t>(dir + "/y.bin", static_cast<std::size_t>(n));
  const auto X = torch::from_blob(xs.data(), {n, 8}, torch::kFloat).clone();
  const auto Y = torch::from_blob(ys.data(), {n}, torch::kLong).clone();
  loom::optim::AdamW opt(model->parameters(), loom::optim::AdamWOptions(1e-2).weight_decay(0.01));
  rt.setup(model, opt);
  const int world = s.world_size(), per = global / world;
  std::vector<double> norms;
  for (int step = 0; step < steps; ++step) {
    opt.zero_grad();
    auto x = X.narrow(0, step * global + s.rank() * per, per);
    auto y = Y.narrow(0, step * global + s.rank() * per, per);
    auto xm = x.tensor_split(k), ym = y.tensor_split(k);
    for (int j = 0; j < k; ++j) {
      auto scope = rt.no_backward_sync(model, j + 1 < k);
      auto loss = torch::nn::functional::cross_entropy(
          rt.forward(model, xm[static_cast<std::size_t>(j)]), ym[static_cast<std::size_t>(j)]);
      rt.backward(k > 1 ? loss / k : loss, model);
    }
    if (clip > 0) norms.push_back(rt.clip_gradients(opt, clip).value());
    rt.optimizer_step(opt);
  }
  // The whole parameters: under Fsdp gathered from every rank's pieces (full_tensor()).
  std::vector<at::Tensor> whole;
  if constexpr (std::is_same_v<S, loom::Fsdp>) {
    for (const auto& t : s.full_parameters()) whole.push_back(t.reshape({-1}));
  } else {
    for (const auto& p : model->parameters()) whole.push_back(p.detach().reshape({-1}));
  }
  const auto flat = at::cat(whole).contiguous();
  const std::string name = dir + "/" + arg("tag", "loom") + "_rank" + std::to_string(s.rank());
  std::ofstream out(name + ".bin", std::ios::binary);
  out.write(reinterpret_cast<const char*>(flat.data_ptr<float>()),
            static_cast<std::streamsize>(flat.numel() * 4));
  if (clip > 0) {
    std::ofstream file(name + ".norms");
    file << std::setprecision(17);
    for (const double v : norms) file << v << "\n";
  }
  std::cout << "fsdp worker: wrote " << flat.numel() << " parameters" << std::endl;
  rt.teardown();
  return 0;
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
    if (arg("strategy", "fsdp") == "ddp") return train(loom::Ddp());
    return train(loom::Fsdp());
  } catch (const std::exception& e) {
    std::cerr << "fsdp_worker: " << e.what() << "\n";
    return 1;
  }
}
