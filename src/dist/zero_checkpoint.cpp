// loom::Zero's checkpoints: the optimizer state consolidated on rank 0 (in Python's layout) or
// written as one shard per rank, and read back at any world size.
#include <loom/dist/zero.hpp>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <loom/checkpoint/dcp.hpp>
#include <loom/checkpoint/mapped.hpp>
#include <loom/checkpoint/shards.hpp>
#include <loom/detail/agree_on_failure.hpp>
#include <loom/error.hpp>
#include <loom/state/entry.hpp>

#include "../state/optimizer_shards.hpp"
#include "group_state.hpp"
#include "sharded_save.hpp"
#include "zero_state.hpp"

namespace loom::dist {

namespace {

/// Every rank's `mine` on rank 0, its own first, by point-to-point messages (the other ranks
/// get nothing back): what rank 0 needs to consolidate, 1/world of a broadcast's traffic.
std::vector<c10::IValue> gather_on_zero(detail::GroupState& s, int rank, int world,
                                        const c10::IValue& mine,
                                        std::chrono::milliseconds timeout) {
  std::vector<c10::IValue> out;
  const auto on_device = at::TensorOptions().device(s.device);
  if (rank != 0) {
    const std::vector<char> bytes = torch::jit::pickle_save(mine);
    const auto n = static_cast<std::int64_t>(bytes.size());
    at::Tensor size = at::full({1}, n, on_device.dtype(at::kLong));
    at::Tensor data = at::empty({n}, at::TensorOptions().dtype(at::kByte));
    std::memcpy(data.data_ptr(), bytes.data(), bytes.size());
    at::Tensor payload = data.to(s.device);
    detail::send(s, size, 0, 0).wait(timeout);
    detail::send(s, payload, 0, 1).wait(timeout);
    return out;
  }
  out.push_back(mine);
  for (int r = 1; r < world; ++r) {
    at::Tensor size = at::empty({1}, on_device.dtype(at::kLong));
    detail::recv(s, size, r, 0).wait(timeout);
    const auto n = size.cpu().item<std::int64_t>();
    at::Tensor payload = at::empty({n}, on_device.dtype(at::kByte));
    detail::recv(s, payload, r, 1).wait(timeout);
    const at::Tensor data = payload.cpu();
    const auto* first = static_cast<const char*>(data.data_ptr());
    out.push_back(torch::jit::pickle_load(std::vector<char>(first, first + n)));
  }
  return out;
}

/// Which items of a DCP directory are optimizer states of parameters another rank owns (an
/// optimizer entry's "state", keyed by the parameter's name as get_state_dict keys it, or by
/// its id as optimizer.state_dict() does): this rank does not read them.
checkpoint::dcp::Skip others_states(const State& state, const detail::ZeroState& z, int rank) {
  std::map<std::string, std::map<std::string, bool>> theirs;  // entry -> name or id -> not ours
  std::map<std::string, bool> names;                          // over every module entry
  auto not_ours = [&](const at::Tensor& p) {
    const auto it = z.owner_of.find(p.unsafeGetTensorImpl());
    return it != z.owner_of.end() && it->second != rank;
  };
  for (const StateEntry& e : state) {
    if (e.module() == nullptr) continue;
    for (const auto& item : e.module()->named_parameters(/*recurse=*/true)) {
      names.emplace(item.key(), not_ours(item.value()));
    }
  }
  for (const StateEntry& e : state) {
    if (e.optimizer() == nullptr) continue;
    auto& keys = theirs[std::string(e.name())];
    keys = names;
    int64_t id = 0;
    for (const auto& group : e.optimizer()->param_groups()) {
      for (const auto& p : group.params()) keys.emplace(std::to_string(id++), not_ours(p));
    }
  }
  return [theirs](const std::vector<checkpoint::dcp::PathStep>& path) {
    auto name = [&](std::size_t i) { return std::get_if<std::string>(&path[i]); };
    if (path.size() < 3 || !name(0) || !name(1) || *name(1) != "state" || !name(2)) return false;
    const auto entry = theirs.find(*name(0));
    if (entry == theirs.end()) return false;
    const auto it = entry->second.find(*name(2));
    return it != entry->second.end() && it->second;
  };
}

}  // namespace

void detail::save_sharded(ProcessGroup& group, const std::filesystem::path& path,
                          const c10::IValue& top, checkpoint::ShardIndex index,
                          const c10::IValue& own, std::string_view who,
                          const checkpoint::CheckpointIO& io) {
  const int rank = group.rank(), world = group.world_size();
  std::string tag;
  try {
    tag = group.broadcast_object(rank == 0 ? checkpoint::new_shard_tag() : std::string(), 0);
  } catch (...) {
    group.fail("the sharded save's name", std::current_exception());
  }
  index.world_size = world;
  index.files.clear();
  for (int r = 1; r < world; ++r) {
    index.files.push_back(checkpoint::shard_path(path, tag, r, world).filename().string());
  }
  // Every rank but 0 writes its pieces beside the main file, then rank 0 writes the main file
  // (its own pieces in place, and the index) once every other file is there.
  const auto mine = checkpoint::shard_path(path, tag, rank, world);
  loom::detail::agree_on(group,
                         std::string(who) + ": writing the shard " + mine.filename().string(), [&] {
                           if (rank != 0) io.save(mine, own);
                         });
  group.save_on_rank_zero(path, rank == 0 ? checkpoint::with_shard_index(top, index) : top, io);
  if (rank == 0) checkpoint::remove_other_shards(path, tag);
}

void Zero::save_checkpoint(const std::filesystem::path& path, const State& state,
                           const checkpoint::CheckpointIO& io) {
  ProcessGroup& group = process_group();
  const state::Dict top = state::save_entries(state);  // every rank: the runtime's entry gathers
  // Each rank's optimizer entries hold the state of its shard's parameters (their ids are the
  // whole groups').
  const state::Dict mine =
      group.connected() ? state::optimizer_states(state, top) : state::new_dict();
  if (mine.empty()) {
    group.save_on_rank_zero(path, c10::IValue(top), io);
    return;
  }
  if (options_.checkpoint == ZeroCheckpoint::Sharded) {
    auto& z = *state_;
    checkpoint::ShardIndex index;
    for (std::size_t i = 0; i < z.params.size(); ++i) {
      index.owners.push_back(z.owners[i]);
      index.numels.push_back(z.params[i].numel());
    }
    detail::save_sharded(group, path, c10::IValue(top), std::move(index), c10::IValue(mine),
                         "loom::Zero", io);
    return;
  }
  // Consolidated: every rank's states go to rank 0, which merges them by id and writes.
  std::vector<c10::IValue> all;
  try {
    all = gather_on_zero(process_group().state(), rank(), world_size(), c10::IValue(mine),
                         options_.ddp.timeout);
  } catch (...) {
    fail("gathering the optimizer state on rank 0", std::current_exception());
  }
  group.save_on_rank_zero(
      path, c10::IValue(rank() == 0 ? state::with_optimizer_states(top, all) : top), io);
}

c10::IValue Zero::load_checkpoint(const std::filesystem::path& path, const State& state,
                                  const checkpoint::CheckpointIO& io, c10::Device device) {
  if (!process_group().connected()) return ddp_.load_checkpoint(path, state, io, device);
  // Every rank reads the main file; of a sharded checkpoint, every shard, or only its own when
  // this run partitions the parameters as the saving run did. Any rank's failure is every
  // rank's (a rank that went on alone would wait for the others at its next collective).
  const auto& z = *state_;
  c10::IValue value;
  loom::detail::agree_on(process_group(), "loom::Zero: loading " + path.string(), [&] {
    // Every CRC-32 checked here, inside the agreement (not as rt.load copies the tensors): a
    // corrupted shard fails every rank.
    checkpoint::DeferredChecks checks;
    if (checkpoint::dcp::is_checkpoint(path)) {
      // Python's DCP directory: of the optimizers' states only those of this rank's parameters.
      value =
          checkpoint::dcp::load(path, device, nullptr, nullptr, others_states(state, z, rank()));
    } else {
      value = io.load(path, device);
    }
    if (checkpoint::has_shard_index(value)) {
      const auto index = checkpoint::shard_index(value, path);
      bool same = index.world_size == world_size() && index.owners.size() == z.params.size() &&
                  !z.params.empty();
      for (std::size_t i = 0; same && i < z.params.size(); ++i) {
        same = index.owners[i] == z.owners[i] && index.numels[i] == z.params[i].numel();
      }
      value = checkpoint::merge_shards(path, std::move(value), io, device,
                                       [&](int r) { return !same || r == rank(); });
    }
    checks.finish();
  });
  return value;
}

}  // namespace loom::dist
