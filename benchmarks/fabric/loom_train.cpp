// loom's side of the Fabric comparison (fabric_vs_loom.py): trains the MLP whose initial
// weights and batches the python side wrote as raw little-endian files, with the same loop as
// the Fabric side, and writes the final parameters next to them.
//
//   loom_fabric_train --dir D --sizes 32,64,64,10 --batch 32 --batches 8 --precision 32-true
//                     --steps 500 --warmup 20 --reps 3 --threads 2 [--device cpu|cuda]
//                     [--optimizer libtorch-sgd|sgd|adam]  (LibTorch SGD, or loom::optim fused)
//                     [--graph 1]  (the step through loom::cuda::GraphedStep: one CUDA graph on
//                                   CUDA, eager over static buffers on the CPU; fused only)
//
// Reads D/init_<i>.bin (f32, the i-th parameter in nn.Sequential order), D/x.bin
// (batches, batch, in) f32 and D/y.bin (batches, batch) i64; writes D/loom_final_<i>.bin (f32).
// Each rep trains from the initial weights: warmup steps, then `steps` timed steps.
// Prints one JSON object: steps/s of every rep and of the best one.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include <torch/cuda.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <loom/cuda/graphed_step.hpp>
#include <loom/loom.hpp>

namespace {

struct Options {
  std::string dir, precision = "32-true", device = "cpu";
  std::string optimizer = "libtorch-sgd";  // or loom's fused "sgd", "adam"
  std::vector<int64_t> sizes;
  int64_t batch = 32, batches = 8;
  int steps = 100, warmup = 10, reps = 3, threads = 2;
  bool graph = false;
};

at::Tensor read_bin(const std::string& path, at::IntArrayRef shape, at::ScalarType dtype) {
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(dtype));
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) throw std::runtime_error("cannot open " + path);
  const auto bytes = static_cast<std::streamsize>(t.nbytes());
  if (f.tellg() != bytes) throw std::runtime_error(path + ": wrong size");
  f.seekg(0);
  f.read(static_cast<char*>(t.data_ptr()), bytes);
  return t;
}

void write_bin(const std::string& path, const at::Tensor& t) {
  at::Tensor c = t.detach().to(at::kCPU, at::kFloat).contiguous();
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
}

torch::nn::Sequential make_model(const Options& o) {
  torch::nn::Sequential model;
  for (size_t i = 0; i + 1 < o.sizes.size(); ++i) {
    model->push_back(torch::nn::Linear(o.sizes[i], o.sizes[i + 1]));
    if (i + 2 < o.sizes.size()) model->push_back(torch::nn::ReLU());
  }
  torch::NoGradGuard no_grad;
  int i = 0;
  for (auto& p : model->parameters()) {
    p.copy_(read_bin(o.dir + "/init_" + std::to_string(i++) + ".bin", p.sizes(), at::kFloat));
  }
  return model;
}

// The optimizer of --optimizer: LibTorch's SGD (part 3 of docs/benchmarks.md), or loom's fused
// SGD or Adam with the hyperparameters of the python side (optim_vs_fabric.py).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const Options& o,
                                                        std::vector<at::Tensor> params) {
  if (o.optimizer == "libtorch-sgd") {
    return std::make_unique<torch::optim::SGD>(params,
                                               torch::optim::SGDOptions(0.01).momentum(0.9));
  }
  if (o.optimizer == "sgd") {
    return std::make_unique<loom::optim::SGD>(params, loom::optim::SGDOptions(0.01).momentum(0.9));
  }
  if (o.optimizer == "adam") {
    return std::make_unique<loom::optim::Adam>(params, loom::optim::AdamOptions(1e-3));
  }
  throw std::invalid_argument("--optimizer: libtorch-sgd, sgd or adam, not " + o.optimizer);
}

