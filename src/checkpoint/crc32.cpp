// loom::checkpoint::detail::crc32: the CRC-32 of every record loom writes and reads, from the
// fastest library the build found (CMakeLists.txt): libdeflate (carry-less multiplication),
// else zlib, else loom's own slicing-by-8.
#include <loom/checkpoint/crc32.hpp>

#include <algorithm>
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
