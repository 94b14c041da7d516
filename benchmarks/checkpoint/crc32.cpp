// CRC-32 throughput: loom's crc32 (checkpoint/crc32.hpp: what rt.save and rt.load compute
// every record's CRC with; libdeflate where the build found it) and loom's own slicing-by-8
// (crc32_portable, the fallback) against zlib's crc32 and, where it is installed, libdeflate's
// libdeflate_crc32 (carry-less multiplication) called directly, on the same buffer.
//
//   loom_bench_crc32 [MB=400] [REPS=5]
//
// Each is timed in the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID: a busy machine
// does not inflate it), the best of REPS; prints one line per implementation, "NAME GB/s
// seconds crc", and exits 1 if the CRCs differ.
#include <time.h>
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#ifdef LOOM_BENCH_LIBDEFLATE
#include <libdeflate.h>
#endif

#include <loom/checkpoint/crc32.hpp>

namespace {

double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

template <class F>
std::pair<double, std::uint32_t> best_of(int reps, F&& f) {
  double best = 1e30;
  std::uint32_t crc = 0;
  for (int i = 0; i < reps; ++i) {
    const double t0 = cpu_seconds();
    crc = f();
    best = std::min(best, cpu_seconds() - t0);
  }
  return {best, crc};
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t mb = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 400;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 5;
  std::vector<unsigned char> buf(mb << 20);
  std::uint64_t x = 88172645463325252ull;  // xorshift: incompressible, not all zeros
  for (auto& b : buf) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<unsigned char>(x);
  }
  struct Row {
    std::string name;
    double seconds;
    std::uint32_t crc;
  };
  std::vector<Row> rows;
  auto [t_port, c_port] = best_of(
      reps, [&] { return loom::checkpoint::detail::crc32_portable(buf.data(), buf.size()); });
  rows.push_back({"loom_slicing_by_8", t_port, c_port});
  auto [t_loom, c_loom] =
      best_of(reps, [&] { return loom::checkpoint::detail::crc32(buf.data(), buf.size()); });
  std::string loom_name =
      std::string("loom_crc32 (") + loom::checkpoint::detail::crc32_implementation() + ")";
  for (auto& ch : loom_name) ch = ch == ' ' ? '_' : ch;
  rows.push_back({loom_name, t_loom, c_loom});
  auto [t_zlib, c_zlib] = best_of(reps, [&] {
    // zlib takes uInt lengths: 1 GiB pieces.
    uLong c = crc32(0L, Z_NULL, 0);
    for (std::size_t at = 0; at < buf.size(); at += std::size_t{1} << 30) {
      const auto n = std::min<std::size_t>(buf.size() - at, std::size_t{1} << 30);
      c = crc32(c, buf.data() + at, static_cast<uInt>(n));
    }
    return static_cast<std::uint32_t>(c);
  });
  rows.push_back({std::string("zlib_") + zlibVersion(), t_zlib, c_zlib});
#ifdef LOOM_BENCH_LIBDEFLATE
  auto [t_ld, c_ld] = best_of(reps, [&] {
    return static_cast<std::uint32_t>(libdeflate_crc32(0, buf.data(), buf.size()));
  });
  rows.push_back({"libdeflate_" LIBDEFLATE_VERSION_STRING, t_ld, c_ld});
#endif
  bool same = true;
  for (const auto& r : rows) {
    std::printf("%-32s %7.2f GB/s %8.4f s crc %08x\n", r.name.c_str(),
                static_cast<double>(buf.size()) / r.seconds / 1e9, r.seconds, r.crc);
    same = same && r.crc == rows[0].crc;
  }
  if (!same) std::printf("the CRCs differ\n");
  return same ? 0 : 1;
}
