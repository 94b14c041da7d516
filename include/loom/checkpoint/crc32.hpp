#pragma once
// CRC-32 (IEEE 802.3, the zip checksum) and the CRCs a zip's central directory records.
//
// LibTorch's zip reader is built with miniz's CRC checks turned off (so are Python's
// torch.load reads): a flipped bit in a tensor would load as a wrong number. loom checks every
// record it reads against the CRC the writer stored, and computes the CRCs it writes itself
// (docs/checkpoints.md).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

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

/// The CRC-32 of [data, data + n) (slicing by 8, on a little-endian host), continuing `crc`:
/// loom's own, what crc32() falls back to where neither libdeflate nor zlib was found.
inline uint32_t crc32_portable(const void* data, std::size_t n, uint32_t crc = 0) {
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

/// The CRC-32 of [data, data + n), continuing `crc` (src/checkpoint/crc32.cpp): libdeflate's
/// libdeflate_crc32 (carry-less multiplication) where loom was built with it, else zlib's crc32,
/// else crc32_portable.
uint32_t crc32(const void* data, std::size_t n, uint32_t crc = 0);

/// The CRC-32 of A followed by B, from crc32(A), crc32(B) and B's length in bytes (what zlib's
/// crc32_combine gives): pieces of one record checked on different threads make its CRC.
uint32_t crc32_combine(uint32_t crc_a, uint32_t crc_b, std::size_t n_b);

/// Records of this many bytes or more have their CRC-32 checked aside (on a second thread, or
/// as they are copied: checkpoint/mapped.hpp); smaller ones at once.
inline constexpr std::size_t check_aside_bytes = std::size_t{1} << 20;

/// The error for record `name` of `what` whose bytes do not match the CRC-32 written with it;
/// `note` ends the message.
inline CheckpointUnreadable corrupted_record(const std::string& what, const std::string& name,
                                             const std::string& note = {}) {
  return CheckpointUnreadable("loom::checkpoint: " + what + ": the record " + name +
                              " is corrupted (its CRC-32 does not match the one written with it)" +
                              note);
}

/// Which implementation crc32() is: "libdeflate 1.14", "zlib 1.2.13" or "loom slicing-by-8".
const char* crc32_implementation();

/// Reads `n` bytes at `offset` of the file (fewer at its end).
using RangeReader = std::function<std::string(uint64_t offset, std::size_t n)>;

/// The little-endian integers of a zip's headers, at byte `at` of `s`.
inline uint32_t u16(const std::string& s, std::size_t at) {
  return static_cast<uint32_t>(static_cast<unsigned char>(s[at])) |
         static_cast<uint32_t>(static_cast<unsigned char>(s[at + 1])) << 8;
}
inline uint32_t u32(const std::string& s, std::size_t at) {
  return u16(s, at) | u16(s, at + 2) << 16;
}
inline uint64_t u64(const std::string& s, std::size_t at) {
  return static_cast<uint64_t>(u32(s, at)) | static_cast<uint64_t>(u32(s, at + 4)) << 32;
}

/// One record of a zip, as its central directory describes it.
struct ZipEntry {
  std::string name;     ///< without the archive's "<name>/" prefix (what PyTorchStreamReader takes)
  uint32_t crc = 0;     ///< the CRC-32 the directory records (0: none, or an empty record)
  uint16_t flags = 0;   ///< general purpose flags; bit 3: sizes and CRC in a data descriptor
  uint16_t method = 0;  ///< compression method: 0 stored (torch.save's), 8 deflated
  uint64_t size = 0;    ///< stored (compressed) size
  uint64_t local_at = 0;  ///< offset of the record's local header
  uint64_t entry_at = 0;  ///< offset of its central directory entry
};

/// The records of a zip's central directory, in its order. Handles zip64 (files over 4 GiB).
inline std::vector<ZipEntry> zip_entries(const RangeReader& read, uint64_t size,
                                         const std::string& what) {
  auto bad = [&](const char* why) {
    return Error("loom::checkpoint: " + what + ": the zip's central directory " + why);
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
  std::vector<ZipEntry> out;
  out.reserve(static_cast<std::size_t>(entries));
  std::size_t at = 0;
  for (uint64_t e = 0; e < entries; ++e) {
    if (cd.size() - at < 46 || u32(cd, at) != 0x02014b50u) throw bad("has a malformed entry");
    const std::size_t name_n = u16(cd, at + 28), extra_n = u16(cd, at + 30),
                      comment_n = u16(cd, at + 32);
    if (cd.size() - at - 46 < name_n + extra_n + comment_n) throw bad("has a malformed entry");
    ZipEntry entry;
    entry.crc = u32(cd, at + 16);
    entry.flags = static_cast<uint16_t>(u16(cd, at + 8));
    entry.method = static_cast<uint16_t>(u16(cd, at + 10));
    entry.size = u32(cd, at + 20);
    entry.local_at = u32(cd, at + 42);
    entry.entry_at = cd_offset + at;
    // zip64's extended information (id 1) holds, in this order, the sizes and the offset that
    // the entry marks 0xffffffff.
    const bool usize64 = u32(cd, at + 24) == 0xffffffffu, csize64 = entry.size == 0xffffffffu,
               local64 = entry.local_at == 0xffffffffu;
    for (std::size_t x = at + 46 + name_n, end = x + extra_n; x + 4 <= end;) {
      const std::size_t id = u16(cd, x), n = u16(cd, x + 2);
      if (x + 4 + n > end) throw bad("has a malformed extra field");
      if (id == 1) {
        std::size_t f = x + 4;
        auto next = [&] {
          if (f + 8 > x + 4 + n) throw bad("has a short zip64 extra field");
          f += 8;
          return u64(cd, f - 8);
        };
        if (usize64) next();
        if (csize64) entry.size = next();
        if (local64) entry.local_at = next();
      }
      x += 4 + n;
    }
    std::string name = cd.substr(at + 46, name_n);
    const auto slash = name.find('/');
    entry.name = slash == std::string::npos ? name : name.substr(slash + 1);
    out.push_back(std::move(entry));
    at += 46 + name_n + extra_n + comment_n;
  }
  return out;
}

/// The CRC of every record in a zip's central directory, by name without the archive's
/// "<name>/" prefix (what PyTorchStreamReader takes).
inline std::unordered_map<std::string, uint32_t> zip_crcs(const RangeReader& read, uint64_t size,
                                                          const std::string& what) {
  std::unordered_map<std::string, uint32_t> out;
  for (auto& e : zip_entries(read, size, what)) out[std::move(e.name)] = e.crc;
  return out;
}

/// Writes 4 bytes, little-endian, at an offset of what was already written.
using Patcher = std::function<void(uint64_t offset, uint32_t value)>;

/// Puts the CRC-32 of every record of a zip written without them (LibTorch's writer with
/// compute_crc32 off leaves 0s) where readers look: the central directory entry, and the data
/// descriptor after the record (flag bit 3, LibTorch's writer's layout) or else its local
/// header. `known` gives the CRCs of records already computed, by name; the others (the
/// writer's own small records) are read back.
inline void put_zip_crcs(const RangeReader& read, const Patcher& put, uint64_t size,
                         const std::unordered_map<std::string, uint32_t>& known,
                         const std::string& what) {
  auto bad = [&](const ZipEntry& e, const char* why) {
    return Error("loom::checkpoint: writing " + what + ": the record " + e.name + " " + why);
  };
  for (const auto& e : zip_entries(read, size, what)) {
    const std::string local = read(e.local_at, 30);
    if (local.size() != 30 || u32(local, 0) != 0x04034b50u) {
      throw bad(e, "has no local header where the central directory says");
    }
    const uint64_t data_at = e.local_at + 30 + u16(local, 26) + u16(local, 28);
    if (data_at > size || e.size > size - data_at) throw bad(e, "does not fit the file");
    uint32_t crc;
    if (auto it = known.find(e.name); it != known.end()) {
      crc = it->second;
    } else {
      const std::string bytes = read(data_at, static_cast<std::size_t>(e.size));
      if (bytes.size() != e.size) throw bad(e, "is truncated");
      crc = crc32(bytes.data(), bytes.size());
    }
    put(e.entry_at + 16, crc);
    if (e.flags & 8u) {
      const uint64_t desc_at = data_at + e.size;
      const std::string sig = read(desc_at, 4);
      if (sig.size() != 4) throw bad(e, "lacks its data descriptor");
      put(u32(sig, 0) == 0x08074b50u ? desc_at + 4 : desc_at, crc);
    } else {
      put(e.local_at + 14, crc);
    }
  }
}

}  // namespace loom::checkpoint::detail
