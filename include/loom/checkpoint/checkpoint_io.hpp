#pragma once
// loom::checkpoint::CheckpointIO: how one checkpoint value becomes a file and back (Lightning's
// CheckpointIO plugin). A strategy's save_checkpoint / load_checkpoint decide which ranks call
// it; checkpoint/io.hpp's TorchFile is the one loom ships (torch.save files). Light on purpose:
// the strategies' defaults include it, the file format stays in checkpoint/io.hpp.
#include <filesystem>

#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

namespace loom::checkpoint {

/// How rt.save writes. Like torch.distributed.checkpoint's FileSystemWriter(sync_files=...).
struct SaveOptions {
  /// fsync the file before the rename and the directory after it (the default): the new
  /// checkpoint, or else the old one, survives a power loss or an OS crash. false skips both;
  /// the save is still atomic for a killed or crashing process (the rename publishes a whole
  /// file), and takes what torch.save takes.
  bool sync = true;
};

/// How a checkpoint is read (checkpoint::load_value, TorchFile).
struct LoadOptions {
  /// Map the file (mmap) instead of copying it into new memory: CPU tensors of the value are
  /// views of the file's pages (private: a write to one copies its page and never reaches the
  /// file), so a load that copies them into tensors it already has touches no fresh memory.
  /// rt.load maps, and copies or unmaps every tensor before it returns. Hold mapped tensors no
  /// longer than needed: a program that truncates or rewrites the file in place meanwhile
  /// makes them unreadable (SIGBUS), as with torch.load(mmap=True); loom's saves never do (they
  /// replace the file by a rename). checkpoint::unmapped() gives a value its own memory. Where
  /// the file cannot be mapped it is read as without this option.
  bool map = false;
};

/// Writes one value to a file and reads it back. Called by a strategy's save_checkpoint and
/// load_checkpoint on the ranks it chooses; an error is a loom::Error (or another
/// std::exception) thrown from save or load.
class CheckpointIO {
 public:
  CheckpointIO() = default;
  CheckpointIO(const CheckpointIO&) = default;
  CheckpointIO& operator=(const CheckpointIO&) = default;
  virtual ~CheckpointIO() = default;

  /// Writes `value` to `path` (loom's TorchFile: atomically).
  virtual void save(const std::filesystem::path& path, const c10::IValue& value) const = 0;
  /// Reads the value at `path`, tensors mapped to `map_location`.
  virtual c10::IValue load(const std::filesystem::path& path, c10::Device map_location) const = 0;
};

}  // namespace loom::checkpoint
