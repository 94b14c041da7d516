// One save and one load of a model and its Adam state with rt.save / rt.load, timed
// (benchmarks/checkpoint/save_load_vs_python.py runs it beside Python's torch.save/load).
//
//   loom_bench_checkpoint DIR [MILLIONS=100] [LAYERS=10] [WARMUP=1] [DEVICE=cpu|cuda]
//
// The model: LAYERS square Linear layers of MILLIONS million parameters in all (f32), after
// one Adam step (exp_avg and exp_avg_sq filled): 3 x MILLIONS x 4 MB of tensors. Prints one
// line: "loom save_s=... save_nosync_s=... load_s=... async_blocked_s=... async_total_s=...
// bytes=...". save_s is the default, durable save (fsync of the file and the directory),
// save_nosync_s the same save with {.sync = false}; the load reads the file and restores the
// model and the optimizer in place. async_first_blocked_s: the time the first
// loom::Checkpoints::save(..., {.sync = false, .async = true}) of a Checkpoints keeps the
// caller (the copy of the state to fresh host memory); async_blocked_s: the same for its next
// save, durable ({.async = true}), whose copy goes to the buffers the first one left, as a
// run's saves do; async_total_s: until that save's wait() returns (written, synced). read_s: the
// floor of any copying load, the file read into fresh memory and nothing else; read_crc_s:
// the same with each piece's CRC-32 computed after it (loom's crc32, one thread).
// WARMUP untimed save/load cycles (and asynchronous saves) run first: a process's first load
// of a large file is slower (about 0.5-1 s here, in Python as in C++), and the Python side times
// warm cycles; on CUDA the first asynchronous save allocates the pinned memory that the next
// ones reuse (LibTorch's caching host allocator). DEVICE cuda: the model and the optimizer
// on the GPU (loom::Cuda), where an asynchronous save's copies run on the device's stream.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>

#include <fcntl.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <loom/checkpoint/crc32.hpp>
#include <loom/loom.hpp>
#include <loom/state/checkpoints.hpp>

/// Seconds to read the file at `path` (`bytes` long) into freshly allocated memory with
/// read(2) in 64 MiB pieces, and, with `crc`, to compute each piece's CRC-32 after it.
double read_file(const std::filesystem::path& path, std::uintmax_t bytes, bool crc) {
  const auto t0 = std::chrono::steady_clock::now();
  auto buffer = at::empty({static_cast<int64_t>(bytes)}, at::TensorOptions(at::kByte));
  auto* p = static_cast<char*>(buffer.mutable_data_ptr());
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot open " + path.string());
  std::uintmax_t at = 0;
  uint32_t sum = 0;
  while (at < bytes) {
    const auto n = ::read(fd, p + at, std::min<std::uintmax_t>(bytes - at, 64u << 20));
    if (n <= 0) break;
    if (crc) sum = loom::checkpoint::detail::crc32(p + at, static_cast<std::size_t>(n), sum);
    at += static_cast<std::uintmax_t>(n);
  }
  ::close(fd);
  if (at != bytes) throw std::runtime_error("short read of " + path.string());
  const auto t1 = std::chrono::steady_clock::now();
  if (crc && sum == 0x12345678u) std::printf("(a CRC of 12345678)\n");  // keep the sum used
  return std::chrono::duration<double>(t1 - t0).count();
}

