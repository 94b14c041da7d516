#pragma once
// loom::checkpoint::save_value / load_value: one c10::IValue to and from a torch.save file.
//
// The file is LibTorch's zip container (caffe2::serialize::PyTorchStreamWriter/Reader, the one
// torch.save uses) with loom's pickle inside (checkpoint/pickle.hpp): stock Python opens it
// with torch.load(path) (weights_only=True, no allowlist), and loom opens what torch.save
// wrote. The CRC-32s are loom's (checkpoint/crc32.hpp: libdeflate's where built with it),
// computed beside the writes and put in place after them; LibTorch's writer, whose CRC is
// several times slower, is told not to compute them. Saving is atomic: a temporary file in the
// target's directory, fsync, rename, fsync of the directory; an interrupted save leaves the
// previous file as it was.
#include <bit>
#include <filesystem>
#include <optional>
#include <string>

#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include <loom/checkpoint/checkpoint_io.hpp>
// The format's layers (the zip's CRC-32s, mapped reads, the pickle): files that include this
// header use them through it.
#include <loom/checkpoint/crc32.hpp>
#include <loom/checkpoint/mapped.hpp>
#include <loom/checkpoint/pickle.hpp>
#include <loom/error.hpp>

namespace loom::checkpoint {

static_assert(std::endian::native == std::endian::little,
              "loom::checkpoint writes and reads little-endian storages");

/// Writes `value` to `path` as a torch.save file, atomically (see the file comment). Tensors
/// on a device are copied to the host; their location ("cuda:0") is recorded as torch.save
/// records it.
void save_value(const std::filesystem::path& path, const c10::IValue& value,
                SaveOptions options = {});

/// The bytes of a torch.save file holding `value` (what save_value writes, in memory).
std::string save_bytes(const c10::IValue& value);

/// Reads a torch.save file (loom's or Python's). Tensors come back on the CPU, or on
/// `map_location`. A file that is not one, is truncated or corrupted, or needs a Python global
/// loom does not load (anything that could run code) is a loom::Error saying which. With
/// `options.map`, the file is mapped and CPU tensors are views of it (LoadOptions says when
/// that is safe); every record's CRC-32 is still checked before the value is returned, unless
/// this thread has a DeferredChecks, which then checks the large ones (checkpoint/mapped.hpp).
c10::IValue load_value(const std::filesystem::path& path,
                       std::optional<c10::Device> map_location = std::nullopt,
                       LoadOptions options = {});

/// load_value of the bytes of a torch.save file.
c10::IValue load_bytes(const std::string& bytes,
                       std::optional<c10::Device> map_location = std::nullopt);

/// The CheckpointIO of rt.save and rt.load: save_value and load_value, torch.save files that
/// stock Python opens with torch.load and that loom reads from Python.
class TorchFile final : public CheckpointIO {
 public:
  explicit TorchFile(SaveOptions options = {}, LoadOptions load_options = {})
      : options_(options), load_options_(load_options) {}
  void save(const std::filesystem::path& path, const c10::IValue& value) const override;
  c10::IValue load(const std::filesystem::path& path, c10::Device map_location) const override;

 private:
  SaveOptions options_;
  LoadOptions load_options_;
};

}  // namespace loom::checkpoint
