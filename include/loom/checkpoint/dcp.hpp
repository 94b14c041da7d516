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
//
// Writing: save() writes a value as one process's DCP directory; loom::Fsdp with
// FsdpCheckpoint::Dcp writes each rank's chunks (src/dist/fsdp_checkpoint.cpp) through the
// pieces below: flatten (DCP's flatten_state_dict), write_items (one __R_0.distcp file),
// metadata_bytes (the `.metadata` pickle, DCP's dataclasses as Python pickles them) and
// publish (the staged directory renamed into place). Python's dcp.load reads the result into
// a model and optimizer (get_state_dict / set_state_dict's layout: Fsdp keys an optimizer's
// state by parameter names), and dcp_to_torch_save converts it to one file.
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

#include <loom/checkpoint/checkpoint_io.hpp>

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

/// Which items a reader leaves out, given their path (as RowsOf is given it): neither read
/// nor in the value.
using Skip = std::function<bool(const std::vector<PathStep>& path)>;

/// load, where `rows_of` asks for part of a tensor: that tensor comes back as those rows only,
/// and a chunk that holds none of them is not read (what loom::Fsdp does: each rank reads the
/// byte ranges of its own rows); the items `skip` names are left out (what loom::Zero does:
/// each rank reads the optimizer states of the parameters it owns). `count`, when given, says
/// what was read.
c10::IValue load(const std::filesystem::path& dir, c10::Device device, const RowsOf& rows_of,
                 ReadCount* count = nullptr, const Skip& skip = nullptr);

// ---- writing ------------------------------------------------------------------------------

/// One item a writer lays out: a leaf of the state dict under its flattened key and path, a
/// tensor (the chunk at `offsets` of a tensor of `size`) or any other value (an object).
struct WriteItem {
  std::string key;  // the path's steps joined by '.', as DCP flattens: "optim.state.w.step"
  std::vector<PathStep> path;
  c10::IValue value;
  std::vector<int64_t> size;     // a tensor's whole size (flatten: its own)
  std::vector<int64_t> offsets;  // where the chunk lies in it (flatten: zeros)
};

/// The leaves of `state` (a dict) as DCP's flatten_state_dict finds them: a dict is walked by
/// its keys (an int key becomes its decimal string), a list that holds a tensor, a dict or
/// such a list by its indices; any other value (a tuple, a list of scalars, a number, a
/// string, None) is one object. Each tensor is whole. Two leaves of one key are a loom::Error.
std::vector<WriteItem> flatten(const c10::IValue& state);

/// An optimizer's state dict keyed by ids (optimizer.state_dict()'s layout) keyed by names
/// instead, as Python's get_state_dict keys it: `names[id]` is the parameter's name ("state"
/// and each param group's "params"). A dict that is no optimizer's is left as it is; an id
/// without a name is a loom::Error.
void key_by_names(c10::IValue& optimizer, const std::vector<std::string>& names);

/// Writes the items' values one after another to `file` (a new file: each value the bytes
/// of a torch.save file, tensors from the host), fsync'd when `options.sync`; gives where
/// each lies, in the items' order.
std::vector<StorageInfo> write_items(const std::filesystem::path& file,
                                     const std::vector<WriteItem>& items,
                                     const SaveOptions& options = {});

/// Adds what `items` are and where `write_items` put them (`where`, in the same order) to `m`:
/// a tensor item one chunk of its key's tensor, any other item an object.
void describe(Metadata& m, const std::vector<WriteItem>& items,
              const std::vector<StorageInfo>& where);

/// The bytes of the `.metadata` file of `m` (DCP's metadata version 1.0.0, tested with torch
/// 2.15). Every tensor's chunks must tile it (parse_metadata's checks, made here
/// before anything is written: a loom::Error otherwise).
std::string metadata_bytes(const Metadata& m);

/// The directory a save of `dir` stages its files in ("DIR.partial-TAG" beside it).
std::filesystem::path staging_dir(const std::filesystem::path& dir, const std::string& tag);

/// Writes `metadata` as `staged`/.metadata, then puts `staged` in the place of `dir` by one
/// rename (swapping it with an existing `dir`, file or directory, which is then removed): a
/// reader sees the old checkpoint or the new one, never a mix. `options.sync` fsyncs the
/// metadata, the staged directory and `dir`'s parent.
void publish(const std::filesystem::path& staged, const std::filesystem::path& dir,
             const Metadata& metadata, const SaveOptions& options = {});

/// One process's DCP directory of `state` (a dict): every leaf (flatten) one item of
/// `__0_0.distcp`, each tensor one chunk, written to a staged directory and published. The
/// value is written as it is: an optimizer's state that Python's set_state_dict should load
/// is keyed by names first (key_by_names).
void save(const std::filesystem::path& dir, const c10::IValue& state,
          const SaveOptions& options = {});

}  // namespace loom::checkpoint::dcp