template <class Device>
int run(const std::filesystem::path& dir, double millions, int layers, int warmup) {
  const auto width = static_cast<int64_t>(std::sqrt(millions * 1e6 / layers));
  at::manual_seed(0);
  torch::nn::Sequential model;
  for (int i = 0; i < layers; ++i) model->push_back(torch::nn::Linear(width, width));
  loom::Runtime<Device, loom::Fp32> rt;
  loom::optim::Adam opt(model->parameters(), loom::optim::AdamOptions(1e-3));
  rt.setup(model, opt);
  for (auto& p : model->parameters()) p.mutable_grad() = at::ones_like(p);
  opt.step();
  const auto file = dir / "loom_state.pt";
  loom::State state{{"model", model}, {"optimizer", opt}};
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < warmup; ++i) {
    rt.save(file, state, {.sync = false});
    rt.load(file, state);
    std::filesystem::remove(file);
    loom::Checkpoints warm(dir / "loom_async_warmup", {.keep_last = 1});
    warm.save(rt, 0, state, {.sync = false, .async = true});
    warm.wait(rt);
    std::filesystem::remove_all(dir / "loom_async_warmup");
  }
  auto seconds = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };
  // Each timed write starts with nothing dirty in the page cache (as the script's dd runs do):
  // otherwise the kernel's writeback throttling of the bytes before decides the time.
  ::sync();
  const auto t0 = Clock::now();
  rt.save(file, state, {.sync = false});
  const auto t1 = Clock::now();
  std::filesystem::remove(file);
  ::sync();
  const auto t2 = Clock::now();
  rt.save(file, state);
  const auto t3 = Clock::now();
  rt.load(file, state);
  const auto t4 = Clock::now();
  // A resume in a new process: the model exists, the optimizer has no state yet, so its state
  // goes to fresh memory.
  loom::optim::Adam fresh(model->parameters(), loom::optim::AdamOptions(1e-3));
  const auto t4a = Clock::now();
  rt.load(file, {{"model", model}, {"optimizer", fresh}});
  const auto t4b = Clock::now();
  const auto bytes = std::filesystem::file_size(file);
  // The floor of any load that copies: the file's bytes read (warm) into fresh memory, nothing
  // else; then the same with their CRC-32 computed on this thread after each piece.
  const auto read_s = read_file(file, bytes, false);
  const auto read_crc_s = read_file(file, bytes, true);
  std::filesystem::remove(file);
  // A run's asynchronous saves, through one loom::Checkpoints: the first allocates the host
  // copy's buffers (a page fault per page), the next ones copy into the buffers the last one
  // left. Timed: the first (without sync), then a later one with the default durable options.
  loom::Checkpoints ckpt(dir / "loom_async", {.keep_last = 1});
  ::sync();
  const auto t5 = Clock::now();
  ckpt.save(rt, 1, state, {.sync = false, .async = true});
  const auto t6 = Clock::now();
  ckpt.wait(rt);
  ::sync();
  const auto t7 = Clock::now();
  ckpt.save(rt, 2, state, {.async = true});
  const auto t8 = Clock::now();
  ckpt.wait(rt);
  const auto t9 = Clock::now();
  std::filesystem::remove_all(dir / "loom_async");
  std::printf(
      "loom save_s=%.4f save_nosync_s=%.4f load_s=%.4f async_first_blocked_s=%.4f "
      "async_blocked_s=%.4f async_total_s=%.4f read_s=%.4f read_crc_s=%.4f load_fresh_s=%.4f "
      "bytes=%lld params=%lld\n",
      seconds(t2, t3), seconds(t0, t1), seconds(t3, t4), seconds(t5, t6), seconds(t7, t8),
      seconds(t7, t9), read_s, read_crc_s, seconds(t4a, t4b), static_cast<long long>(bytes),
      static_cast<long long>(layers * (width * width + width)));
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: loom_bench_checkpoint DIR [MILLIONS] [LAYERS] [WARMUP] [cpu|cuda]\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  const double millions = argc > 2 ? std::stod(argv[2]) : 100;
  const int layers = argc > 3 ? std::stoi(argv[3]) : 10;
  const int warmup = argc > 4 ? std::stoi(argv[4]) : 1;
  const std::string device = argc > 5 ? argv[5] : "cpu";
  try {
    if (device == "cuda") return run<loom::Cuda>(dir, millions, layers, warmup);
    return run<loom::Cpu>(dir, millions, layers, warmup);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom_bench_checkpoint: %s\n", e.what());
    return 1;
  }
}
