#pragma once
// The sharded save loom::Zero and loom::Fsdp share (include/loom/checkpoint/shards.hpp's
// layout), defined in zero_checkpoint.cpp. Internal to the loom::dist library.
#include <filesystem>
#include <string_view>

#include <ATen/core/ivalue.h>

#include <loom/checkpoint/checkpoint_io.hpp>
#include <loom/checkpoint/shards.hpp>
#include <loom/dist/process_group.hpp>

namespace loom::dist::detail {

/// Rank 0 names the save (a tag, broadcast); `index.files` gets every other rank's file name;
/// every rank but 0 writes `own` (its pieces) to its file beside `path`; then rank 0 writes
/// `top` with the index as the main file, once every other file is in place, and removes
/// older saves' shard files. A failure on any rank is every rank's loom::Error, naming the
/// file; `who` names the strategy in it.
void save_sharded(ProcessGroup& group, const std::filesystem::path& path, const c10::IValue& top,
                  checkpoint::ShardIndex index, const c10::IValue& own, std::string_view who,
                  const checkpoint::CheckpointIO& io);

}  // namespace loom::dist::detail
