#pragma once
// CRC-32 (IEEE 802.3, the zip checksum) and the CRCs a zip's central directory records.
//
// LibTorch's zip reader is built with miniz's CRC checks turned off (so are Python's
// torch.load reads): a flipped bit in a tensor would load as a wrong number. loom checks every
// record it reads against the CRC the writer stored (docs/checkpoints.md).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <unordered_map>

#include <loom/error.hpp>

namespace loom::checkpoint::detail {

struct Crc32Tables {
  uint32_t t[8][256];
};

constexpr Crc32Tables make_crc32_tables() {
  Crc32Tables c{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t r = i;
    for (int k = 0; k < 8; ++k) r = (r >> 1) ^ (0xEDB88320u & (0u - (r & 1u)));
    c.t[0][i] = r;
  }
  for (uint32_t i = 0; i < 256; ++i) {
    for (int s = 1; s < 8; ++s) c.t[s][i] = (c.t[s - 1][i] >> 8) ^ c.t[0][c.t[s - 1][i] & 0xffu];
  }
  return c;
}

inline constexpr Crc32Tables kCrc32 = make_crc32_tables();

/// The CRC-32 of [data, data + n) (slicing by 8, on a little-endian host), continuing `crc`.
inline uint32_t crc32(const void* data, std::size_t n, uint32_t crc = 0) {
  const auto* p = static_cast<const unsigned char*>(data);
  const auto& t = kCrc32.t;
  crc = ~crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint32_t a, b;
    std::memcpy(&a, p, 4);
    std::memcpy(&b, p + 4, 4);
    a ^= crc;
    crc = t[7][a & 0xffu] ^ t[6][(a >> 8) & 0xffu] ^ t[5][(a >> 16) & 0xffu] ^ t[4][a >> 24] ^
          t[3][b & 0xffu] ^ t[2][(b >> 8) & 0xffu] ^ t[1][(b >> 16) & 0xffu] ^ t[0][b >> 24];
  }
  for (; n > 0; --n) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xffu];
  return ~crc;
}

/// Reads `n` bytes at `offset` of the file (fewer at its end).
using RangeReader = std::function<std::string(uint64_t offset, std::size_t n)>;

/// The CRC of every record in a zip's central directory, by name without the archive's
/// "<name>/" prefix (what PyTorchStreamReader takes). Handles zip64 (files over 4 GiB).
inline std::unordered_map<std::string, uint32_t> zip_crcs(const RangeReader& read, uint64_t size,
                                                          const std::string& what) {
  auto bad = [&](const char* why) {
    return Error("loom::checkpoint: " + what + ": the zip's central directory " + why);
  };
  auto u16 = [](const std::string& s, std::size_t at) {
    return static_cast<uint32_t>(static_cast<unsigned char>(s[at])) |
           static_cast<uint32_t>(static_cast<unsigned char>(s[at + 1])) << 8;
  };
  auto u32 = [&](const std::string& s, std::size_t at) {
    return u16(s, at) | u16(s, at + 2) << 16;
  };
  auto u64 = [&](const std::string& s, std::size_t at) {
    return static_cast<uint64_t>(u32(s, at)) | static_cast<uint64_t>(u32(s, at + 4)) << 32;
  };
  // The end-of-central-directory record: the last 22 bytes, or up to 64 KiB earlier.
  const uint64_t tail_n = std::min<uint64_t>(size, 22 + 65535);
  const std::string tail = read(size - tail_n, static_cast<std::size_t>(tail_n));
  if (tail.size() != tail_n || tail_n < 22) throw bad("is missing");
  std::size_t eocd = std::string::npos;
  for (std::size_t i = tail.size() - 22 + 1; i-- > 0;) {
    if (u32(tail, i) == 0x06054b50u) {
      eocd = i;
      break;
    }
  }
  if (eocd == std::string::npos) throw bad("is missing");
  uint64_t entries = u16(tail, eocd + 10), cd_size = u32(tail, eocd + 12),
           cd_offset = u32(tail, eocd + 16);
  if (entries == 0xffffu || cd_size == 0xffffffffu || cd_offset == 0xffffffffu) {
    if (eocd < 20 || u32(tail, eocd - 20) != 0x07064b50u) throw bad("lacks its zip64 locator");
    const uint64_t z64 = u64(tail, eocd - 20 + 8);
    if (z64 > size - 56) throw bad("has a bad zip64 record offset");
    const std::string rec = read(z64, 56);
    if (rec.size() != 56 || u32(rec, 0) != 0x06064b50u) throw bad("has a bad zip64 record");
    entries = u64(rec, 32);
    cd_size = u64(rec, 40);
    cd_offset = u64(rec, 48);
  }
  if (cd_offset > size || cd_size > size - cd_offset || entries > cd_size / 46) {
    throw bad("does not fit the file");
  }
  const std::string cd = read(cd_offset, static_cast<std::size_t>(cd_size));
  if (cd.size() != cd_size) throw bad("is truncated");
  std::unordered_map<std::string, uint32_t> out;
  std::size_t at = 0;
  for (uint64_t e = 0; e < entries; ++e) {
    if (cd.size() - at < 46 || u32(cd, at) != 0x02014b50u) throw bad("has a malformed entry");
    const uint32_t crc = u32(cd, at + 16);
    const std::size_t name_n = u16(cd, at + 28), extra_n = u16(cd, at + 30),
                      comment_n = u16(cd, at + 32);
    if (cd.size() - at - 46 < name_n + extra_n + comment_n) throw bad("has a malformed entry");
    std::string name = cd.substr(at + 46, name_n);
    const auto slash = name.find('/');
    out[slash == std::string::npos ? name : name.substr(slash + 1)] = crc;
    at += 46 + name_n + extra_n + comment_n;
  }
  return out;
}

}  // namespace loom::checkpoint::detail