template <class Device, class P>
std::vector<double> train(const Options& o, Device device, P policy) {
  const auto x_all = read_bin(o.dir + "/x.bin", {o.batches, o.batch, o.sizes.front()}, at::kFloat);
  const auto y_all = read_bin(o.dir + "/y.bin", {o.batches, o.batch}, at::kLong);
  std::vector<at::Tensor> xs, ys;  // (B, in) f32, (B,) i64, on the host like the python side
  for (int64_t i = 0; i < o.batches; ++i) {
    xs.push_back(x_all[i].clone());
    ys.push_back(y_all[i].clone());
  }
  std::vector<double> rates;
  torch::nn::Sequential model{nullptr};
  for (int rep = 0; rep < o.reps; ++rep) {
    loom::Runtime<Device, P> rt(device, policy);
    model = make_model(o);
    auto opt_ptr = make_optimizer(o, model->parameters());
    auto& opt = *opt_ptr;
    rt.setup(model, opt);
    std::function<void(int)> step;
    std::unique_ptr<loom::cuda::GraphedStep> graphed;
    if (o.graph) {  // static buffers on the device; each batch copied in, then the step
      graphed = std::make_unique<loom::cuda::GraphedStep>(
          rt.strategy().world_size(),
          std::vector<at::Tensor>{rt.to_device(xs[0]).clone(), rt.to_device(ys[0]).clone()},
          std::vector<loom::OptimizerRef>{opt}, [&](const std::vector<at::Tensor>& in) {
            auto loss = torch::nn::functional::cross_entropy(rt.forward(model, in[0]), in[1]);
            rt.backward(loss, model);
            rt.optimizer_step(opt);
            return loss.detach();
          });
      step = [&](int i) { (*graphed)({xs[i % o.batches], ys[i % o.batches]}); };
    } else {
      step = [&](int i) {
        auto [x, y] = rt.to_device(std::make_tuple(xs[i % o.batches], ys[i % o.batches]));
        auto out = rt.forward(model, x);  // (B, classes)
        auto loss = torch::nn::functional::cross_entropy(out, y);
        rt.backward(loss, model);
        rt.optimizer_step(opt);
        opt.zero_grad();
      };
    }
    int i = 0;
    for (; i < o.warmup; ++i) step(i);
    if (o.device == "cuda") torch::cuda::synchronize();
    auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < o.steps; ++k, ++i) step(i);
    if (o.device == "cuda") torch::cuda::synchronize();
    rates.push_back(o.steps /
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  int i = 0;
  for (auto& p : model->parameters())
    write_bin(o.dir + "/loom_final_" + std::to_string(i++) + ".bin", p);
  return rates;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Options o;
    for (int i = 1; i + 1 < argc; i += 2) {
      std::string_view a = argv[i];
      std::string v = argv[i + 1];
      if (a == "--dir")
        o.dir = v;
      else if (a == "--precision")
        o.precision = v;
      else if (a == "--device")
        o.device = v;
      else if (a == "--optimizer")
        o.optimizer = v;
      else if (a == "--batch")
        o.batch = std::stoll(v);
      else if (a == "--batches")
        o.batches = std::stoll(v);
      else if (a == "--steps")
        o.steps = std::stoi(v);
      else if (a == "--warmup")
        o.warmup = std::stoi(v);
      else if (a == "--reps")
        o.reps = std::stoi(v);
      else if (a == "--threads")
        o.threads = std::stoi(v);
      else if (a == "--graph")
        o.graph = v == "1";
      else if (a == "--sizes") {
        std::stringstream ss(v);
        for (std::string s; std::getline(ss, s, ',');) o.sizes.push_back(std::stoll(s));
      } else {
        throw std::invalid_argument("unknown argument " + std::string(a));
      }
    }
    if (o.dir.empty() || o.sizes.size() < 2)
      throw std::invalid_argument("--dir and --sizes are required");
    at::set_num_threads(o.threads);
    auto rates = loom::with_precision(o.precision, [&](auto policy) {
      if (o.device == "cuda") return train(o, loom::Cuda(), policy);
      return train(o, loom::Cpu(), policy);
    });
    double best = 0;
    std::string list;
    for (double r : rates) {
      best = std::max(best, r);
      list += (list.empty() ? "" : ", ") + std::to_string(r);
    }
    std::printf(
        "{\"impl\": \"loom\", \"precision\": \"%s\", \"device\": \"%s\", \"threads\": %d, "
        "\"steps_per_s\": [%s], \"best_steps_per_s\": %.3f}\n",
        o.precision.c_str(), o.device.c_str(), o.threads, list.c_str(), best);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom_fabric_train: %s\n", e.what());
    return 1;
  }
}
