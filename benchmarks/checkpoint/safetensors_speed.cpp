// safetensors files written and read by loom::safetensors against the machine's own floor:
// `dd` writing the same number of bytes (conv=fsync, as loom's save syncs) and a warm `cat` of
// the file (the page cache holding it, as loom's load then reads it).
//
//   loom_bench_safetensors [--mib 1024] [--tensors 16] [--rounds 3] [--dir DIR]
//
// The tensors: --tensors f32 tensors of --mib MiB in all (`layer_K_weight`). Timed, the best of
// --rounds, one after the other in one process:
//   save       loom::safetensors::save (header, data, fsync, rename, directory fsync)
//   dd         dd if=/dev/zero of=FILE bs=1M count=MIB conv=fsync (a shell's process: its
//              start-up, some milliseconds, is in it)
//   load       loom::safetensors::load: the header parsed and checked, every tensor a view of
//              the mapped file (no byte of data read yet)
//   load+read  load, then every byte of every tensor read once (a sum over int64 words): what
//              any use of the weights costs at least
//   load_into  load_into a module whose parameters already have their memory (the copy a
//              fine-tuning program makes)
//   cat        cat FILE > /dev/null, the page cache warm
// Prints one line per measure and the ratios the targets name: save >= 0.7x dd's speed, load
// (read) >= 0.7x a warm cat's.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <loom/checkpoint/safetensors.hpp>

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double run_shell(const std::string& command) {
  const auto t0 = Clock::now();
  if (std::system(command.c_str()) != 0) {
    std::fprintf(stderr, "failed: %s\n", command.c_str());
    std::exit(1);
  }
  return seconds_since(t0);
}

/// A module holding `tensors`' shapes as parameters (zeroed: their memory touched).
struct Holder : torch::nn::Module {
  explicit Holder(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
    for (const auto& [name, t] : tensors) register_parameter(name, at::zeros_like(t));
  }
};

}  // namespace

int main(int argc, char** argv) {
  int64_t mib = 1024, count = 16, rounds = 3;
  std::filesystem::path dir = std::filesystem::temp_directory_path();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--mib") {
      mib = std::stoll(value);
    } else if (key == "--tensors") {
      count = std::stoll(value);
    } else if (key == "--rounds") {
      rounds = std::stoll(value);
    } else if (key == "--dir") {
      dir = value;
    } else {
      std::fprintf(stderr, "unknown option %s\n", key.c_str());
      return 2;
    }
  }
  const auto file = dir / "loom_bench.safetensors";
  const auto raw = dir / "loom_bench.dd";
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  const int64_t each = mib * (int64_t{1} << 20) / 4 / count;
  for (int64_t k = 0; k < count; ++k) {
    tensors.emplace_back("layer_" + std::to_string(k) + "_weight", at::randn({each}));
  }
  const double bytes = static_cast<double>(mib) * (1 << 20);
  double save = 1e30, dd = 1e30, load = 1e30, read = 1e30, into = 1e30, cat = 1e30;
  Holder holder(tensors);
  for (int64_t r = 0; r < rounds; ++r) {
    auto t0 = Clock::now();
    loom::safetensors::save(file, tensors);
    save = std::min(save, seconds_since(t0));
    dd = std::min(dd, run_shell("dd if=/dev/zero of=" + raw.string() +
                                " bs=1M count=" + std::to_string(mib) + " conv=fsync status=none"));
    cat = std::min(cat, run_shell("cat " + file.string() + " > /dev/null"));
    t0 = Clock::now();
    { const auto loaded = loom::safetensors::load(file); }
    load = std::min(load, seconds_since(t0));
    t0 = Clock::now();
    {
      const auto loaded = loom::safetensors::load(file);
      int64_t sum = 0;
      for (const auto& [name, t] : loaded.tensors) {
        const auto* p = static_cast<const int64_t*>(t.const_data_ptr());
        const auto n = static_cast<std::size_t>(t.nbytes()) / 8;
        for (std::size_t k = 0; k < n; ++k) sum += p[k];
      }
      if (sum == 42) std::printf(" ");  // keeps the reads
    }
    read = std::min(read, seconds_since(t0));
    t0 = Clock::now();
    (void)loom::safetensors::load_into(holder, file);  // strict: every name copied
    into = std::min(into, seconds_since(t0));
  }
  auto line = [&](const char* what, double s) {
    std::printf("%-10s %7.3f s  %6.2f GiB/s\n", what, s, bytes / s / (1 << 30));
  };
  std::printf("%lld MiB in %lld tensors, best of %lld rounds\n", static_cast<long long>(mib),
              static_cast<long long>(count), static_cast<long long>(rounds));
  line("save", save);
  line("dd", dd);
  line("load", load);
  line("load+read", read);
  line("load_into", into);
  line("cat", cat);
  std::printf(
      "save / dd speed: %.2fx (target >= 0.7x); load+read / warm cat speed: %.2fx; "
      "load_into / warm cat speed: %.2fx (target >= 0.7x)\n",
      dd / save, cat / read, cat / into);
  std::filesystem::remove(file);
  std::filesystem::remove(raw);
  return 0;
}
