#pragma once
// A temporary file beside a checkpoint, written, synced and renamed over it, and the directory's
// sync after the rename: write_atomically, the one sequence behind every file loom writes whole
// (io.cpp's save_value, safetensors.cpp's files and index). Internal to loom's library.
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>

#include <fcntl.h>
#include <unistd.h>

#include <loom/error.hpp>

namespace loom::checkpoint::detail {

/// Closes a file descriptor and removes a temporary file unless released.
class TempFile {
 public:
  explicit TempFile(std::filesystem::path path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      throw Error("loom::checkpoint: cannot write " + path_.string() + ": " + std::strerror(errno));
    }
  }
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!kept_) {
      std::error_code ignored;
      std::filesystem::remove(path_, ignored);
    }
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  /// Writes all of [data, data + n). On an error (a full disk, ...) it remembers errno, writes
  /// nothing more, and still reports n bytes written: LibTorch's zip writer, told of a short
  /// write, throws from writeRecord, and its destructor then writes the end of the file at
  /// offsets that no longer match, throws again and terminates the process. save_value
  /// checks error() once the writer is done.
  size_t write(const void* data, size_t n) {
    if (error_ != 0) return n;
    const char* p = static_cast<const char*>(data);
    size_t left = n;
    while (left > 0) {
      const auto w = ::write(fd_, p, left);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        error_ = errno ? errno : EIO;
        return n;
      }
      p += w;
      left -= static_cast<size_t>(w);
      written_ += static_cast<uint64_t>(w);
    }
    return n;
  }
  int error() const noexcept { return error_; }
  /// Bytes written so far.
  uint64_t size() const noexcept { return written_; }
  /// Reads back up to `n` bytes written at `offset`.
  std::string read(uint64_t offset, std::size_t n) const {
    std::string out(n, '\0');
    std::size_t got = 0;
    while (got < n) {
      const auto r = ::pread(fd_, out.data() + got, n - got, static_cast<off_t>(offset + got));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        throw Error("loom::checkpoint: reading back " + path_.string() +
                    " failed: " + std::strerror(errno));
      }
      if (r == 0) break;
      got += static_cast<std::size_t>(r);
    }
    out.resize(got);
    return out;
  }
  /// Rewrites 4 bytes (little-endian) at `offset`.
  void put(uint64_t offset, uint32_t value) {
    char b[4];
    std::memcpy(b, &value, 4);
    if (::pwrite(fd_, b, 4, static_cast<off_t>(offset)) != 4) {
      throw Error("loom::checkpoint: writing " + path_.string() +
                  " failed: " + std::strerror(errno ? errno : EIO));
    }
  }
  /// fsync (when `sync`) and close; then the caller renames it and calls keep().
  void close(bool sync) {
    if (sync && ::fsync(fd_) != 0) {
      throw Error("loom::checkpoint: fsync of " + path_.string() +
                  " failed: " + std::strerror(errno));
    }
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) {
      throw Error("loom::checkpoint: closing " + path_.string() +
                  " failed: " + std::strerror(errno));
    }
  }
  void keep() noexcept { kept_ = true; }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  int error_ = 0;
  uint64_t written_ = 0;
  bool kept_ = false;
};

inline void sync_directory(const std::filesystem::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // not every filesystem lets a directory be opened; the rename stands
  ::fsync(fd);
  ::close(fd);
}

/// Writes `path` whole or not at all: `fill(TempFile&)` writes a temporary file beside it
/// (".NAME.tmp.PID"); a write error it left (a full disk, ...) throws, naming `path`; the file
/// is synced when `sync`, closed and renamed over `path`, and the directory synced after the
/// rename. On any error the temporary file is removed and `path` is as it was. `who` starts
/// the messages ("loom::checkpoint", "loom::safetensors").
template <class Fill>
void write_atomically(const std::filesystem::path& path, const std::string& who, Fill&& fill,
                      bool sync) {
  const auto dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  std::string name = ".";  // appended piece by piece: GCC 12 -O3 misreads "." + string (-Wrestrict)
  name += path.filename().string();
  name += ".tmp.";
  name += std::to_string(::getpid());
  const auto tmp = dir / name;
  TempFile file(tmp);
  std::forward<Fill>(fill)(file);
  if (file.error() != 0) {
    throw Error(who + ": writing " + path.string() + " failed: " + std::strerror(file.error()));
  }
  file.close(sync);
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    throw Error(who + ": cannot rename " + tmp.string() + " to " + path.string() + ": " +
                ec.message());
  }
  file.keep();
  if (sync) sync_directory(dir);
}

}  // namespace loom::checkpoint::detail
