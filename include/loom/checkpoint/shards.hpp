#pragma once
// Sharded checkpoints: a main file that rank 0 writes plus one file per other rank, beside it.
// Two kinds, told apart by the index (a top-level entry of the main file):
//
// Format 1, optimizer states (loom::Zero with ZeroCheckpoint::Sharded): the main file is a
// whole checkpoint except that each optimizer entry's "state" holds rank 0's parameters only;
// rank r's file holds its states, by entry name:
//
//   main:    {..., "optimizer": {"state": {rank 0's ids}, "param_groups": [...]},
//             "loom_shards": {"format": 1, "world_size": W, "files":
//             ["<stem>.<tag>.shard-1-of-W.pt", ...], "owners": [...], "numels": [...]}}
//   shard r: {"optimizer": {id: state, ...}, ...}
//
// Format 2, pieces on dim 0 (loom::Fsdp with FsdpCheckpoint::Sharded): every tensor the index
// names (a slot: its path of keys from the top, e.g. ["model", "0.up.weight"] or ["optimizer",
// "state", 2, "exp_avg"]) is cut on dim 0 as FSDP2 cuts a parameter over W ranks (chunk c =
// ceil(rows / W), rank r rows [r c, (r + 1) c) clamped to the whole); the main file holds rank
// 0's pieces in place, rank r's file the pieces of rank r:
//
//   main:    {..., "loom_shards": {"format": 2, "world_size": W, "files": [...],
//             "slots": [[key, ...], ...], "rows": [whole rows of each slot]}}
//   shard r: {"slots": [[key, ...], ...], "pieces": [tensor, ...]}
//
// merge_shards reads either back into one value (every strategy's load_checkpoint calls it,
// so any strategy and world size loads a sharded checkpoint), of format 2 optionally only the
// rows a rank needs, reading only the files that hold them. Files named relative to the main
// file's directory. Declarations only; src/checkpoint/shards.cpp.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include <loom/checkpoint/checkpoint_io.hpp>

namespace loom::checkpoint {

/// The top-level key of a sharded checkpoint's index in its main file.
inline constexpr std::string_view shard_index_key = "loom_shards";

/// A sharded checkpoint's index, as its main file holds it.
struct ShardIndex {
  std::int64_t format = 1;  // 1: optimizer states; 2: pieces on dim 0
  std::int64_t world_size = 1;
  /// The files of ranks 1 .. world_size - 1, relative to the main file's directory.
  std::vector<std::string> files;
  /// The saving run's partition: each trainable parameter's owner and element count, in the
  /// module's order (a run with the same partition reads only its own rank's file).
  std::vector<std::int64_t> owners, numels;
  /// Format 2: each slot's keys from the top of the value, and its whole rows (dim 0).
  std::vector<std::vector<c10::IValue>> slots;
  std::vector<std::int64_t> rows;
};

/// A slot's rows [first, first + count) of dim 0.
struct Rows {
  std::int64_t first = 0, count = 0;
};

/// The rows of `whole` rows that rank `rank` of `world` holds, as FSDP2 cuts a parameter.
Rows rows_of(std::int64_t whole, std::int64_t rank, std::int64_t world);

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

/// A shard file of format 2: rank `rank`'s pieces of the slots `slots` (their tensors in
/// `pieces`, the same order).
c10::IValue pieces_file(const std::vector<std::vector<c10::IValue>>& slots,
                        const std::vector<at::Tensor>& pieces);

/// `value` as read from `path`: unchanged without an index; with one, the index removed and:
/// of format 1, the shard file of every rank r >= 1 for which `wanted(r)` holds (by default
/// all: the consolidated checkpoint) read and merged; of format 2, each slot's whole tensor,
/// or with `rows` only the rows `rows(whole rows)` names (a rank's piece of another world
/// size), read from the files that hold them and no other.
c10::IValue merge_shards(const std::filesystem::path& path, c10::IValue value,
                         const CheckpointIO& io, c10::Device device,
                         const std::function<bool(int rank)>& wanted = {},
                         const std::function<Rows(std::int64_t whole)>& rows = {});

/// A name no earlier save of the same path used: the shard files of a save that did not
/// finish never mix with those an index names.
std::string new_shard_tag();

/// Removes the shard files of `path` that a save other than `tag`'s wrote (an older save of
/// the same path, or one that did not finish). Best effort: what cannot go stays.
void remove_other_shards(const std::filesystem::path& path, const std::string& tag);

/// The shard files beside the checkpoint at `path` ("STEM.TAG.shard-R-of-W.pt", any tag, rank
/// and world size), each with its tag: what a save prunes (an older or unfinished save's) and
/// what loom::Checkpoints removes with a step.
std::vector<std::pair<std::filesystem::path, std::string>> shard_files(
    const std::filesystem::path& path);

}  // namespace loom::checkpoint
