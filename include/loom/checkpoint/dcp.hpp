#pragma once
// Reading torch.distributed.checkpoint (DCP) directories: what Python's dcp.save writes with
// its default FileSystemWriter (DCP's metadata version 1.0.0; tested with torch 2.15): a
// `.metadata` file (a pickle of DCP's dataclasses: every tensor's dtype, size and chunks,
// where each chunk and each other object lies) and `__R_N.distcp` files of items, each item
// the bytes of one torch.save file (a chunk of a tensor, or a Python object such as a learning
// rate) at an offset.
//
// The `.metadata` pickle is read by a restricted unpickler of its own: the only globals it
// accepts are DCP's metadata classes (Metadata, TensorStorageMetadata, BytesStorageMetadata,
// TensorProperties, ChunkStorageMetadata, MetadataIndex, StorageMeta, _StorageInfo), torch's
// dtypes, torch.Size, torch.serialization._get_layout, DCP's memory-format encoding and
// pathlib's paths; it builds values and never runs code, as Python's weights_only allowlist
// does. The items are read with loom's torch.save reader (checkpoint/io.hpp), each from its own
// byte range of its file. rt.load (TorchFile::load) reads a DCP directory given as the path;
// loom::Fsdp's rt.load reads only the chunks of its rows (load with a RowsOf).
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

namespace loom::checkpoint::dcp {

/// Where an item lies: `length` bytes at `offset` of `file` (a name in the directory).
struct StorageInfo {
  std::string file;
  uint64_t offset = 0;
  uint64_t length = 0;
};

/// One saved chunk of a tensor: the box [offsets, offsets + sizes) of the whole tensor.
struct Chunk {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
  StorageInfo where;
};

/// A tensor of the checkpoint: its dtype and whole size, and the chunks that tile it.
struct TensorEntry {
  c10::ScalarType dtype = c10::kFloat;
  std::vector<int64_t> size;
  std::vector<Chunk> chunks;
};

/// One step of a key's path in the nested state dict: a dict key or a list index.
using PathStep = std::variant<std::string, int64_t>;

/// A DCP checkpoint's `.metadata`, checked: every chunk inside its tensor and located, the
/// chunks of each tensor covering it exactly, every file a plain name.
struct Metadata {
  std::map<std::string, TensorEntry> tensors;  // flattened key -> tensor
  std::map<std::string, StorageInfo> objects;  // flattened key -> a torch.save'd Python object
  /// flattened key -> its path in the nested state dict (DCP's planner_data, written when the
  /// state dict was flattened: "optim.param_groups.0.lr" -> optim, param_groups, 0, lr); a key
  /// without one is a key of the top level.
  std::map<std::string, std::vector<PathStep>> paths;
  std::string version;
};

/// Whether `path` is a directory holding a `.metadata` file.
bool is_checkpoint(const std::filesystem::path& path);

/// Parses the bytes of a `.metadata` file; `what` names it in errors. Anything outside the
/// format (an unknown global or opcode, a field missing or of the wrong type, a chunk outside
/// its tensor, chunks that overlap or leave a gap, a file that is not a plain name) is a
/// loom::Error naming the key at fault.
Metadata parse_metadata(std::string_view bytes, const std::string& what);

/// Reads and parses DIR/.metadata.
Metadata read_metadata(const std::filesystem::path& dir);

/// The whole state dict of the DCP checkpoint in `dir`, nested again as it was before DCP
/// flattened it (planner_data), every tensor whole on `device` (its chunks read from their
/// byte ranges and put in place), every object read. An optimizer state keyed by parameter
/// names (Python's get_state_dict / FSDP2's layout: "state" keyed by names, "params" lists of
/// names) comes back keyed by ids as optimizer.state_dict() keys it (ids in the order of the
/// param_groups' "params"), which is what loom's optimizer entries load. A missing or short
/// file, or an item that is not the torch.save file of what the metadata says, is a
/// loom::Error naming the key.
c10::IValue load(const std::filesystem::path& dir, c10::Device device = c10::kCPU);

/// What a load read: items (tensor chunks and objects) and their bytes.
struct ReadCount {
  int64_t items = 0;
  int64_t bytes = 0;
};

/// Which rows of a tensor a reader wants, [first, first + count) of dim 0, given its path in the
/// nested state dict (before an optimizer's names become ids: "optimizer", "state",
/// "0.up.weight", "exp_avg") and its whole size; none: the whole tensor.
using RowsOf = std::function<std::optional<std::pair<int64_t, int64_t>>(
    const std::vector<PathStep>& path, const std::vector<int64_t>& size)>;

/// load, where `rows_of` asks for part of a tensor: that tensor comes back as those rows only,
/// and a chunk that holds none of them is not read (what loom::Fsdp does: each rank reads the
/// byte ranges of its own rows). `count`, when given, says what was read.
c10::IValue load(const std::filesystem::path& dir, c10::Device device, const RowsOf& rows_of,
                 ReadCount* count = nullptr);

}  // namespace loom::checkpoint::dcp
