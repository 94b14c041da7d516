// loom::checkpoint::detail::crc32: the CRC-32 of every record loom writes and reads, from the
// fastest library the build found (CMakeLists.txt): libdeflate (carry-less multiplication),
// else zlib, else loom's own slicing-by-8.
#include <loom/checkpoint/crc32.hpp>

#include <algorithm>
#include <array>
#include <climits>

#if defined(LOOM_CRC32_LIBDEFLATE)
#include <libdeflate.h>
#elif defined(LOOM_CRC32_ZLIB)
#include <zlib.h>
#endif

namespace loom::checkpoint::detail {

uint32_t crc32(const void* data, std::size_t n, uint32_t crc) {
#if defined(LOOM_CRC32_LIBDEFLATE)
  return libdeflate_crc32(crc, data, n);
#elif defined(LOOM_CRC32_ZLIB)
  // zlib takes uInt lengths: 1 GiB pieces.
  const auto* p = static_cast<const unsigned char*>(data);
  uLong c = crc;
  while (n > 0) {
    const std::size_t piece = std::min<std::size_t>(n, std::size_t{1} << 30);
    c = ::crc32(c, p, static_cast<uInt>(piece));
    p += piece;
    n -= piece;
  }
  return static_cast<uint32_t>(c);
#else
  return crc32_portable(data, n, crc);
#endif
}

namespace {

// a(x) * b(x) modulo the CRC-32 polynomial, bits reflected as the CRC keeps them (bit 31 is
// x^0).
constexpr uint32_t multiply_mod_p(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1u) ? (b >> 1) ^ 0xEDB88320u : b >> 1;
  }
  return p;
}

// x^(2^k) modulo the polynomial, k = 0 .. 66 (a shift by n < 2^64 bytes is n * 8 bits).
constexpr std::array<uint32_t, 67> make_powers() {
  std::array<uint32_t, 67> t{};
  uint32_t p = 1u << 30;  // x^1
  for (auto& e : t) {
    e = p;
    p = multiply_mod_p(p, p);
  }
  return t;
}

constexpr auto powers = make_powers();

}  // namespace

uint32_t crc32_combine(uint32_t crc_a, uint32_t crc_b, std::size_t n_b) {
  // crc(A B) = crc(A) * x^(8 n_b) + crc(B) (mod the polynomial).
  uint32_t shift = 1u << 31;  // x^0
  for (std::size_t k = 3; n_b != 0; n_b >>= 1, ++k) {
    if (n_b & 1u) shift = multiply_mod_p(powers[k], shift);
  }
  return multiply_mod_p(shift, crc_a) ^ crc_b;
}

const char* crc32_implementation() {
#if defined(LOOM_CRC32_LIBDEFLATE)
  return "libdeflate " LIBDEFLATE_VERSION_STRING;
#elif defined(LOOM_CRC32_ZLIB)
  static const std::string name = std::string("zlib ") + zlibVersion();
  return name.c_str();
#else
  return "loom slicing-by-8";
#endif
}

}  // namespace loom::checkpoint::detail
