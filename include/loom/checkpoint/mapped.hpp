#pragma once
// Reading a checkpoint by mapping its file (mmap) instead of copying it into new memory: what
// rt.load does (checkpoint::LoadOptions::map). The storages of the value read are views of the
// file's pages in the page cache, private and copy-on-write (MAP_PRIVATE), and keep the mapping
// alive; rt.load copies them into the tensors the model and the optimizer already hold, so a
// load touches no fresh memory where the state already exists. unmapped() gives any other
// value its own memory before it is kept.
//
// Like torch.load(mmap=True): a mapped tensor reads the file as it is on disk, so a program that
// truncates or rewrites the file in place while the tensor lives makes its pages unreadable
// (SIGBUS). loom's own saves never do (they write a new file and rename it over the old one);
// rt.load keeps no mapped tensor past its return. Declarations only; src/checkpoint/mapped.cpp.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
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

/// dst.copy_(src) for every pair, without autograd recording (a load's copies). Pairs of 1 MiB
/// or more on the CPU, of one dtype and shape, both contiguous and not sharing memory, are
/// copied with streaming stores (x86-64) in 4 MiB pieces over torch's intra-op threads: the
/// destination is written without being read first, a third less memory traffic than
/// Tensor::copy_ (measured 1.3-1.5x its speed), and the copies are most of a resume's load.
void copy_all(const TensorCopies& copies);

namespace detail {

/// One record whose CRC-32 is checked: `expected` 0 means none was recorded.
struct CrcRecord {
  std::string name;
  const void* data;
  std::size_t size;
  uint32_t expected;
};

/// Checks every record against its CRC-32, on two threads where the machine has two cores and
/// the records hold 1 MiB or more; a mismatch is a loom::Error about `what` naming the first
/// record (in order) that fails.
void check_crcs(const std::vector<CrcRecord>& records, const std::string& what);

}  // namespace detail

}  // namespace loom::checkpoint
