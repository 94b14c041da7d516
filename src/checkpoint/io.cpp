// loom::checkpoint::save_value, save_bytes, load_value, load_bytes and TorchFile
// (include/loom/checkpoint/io.hpp).
#include <loom/checkpoint/io.hpp>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <caffe2/serialize/inline_container.h>

#include <loom/checkpoint/checkpoint_io.hpp>
#include <loom/checkpoint/crc32.hpp>
#include <loom/checkpoint/dcp.hpp>
#include <loom/checkpoint/mapped.hpp>
#include <loom/checkpoint/pickle.hpp>
#include <loom/error.hpp>

#include "temp_file.hpp"

namespace loom::checkpoint {

namespace detail {
namespace {

std::string first_line(const char* what) {
  std::string s(what);
  const auto nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
}

/// The first line of a LibTorch error's message, from what_without_backtrace(): what()
/// symbolizes a stack trace, a cost otherwise paid on every refused file.
std::string first_line(const c10::Error& e) { return first_line(e.what_without_backtrace()); }

/// Checks records against their CRC-32s. A record of check_aside_bytes or more is checked on a
/// second thread while the next one is read; finish() waits for those checks and throws for
/// the first mismatch, so no value is returned before all of its bytes are checked.
class CrcChecks {
 public:
  explicit CrcChecks(const std::string& what) : what_(what) {}
  ~CrcChecks() { join(/*drop=*/true); }
  CrcChecks(const CrcChecks&) = delete;
  CrcChecks& operator=(const CrcChecks&) = delete;

  /// Checks `bytes` (kept alive until checked) of record `name` against `expected` (0: none
  /// recorded, or an empty record).
  void check(const std::string& name, const at::Tensor& bytes, uint32_t expected) {
    if (expected == 0) return;
    const auto n = static_cast<std::size_t>(bytes.nbytes());
    if (n >= check_aside_bytes && start_worker()) {
      std::lock_guard<std::mutex> lock(mutex_);
      jobs_.push_back(Job{name, bytes, expected});
      ready_.notify_one();
      return;
    }
    if (crc32(bytes.const_data_ptr(), n) != expected) fail(name);
  }
  void check(const std::string& name, const void* data, std::size_t n, uint32_t expected) {
    if (expected != 0 && crc32(data, n) != expected) fail(name);
  }
  /// Waits for the deferred checks; loom::Error naming the first record that failed.
  void finish() {
    join(/*drop=*/false);
    if (!failed_.empty()) fail(failed_);
  }

 private:
  struct Job {
    std::string name;
    at::Tensor bytes;
    uint32_t expected;
  };

  [[noreturn]] void fail(const std::string& name) const { throw corrupted_record(what_, name); }
  bool start_worker() {
    if (worker_.joinable()) return true;
    if (std::thread::hardware_concurrency() < 2) return false;
    try {
      worker_ = std::thread([this] { run(); });
    } catch (const std::system_error&) {
      return false;  // no thread: check on this one
    }
    return true;
  }
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      ready_.wait(lock, [&] { return !jobs_.empty() || closed_; });
      if (jobs_.empty() || drop_) return;
      Job job = std::move(jobs_.front());
      jobs_.pop_front();
      if (!failed_.empty()) continue;  // one mismatch is reported; the rest need no checking
      lock.unlock();
      const bool ok = crc32(job.bytes.const_data_ptr(),
                            static_cast<std::size_t>(job.bytes.nbytes())) == job.expected;
      lock.lock();
      if (!ok && failed_.empty()) failed_ = job.name;
    }
  }
  void join(bool drop) {
    if (!worker_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closed_ = true;
      drop_ = drop;
      ready_.notify_one();
    }
    worker_.join();
  }

