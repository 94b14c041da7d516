#pragma once
// Reading a checkpoint by mapping its file (mmap) instead of copying it into new memory: what
// rt.load does (checkpoint::LoadOptions::map). The storages of the value read are views of the
// file's pages in the page cache, private and copy-on-write (MAP_PRIVATE), and keep the mapping
// alive; rt.load copies them into the tensors the model and the optimizer already hold, so a
// load touches no fresh memory where the state already exists, or, for a module built under
// loom::EmptyInit (whose memory holds nothing yet), gives its tensors the file's pages
// (KeepMapped). unmapped() gives any other value its own memory before it is kept.
//
// Like torch.load(mmap=True): a mapped tensor reads the file as it is on disk, so a program that
// truncates or rewrites the file in place while the tensor lives makes its pages unreadable
// (SIGBUS). loom's own saves never do (they write a new file and rename it over the old one);
// rt.load keeps no mapped tensor past its return but the pages a KeepMapped gave. rt.load also
// checks the CRC-32 of each large record as it copies it (DeferredChecks), so the file's bytes are
// read once. Declarations only; src/checkpoint/mapped.cpp.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

namespace loom::checkpoint {

/// A whole file mapped into memory (read-only file, private copy-on-write pages), shared by the
/// tensors made on it: the last of them unmaps it.
class MappedFile : public std::enable_shared_from_this<MappedFile> {
 public:
  /// Maps `path`; null where it cannot be mapped (an empty file, a file system without mmap,
  /// no address space left): the caller reads the file instead. A file that cannot be opened
  /// is null too; the read that follows says why.
  static std::shared_ptr<const MappedFile> open(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const char* data() const noexcept { return static_cast<const char*>(base_); }
  std::size_t size() const noexcept { return size_; }
  /// The bytes [offset, offset + n) of the file as a CPU uint8 tensor of n elements that keeps
  /// the mapping alive; writable (a write copies the page, never reaching the file). A range
  /// outside the file is a loom::Error naming `what`.
  at::Tensor bytes(std::size_t offset, std::size_t n, const std::string& what) const;

 private:
  MappedFile(void* base, std::size_t size) : base_(base), size_(size) {}
  void* base_;
  std::size_t size_;
};

/// Whether `t`'s storage is part of a MappedFile.
bool is_mapped(const at::Tensor& t) noexcept;

/// `value` with every mapped tensor in it (in dicts, lists and tuples, at any depth) given its
/// own memory: the same values, dtypes, shapes, strides and requires_grad; tensors that share a
/// storage in `value` share the new one. Dicts and lists are changed in place. A value with no
/// mapped tensor comes back as it is.
c10::IValue unmapped(const c10::IValue& value);

/// {destination, source} pairs for copy_all.
using TensorCopies = std::vector<std::pair<at::Tensor, at::Tensor>>;

/// While one lives on this thread, copy_all (a load's copies) gives a destination its mapped
/// source's pages as its memory instead of copying them into it, where that loses nothing: the
/// destination is the only tensor on its storage and covers the whole of it, both are CPU,
/// contiguous, of one dtype and shape, and the source is a view of a mapped file (Python's
/// torch.load(mmap=True) + load_state_dict(assign=True)). The pages stay private and
/// copy-on-write: the first write to each copies it and never reaches the file. The file stays
/// mapped while such a tensor lives (its disk space too, when it is deleted or replaced), and
/// a program that truncates or rewrites it in place makes those pages unreadable (SIGBUS;
/// loom's saves write a new file and rename it). What rt.load does for a module built under
/// loom::EmptyInit, whose memory holds no values yet, when asked (LoadOptions::keep_mapped). Nested
/// ones: the innermost decides.
class KeepMapped {
 public:
  explicit KeepMapped(bool keep = true) noexcept;
  ~KeepMapped();
  KeepMapped(const KeepMapped&) = delete;
  KeepMapped& operator=(const KeepMapped&) = delete;
  /// The innermost one on this thread when it keeps, or null.
  static KeepMapped* current() noexcept;

