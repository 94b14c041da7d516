#pragma once
// Sharded checkpoints: a main file plus one file per other rank holding that rank's optimizer
// states (loom::Zero with ZeroCheckpoint::Sharded writes them). The main file is a whole
// checkpoint except that each optimizer entry's "state" holds rank 0's parameters only, and
// that a top-level entry, the index, names the other ranks' files:
//
//   main:    {..., "optimizer": {"state": {rank 0's ids}, "param_groups": [...]},
//             "loom_shards": {"format": 1, "world_size": W, "files":
//             ["<stem>.<tag>.shard-1-of-W.pt",
//                             ...], "owners": [...], "numels": [...]}}
//   shard r: {"optimizer": {id: state, ...}, ...}   (entry name to rank r's states)
//
// merge_shards reads them all back into one value (every strategy's load_checkpoint calls it,
// so any strategy and world size loads a sharded checkpoint); read_shard merges one. Files
// named relative to the main file's directory. Declarations only; src/checkpoint/shards.cpp.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include <loom/checkpoint/checkpoint_io.hpp>

namespace loom::checkpoint {

/// The top-level key of a sharded checkpoint's index in its main file.
inline constexpr std::string_view shard_index_key = "loom_shards";

/// A sharded checkpoint's index, as its main file holds it.
struct ShardIndex {
  std::int64_t world_size = 1;
  /// The files of ranks 1 .. world_size - 1, relative to the main file's directory.
  std::vector<std::string> files;
  /// The saving run's partition: each trainable parameter's owner and element count, in the
  /// module's order (a run with the same partition reads only its own rank's file).
  std::vector<std::int64_t> owners, numels;
};

/// The index `value` (a checkpoint file's top-level dict) holds, if any. A malformed index
/// is a loom::Error naming `path`.
bool has_shard_index(const c10::IValue& value);
ShardIndex shard_index(const c10::IValue& value, const std::filesystem::path& path);

/// The value with `index` as its top-level entry shard_index_key (a copy of the dict).
c10::IValue with_shard_index(const c10::IValue& value, const ShardIndex& index);

/// The name of rank `rank`'s file of the checkpoint at `path`, saved under `tag`:
/// "STEM.TAG.shard-RANK-of-WORLD.pt" beside it.
std::filesystem::path shard_path(const std::filesystem::path& path, std::string_view tag, int rank,
                                 int world);

/// Reads one shard file through `io` and merges its states into `value`'s optimizer entries
/// (in place: `value`'s dicts are changed). A missing or unreadable file, or one that names an
/// entry `value` has no optimizer entry for, is a loom::Error naming the file and `main`.
void read_shard(c10::IValue& value, const std::filesystem::path& main,
                const std::filesystem::path& file, const CheckpointIO& io, c10::Device device);

/// `value` as read from `path`: unchanged without an index; with one, the shard file of every
/// rank r >= 1 for which `wanted(r)` holds (by default all: the consolidated checkpoint) read
/// and merged, and the index removed.
c10::IValue merge_shards(const std::filesystem::path& path, c10::IValue value,
                         const CheckpointIO& io, c10::Device device,
                         const std::function<bool(int rank)>& wanted = {});

/// The shard files beside the checkpoint at `path` ("STEM.TAG.shard-R-of-W.pt", any tag, rank
/// and world size), each with its tag: what a save prunes (an older or unfinished save's) and
/// what loom::Checkpoints removes with a step.
std::vector<std::pair<std::filesystem::path, std::string>> shard_files(
    const std::filesystem::path& path);

}  // namespace loom::checkpoint