  std::string what_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Job> jobs_;
  std::string failed_;
  bool closed_ = false;
  bool drop_ = false;
  std::thread worker_;
};

/// Writes `value`'s records through `writer` (made with compute_crc32 off: miniz's CRC-32 is
/// several times slower than crc32()) and returns the CRC-32 of each record it wrote, by name,
/// for put_zip_crcs. The storages' CRCs are computed on a second thread while the writer
/// writes them (on this one where there is no second core).
std::unordered_map<std::string, uint32_t> write_records(
    caffe2::serialize::PyTorchStreamWriter& writer, const c10::IValue& value) {
  PickleWriter pickler;
  const std::string pkl = pickler.pickle(value);
  const auto& storages = pickler.storages();
  std::vector<uint32_t> storage_crcs(storages.size());
  auto compute = [&] {
    for (std::size_t i = 0; i < storages.size(); ++i) {
      storage_crcs[i] = crc32(storages[i].bytes.const_data_ptr(),
                              static_cast<std::size_t>(storages[i].bytes.nbytes()));
    }
  };
  int64_t total = 0;
  for (const auto& st : storages) total += st.bytes.nbytes();
  std::jthread worker;  // joined before the storages go (declared after the pickler)
  if (total >= static_cast<int64_t>(check_aside_bytes) &&
      std::thread::hardware_concurrency() >= 2) {
    try {
      worker = std::jthread(compute);
    } catch (const std::system_error&) {
    }
  }
  if (!worker.joinable()) compute();
  std::unordered_map<std::string, uint32_t> crcs;
  auto record = [&](const std::string& name, const void* data, std::size_t n) {
    writer.writeRecord(name, data, n);
    crcs[name] = crc32(data, n);
  };
  record("data.pkl", pkl.data(), pkl.size());
  record(".format_version", "1", 1);
  record(".storage_alignment", "64", 2);
  record("byteorder", "little", 6);
  for (const auto& st : storages) {
    writer.writeRecord("data/" + st.key, st.bytes.const_data_ptr(), st.bytes.nbytes());
  }
  writer.writeEndOfFile();
  if (worker.joinable()) worker.join();
  for (std::size_t i = 0; i < storages.size(); ++i) {
    crcs["data/" + storages[i].key] = storage_crcs[i];
  }
  return crcs;
}

/// Where the storages of a mapped read come from: the file's mapping and its central directory.
struct MappedRecords {
  const MappedFile& file;
  std::unordered_map<std::string, ZipEntry> entries;  ///< by name, as zip_crcs names them
};

/// The bytes of a stored (uncompressed) record of a mapped file, a view of the mapping; an
/// undefined tensor for a compressed one (read through LibTorch's reader instead).
at::Tensor mapped_record(const MappedRecords& m, const std::string& name, int64_t nbytes,
                         const std::string& what) {
  const auto it = m.entries.find(name);
  if (it == m.entries.end() || it->second.method != 0) return {};
  const ZipEntry& e = it->second;
  const std::size_t size = m.file.size();
  if (e.local_at > size || size - e.local_at < 30 ||
      std::memcmp(m.file.data() + e.local_at, "PK\x03\x04", 4) != 0) {
    throw Error("loom::checkpoint: " + what + ": the record " + name +
                " has no local header where the central directory says (truncated or "
                "corrupted)");
  }
  const std::string local(m.file.data() + e.local_at, 30);
  const uint64_t data_at = e.local_at + 30 + u16(local, 26) + u16(local, 28);
  return m.file.bytes(static_cast<std::size_t>(data_at), static_cast<std::size_t>(nbytes), what);
}

/// Reads the value of a torch.save file of `file_bytes` bytes (no storage can be larger),
/// checking every record it reads against the CRC-32 in `crcs` (the central directory's).
/// With `mapped`, stored storages are views of the mapped file (checkpoint/mapped.hpp); those
/// of check_aside_bytes or more are checked by this thread's DeferredChecks where it has one
/// (rt.load's: as they are copied), else on two threads before the value is returned.
c10::IValue read_records(caffe2::serialize::PyTorchStreamReader& reader,
                         std::optional<c10::Device> map_location, const std::string& what,
                         int64_t file_bytes, const std::unordered_map<std::string, uint32_t>& crcs,
                         const MappedRecords* mapped = nullptr) {
  // 0: not recorded (torch.save with compute_crc32 off), or an empty record.
  auto expected_crc = [&](const std::string& name) {
    auto it = crcs.find(name);
    if (it == crcs.end()) {
      throw Error("loom::checkpoint: " + what + ": the record " + name +
                  " is not in the zip's central directory");
    }
    return it->second;
  };
  CrcChecks checks(what);
  std::optional<DeferredChecks> own;  // no caller's: checked here, before returning
  DeferredChecks* deferred = nullptr;
  if (mapped != nullptr) {
    deferred = DeferredChecks::current();
    if (deferred == nullptr) deferred = &own.emplace();
  }
  if (reader.hasRecord("constants.pkl")) {
    throw Error("loom::checkpoint: " + what +
                " is a TorchScript archive (written by torch::save or torch.jit.save), not a "
                "torch.save checkpoint");
  }
  if (!reader.hasRecord("data.pkl")) {
    throw Error("loom::checkpoint: " + what +
                " has no data.pkl: not a torch.save checkpoint, or one whose save did not finish");
  }
  if (reader.hasRecord("byteorder")) {
    auto [ptr, n] = reader.getRecord("byteorder");
    if (std::string_view(static_cast<const char*>(ptr.get()), n) != "little") {
      throw Error("loom::checkpoint: " + what + " was written on a big-endian machine");
    }
  }
  auto [pkl, size] = reader.getRecord("data.pkl");
  checks.check("data.pkl", pkl.get(), size, expected_crc("data.pkl"));
  StorageLoader load = [&](const std::string& key, int64_t nbytes) {
    const std::string name = "data/" + key;
    if (!reader.hasRecord(name)) {
      throw Error("loom::checkpoint: " + what + " lacks the storage record " + name);
    }
    if (nbytes > file_bytes || static_cast<int64_t>(reader.getRecordSize(name)) != nbytes) {
      throw Error("loom::checkpoint: " + what + ": the storage record " + name + " holds " +
                  std::to_string(reader.getRecordSize(name)) + " bytes, the pickle says " +
                  std::to_string(nbytes));
    }
    if (mapped != nullptr && nbytes > 0) {
      if (at::Tensor view = mapped_record(*mapped, name, nbytes, what); view.defined()) {
        // The view may be copied to a device and dropped before it is checked: `deferred`
        // keeps it.
        if (static_cast<std::size_t>(nbytes) < check_aside_bytes) {
          checks.check(name, view, expected_crc(name));
        } else {
          deferred->defer(what, name, view, expected_crc(name));
        }
        return view;
      }
    }
    auto bytes = at::empty({nbytes}, at::TensorOptions(at::kByte));
    if (nbytes > 0) reader.getRecord(name, bytes.mutable_data_ptr(), static_cast<size_t>(nbytes));
    checks.check(name, bytes, expected_crc(name));
    return bytes;
  };
  PickleReader unpickler(std::string_view(static_cast<const char*>(pkl.get()), size), load,
                         map_location);
  c10::IValue value = unpickler.read();
  checks.finish();
  if (own) own->finish();
  return value;
}

// Runs `f`, turning LibTorch's container errors (c10::Error) into loom::Errors about `what`.
template <class F>
decltype(auto) container_errors(const std::string& what, F&& f) {
  try {
    return f();
  } catch (const c10::Error& e) {
    throw Error("loom::checkpoint: " + what +
                " is not a readable torch.save zip file (a legacy non-zip torch.save file, a "
                "truncated or corrupted one, or no checkpoint at all): " +
                first_line(e));
  }
}

}  // namespace
}  // namespace detail