 private:
  friend void copy_all(const TensorCopies& copies);
  bool keep_;
  KeepMapped* outer_;
  /// The file storages given so far: each to one destination only (a file that stored two
  /// tensors on one storage gives the second a copy, so the two stay apart).
  std::unordered_set<const void*> given_;
};

/// dst.copy_(src) for every pair, without autograd recording (a load's copies), or, under a
/// KeepMapped, dst given src's mapped pages where that loses nothing. A source that is
/// the whole of a record whose CRC-32 a DeferredChecks on this thread has still to check is
/// checked as it is copied (one pass over its bytes, not two: the copy in 256 KiB pieces over
/// torch's intra-op threads, each piece's CRC-32 read from the cache); a mismatch is a
/// loom::Error naming the record, thrown once every pair is copied.
void copy_all(const TensorCopies& copies);

/// A load's plan: state/ makes it while it checks a checkpoint's value against the run (which
/// tensor of the run receives which tensor of the file, cast to the destination's dtype, and
/// whether the file's own tensor may be kept), checkpoint/ runs it once every check passed
/// (copy_all: the copies, each large record's CRC-32 read as it is copied). So a load that
/// fails a check changes nothing, and only this folder knows what is mapped.
class LoadPlan {
 public:
  /// `destination` (a tensor the run holds) gets `source`'s values in place, cast to its dtype,
  /// when run() runs.
  void copy(at::Tensor destination, at::Tensor source) {
    copies_.emplace_back(std::move(destination), std::move(source));
  }
  /// Whether a tensor just read from a file may be kept as it is instead of copied (state/
  /// has checked its shape, dtype, device and layout): it is the only user of its whole
  /// storage and not a view of a mapped file.
  static bool may_adopt(const at::Tensor& source);
  /// Makes every copy (copy_all).
  void run() const { copy_all(copies_); }
  bool empty() const noexcept { return copies_.empty(); }

 private:
  TensorCopies copies_;
};

/// While one lives on this thread, mapped reads (load_value with LoadOptions::map) leave the
/// CRC-32 checks of their records of 1 MiB or more to it instead of making them before they
/// return (smaller records, the pickle among them, are still checked at once): copy_all checks
/// a record as it copies the whole of it, finish() checks every other one on two threads. What
/// rt.load does, so that its copies read the file's bytes once. The price: a corrupted record is
/// found while (or after) it is copied, so the memory it was copied into holds it; the error
/// says so (`note`). Nothing read under one may be trusted before finish() returns. Nested ones:
/// the innermost takes the records.
class DeferredChecks {
 public:
  /// `note` ends the message of every mismatch this one finds.
  explicit DeferredChecks(std::string note = {});
  ~DeferredChecks();
  DeferredChecks(const DeferredChecks&) = delete;
  DeferredChecks& operator=(const DeferredChecks&) = delete;

  /// This thread's innermost one, or null.
  static DeferredChecks* current() noexcept;
  /// Record `name` of `what`: `bytes` (kept alive until checked) against `expected`.
  void defer(std::string what, std::string name, at::Tensor bytes, uint32_t expected);
  /// Checks every record not checked yet, on two threads where the machine has two cores; a
  /// mismatch is a loom::Error naming the first record (in the order deferred) that fails.
  void finish();

 private:
  friend void copy_all(const TensorCopies& copies);
  struct Record {
    std::string what;
    std::string name;
    at::Tensor bytes;
    uint32_t expected;
    bool checked = false;
  };
  static constexpr std::size_t no_record = static_cast<std::size_t>(-1);
  /// The index of the unchecked record `src` is the whole of, or no_record.
  std::size_t whole_record(const at::Tensor& src) const;
  [[noreturn]] void fail(const Record& r) const;

  std::vector<Record> records_;
  std::unordered_map<const void*, std::size_t> by_data_;
  std::string note_;
  DeferredChecks* outer_;
};

}  // namespace loom::checkpoint