void save_value(const std::filesystem::path& path, const c10::IValue& value, SaveOptions options) {
  detail::write_atomically(
      path, "loom::checkpoint",
      [&](detail::TempFile& file) {
        std::unordered_map<std::string, uint32_t> crcs;
        try {
          caffe2::serialize::PyTorchStreamWriter writer(
              [&](const void* data, size_t n) { return file.write(data, n); },
              /*compute_crc32=*/false);
          crcs = detail::write_records(writer, value);
        } catch (const c10::Error& e) {
          throw Error("loom::checkpoint: writing " + path.string() + " failed" +
                      (file.error() ? std::string(": ") + std::strerror(file.error()) : "") + " (" +
                      detail::first_line(e) + ")");
        }
        if (file.error() != 0) return;  // write_atomically names it; nothing to read back
        detail::put_zip_crcs([&](uint64_t offset, std::size_t n) { return file.read(offset, n); },
                             [&](uint64_t offset, uint32_t crc) { file.put(offset, crc); },
                             file.size(), crcs, path.string());
      },
      options.sync);
}

std::string save_bytes(const c10::IValue& value) {
  std::string out;
  std::unordered_map<std::string, uint32_t> crcs;
  {
    caffe2::serialize::PyTorchStreamWriter writer(
        [&](const void* data, size_t n) {
          out.append(static_cast<const char*>(data), n);
          return n;
        },
        /*compute_crc32=*/false);
    crcs = detail::write_records(writer, value);
  }
  detail::put_zip_crcs(
      [&](uint64_t offset, std::size_t n) {
        return offset >= out.size() ? std::string() : out.substr(offset, n);
      },
      [&](uint64_t offset, uint32_t crc) { std::memcpy(out.data() + offset, &crc, 4); }, out.size(),
      crcs, "the checkpoint");
  return out;
}

c10::IValue load_value(const std::filesystem::path& path, std::optional<c10::Device> map_location,
                       LoadOptions options) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw Error("loom::checkpoint: no checkpoint file at " + path.string());
  }
  const auto what = path.string();
  return detail::container_errors(what, [&] {
    caffe2::serialize::PyTorchStreamReader reader(path.string());
    if (options.map) {
      if (const auto file = MappedFile::open(path)) {
        detail::MappedRecords records{*file, {}};
        auto read = [&](uint64_t offset, std::size_t n) {
          if (offset >= file->size()) return std::string();
          return std::string(file->data() + offset, std::min<uint64_t>(n, file->size() - offset));
        };
        for (auto& e : detail::zip_entries(read, file->size(), what)) {
          auto name = e.name;
          records.entries.insert_or_assign(std::move(name), std::move(e));
        }
        std::unordered_map<std::string, uint32_t> crcs;
        for (const auto& [name, e] : records.entries) crcs.emplace(name, e.crc);
        return detail::read_records(reader, map_location, what, static_cast<int64_t>(file->size()),
                                    crcs, &records);
      }
    }
    const auto size = std::filesystem::file_size(path);
    std::ifstream in(path, std::ios::binary);
    const auto crcs = detail::zip_crcs(
        [&](uint64_t offset, std::size_t n) {
          std::string buf(n, '\0');
          in.clear();
          in.seekg(static_cast<std::streamoff>(offset));
          in.read(buf.data(), static_cast<std::streamsize>(n));
          buf.resize(static_cast<std::size_t>(std::max<std::streamsize>(in.gcount(), 0)));
          return buf;
        },
        size, what);
    return detail::read_records(reader, map_location, what, static_cast<int64_t>(size), crcs);
  });
}

c10::IValue load_bytes(const std::string& bytes, std::optional<c10::Device> map_location) {
  return detail::container_errors("the checkpoint", [&] {
    std::istringstream in(bytes);
    caffe2::serialize::PyTorchStreamReader reader(&in);
    const auto crcs = detail::zip_crcs(
        [&](uint64_t offset, std::size_t n) {
          return offset >= bytes.size() ? std::string()
                                        : bytes.substr(static_cast<std::size_t>(offset), n);
        },
        bytes.size(), "the checkpoint");
    return detail::read_records(reader, map_location, "the checkpoint",
                                static_cast<int64_t>(bytes.size()), crcs);
  });
}

void TorchFile::save(const std::filesystem::path& path, const c10::IValue& value) const {
  save_value(path, value, options_);
}

c10::IValue TorchFile::load(const std::filesystem::path& path, c10::Device map_location) const {
  if (dcp::is_checkpoint(path)) return dcp::load(path, map_location);  // Python's DCP directory
  return load_value(path, map_location, load_options_);
}

}  // namespace loom::checkpoint
