// loom::Fsdp's rt.save and rt.load (include/loom/dist/fsdp.hpp): one consolidated file, each
// piece of the module and optimizer entries gathered whole, each rank's pieces in a file of
// its own (checkpoint/shards.hpp, format 2), or a DCP directory (checkpoint/dcp.hpp); any of
// them read back, as this rank's pieces.
#include <loom/dist/fsdp.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include <loom/checkpoint/async.hpp>
#include <loom/checkpoint/dcp.hpp>
#include <loom/checkpoint/mapped.hpp>
#include <loom/checkpoint/shards.hpp>
#include <loom/detail/agree_on_failure.hpp>
#include <loom/error.hpp>
#include <loom/state/entry.hpp>

#include "fsdp_state.hpp"
#include "sharded_save.hpp"

namespace loom::dist {

namespace {

constexpr std::string_view who = detail::fsdp_who;

using detail::FsdpParam;

/// A tensor slot of a checkpoint's value that holds a sharded parameter's tensor: a module
/// entry's parameter, or an optimizer entry's per-parameter state of the parameter's shape.
struct Slot {
  state::Dict dict;
  c10::IValue key;
  FsdpParam* param;
  std::vector<c10::IValue> path;  // the keys from the top: ["model", "0.up.weight"]
};

/// The slots of `top` (the value rt.save writes, or rt.load read) for `state`'s module and
/// optimizer entries: a module's parameters by their names, an optimizer's states by the
/// parameter ids its param groups number (Python's layout), whose tensor `fits` its
/// parameter ("step" never is one).
template <class Fits>
std::vector<Slot> slots(const State& state, const state::Dict& top,
                        const std::unordered_map<const void*, FsdpParam*>& by_impl, Fits fits) {
  std::vector<Slot> out;
  auto find = [&](const at::Tensor& p) -> FsdpParam* {
    const auto it = by_impl.find(p.unsafeGetTensorImpl());
    return it == by_impl.end() ? nullptr : it->second;
  };
  for (const StateEntry& e : state) {
    const c10::IValue name(e.name());
    if (!top.contains(name) || !top.at(name).isGenericDict()) continue;
    const state::Dict d = top.at(name).toGenericDict();
    if (e.module() != nullptr) {
      for (const auto& item : e.module()->named_parameters(/*recurse=*/true)) {
        FsdpParam* f = find(item.value());
        const c10::IValue key(item.key());
        if (f != nullptr && d.contains(key) && d.at(key).isTensor() &&
            fits(d.at(key).toTensor(), *f)) {
          out.push_back(Slot{d, key, f, {name, key}});
        }
      }
    } else if (e.optimizer() != nullptr) {
      const c10::IValue states_key(std::string("state"));
      if (!d.contains(states_key) || !d.at(states_key).isGenericDict()) continue;
      const state::Dict states = d.at(states_key).toGenericDict();
      int64_t id = 0;
      for (const auto& group : e.optimizer()->param_groups()) {
        for (const auto& p : group.params()) {
          const c10::IValue key(id++);
          FsdpParam* f = find(p);
          if (f == nullptr || !states.contains(key) || !states.at(key).isGenericDict()) continue;
          const state::Dict per = states.at(key).toGenericDict();
          for (const auto& item : per) {
            if (item.key().isString() && item.key().toStringRef() == "step") continue;
            if (item.value().isTensor() && fits(item.value().toTensor(), *f)) {
              out.push_back(Slot{per, item.key(), f, {name, states_key, key, item.key()}});
            }
          }
        }
      }
    }
  }
  return out;
}

/// Which rows of a DCP directory's tensor this rank reads (checkpoint::dcp::RowsOf): a module
/// entry's sharded parameter, or an optimizer entry's state of such a parameter's whole shape
/// (keyed by the parameter's name, as get_state_dict keys it), gives this rank's rows; any
/// other tensor is read whole.
checkpoint::dcp::RowsOf dcp_rows(const State& state,
                                 const std::unordered_map<const void*, FsdpParam*>& impls,
                                 int64_t rank, int64_t world) {
  std::map<std::string, std::map<std::string, FsdpParam*>> modules;  // entry -> name -> param
  std::map<std::string, FsdpParam*> names;                           // over every module entry
  std::set<std::string> optimizers;
  for (const StateEntry& e : state) {
    if (e.module() != nullptr) {
      for (const auto& item : e.module()->named_parameters(/*recurse=*/true)) {
        const auto it = impls.find(item.value().unsafeGetTensorImpl());
        if (it == impls.end()) continue;
        modules[std::string(e.name())][item.key()] = it->second;
        names.emplace(item.key(), it->second);
      }
    } else if (e.optimizer() != nullptr) {
      optimizers.insert(std::string(e.name()));
    }
  }
  return [modules, names, optimizers, rank, world](
             const std::vector<checkpoint::dcp::PathStep>& path,
             const std::vector<int64_t>& size) -> std::optional<std::pair<int64_t, int64_t>> {
    auto name = [&](std::size_t i) { return std::get_if<std::string>(&path[i]); };
    const FsdpParam* f = nullptr;
    if (path.size() == 2 && name(0) && name(1)) {
      if (const auto m = modules.find(*name(0)); m != modules.end()) {
        if (const auto p = m->second.find(*name(1)); p != m->second.end()) f = p->second;
      }
    } else if (path.size() == 4 && name(0) && optimizers.count(*name(0)) && name(1) &&
               *name(1) == "state" && name(2) && name(3) && *name(3) != "step") {
      if (const auto p = names.find(*name(2)); p != names.end()) f = p->second;
    }
    if (f == nullptr || size != f->sizes) return std::nullopt;
    const checkpoint::Rows rows = checkpoint::rows_of(f->sizes[0], rank, world);
    return std::pair{rows.first, rows.count};
  };
}

/// Whether `t` has the shape of this rank's piece of `f` (a slot rt.save fills).
bool piece_shaped(const at::Tensor& t, const FsdpParam& f) {
  return t.sizes().vec() == f.shape(f.local);
}

std::unordered_map<const void*, FsdpParam*> by_impl(const std::vector<FsdpParam*>& order) {
  std::unordered_map<const void*, FsdpParam*> out;
  for (auto* f : order) out.emplace(f->param.unsafeGetTensorImpl(), f);
  return out;
}

/// One chunk another rank wrote, as it tells rank 0: [key, dtype, size, offsets, sizes, file,
/// offset, length].
c10::IValue chunk_record(const checkpoint::dcp::WriteItem& item,
                         const checkpoint::dcp::StorageInfo& where) {
  const at::Tensor& t = item.value.toTensor();
  c10::impl::GenericList out(c10::AnyType::get());
  out.push_back(item.key);
  out.push_back(static_cast<int64_t>(t.scalar_type()));
  out.push_back(item.size);
  out.push_back(item.offsets);
  out.push_back(t.sizes().vec());
  out.push_back(where.file);
  out.push_back(static_cast<int64_t>(where.offset));
  out.push_back(static_cast<int64_t>(where.length));
  return out;
}

/// A DCP save laid out: every item's key and path (for the `.metadata`), what this rank
/// writes, and where.
struct DcpSave {
  std::map<std::string, std::vector<checkpoint::dcp::PathStep>> paths;
  std::vector<checkpoint::dcp::WriteItem> mine;
  std::filesystem::path path, staged;
  std::string file;  // this rank's, in `staged`
};

/// FsdpCheckpoint::Dcp's save, its first part (on the strategy's group): the value rt.save
/// writes, its optimizer entries keyed by the parameters' names, flattened as DCP flattens;
/// this rank's items: the chunks of its pieces (its rows, at their offsets in the whole
/// tensor), and on rank 0 also every other tensor (whole) and value; the directory staged
/// beside `path`, named by rank 0.
DcpSave plan_dcp(ProcessGroup& group, const std::filesystem::path& path, const State& state,
                 const std::vector<FsdpParam*>& order) {
  namespace dcp = checkpoint::dcp;
  const int rank = group.rank();
  state::Dict top = state::save_entries(state);
  // Which of the value's tensors are pieces (by their TensorImpl: the same tensors stay in the
  // value when the optimizer's keys become names).
  std::unordered_map<const void*, FsdpParam*> pieces;
  for (const auto& slot : slots(state, top, by_impl(order), piece_shaped)) {
    pieces.emplace(slot.dict.at(slot.key).toTensor().unsafeGetTensorImpl(), slot.param);
  }
  std::unordered_map<const void*, std::string> names;  // a module entry's parameter -> name
  for (const StateEntry& e : state) {
    if (e.module() == nullptr) continue;
    for (const auto& item : e.module()->named_parameters(/*recurse=*/true)) {
      names.emplace(item.value().unsafeGetTensorImpl(), item.key());
    }
  }
  for (const StateEntry& e : state) {
    const c10::IValue key{std::string(e.name())};
    if (e.optimizer() == nullptr || !top.contains(key)) continue;
    std::vector<std::string> by_id;
    for (const auto& g : e.optimizer()->param_groups()) {
      for (const auto& p : g.params()) {
        const auto it = names.find(p.unsafeGetTensorImpl());
        if (it == names.end()) {
          throw Error(std::string(who) + ": a DCP checkpoint keys the optimizer '" +
                      std::string(e.name()) +
                      "' by parameter names, and one of its parameters is in no module entry");
        }
        by_id.push_back(it->second);
      }
    }
    c10::IValue optimizer = top.at(key);
    dcp::key_by_names(optimizer, by_id);
  }
  DcpSave out;
  out.path = path;
  for (auto& item : dcp::flatten(c10::IValue(top))) {
    out.paths.emplace(item.key, item.path);
    const auto it = item.value.isTensor() ? pieces.find(item.value.toTensor().unsafeGetTensorImpl())
                                          : pieces.end();
    if (it == pieces.end()) {
      if (rank == 0) out.mine.push_back(std::move(item));  // whole, once
      continue;
    }
    const FsdpParam& f = *it->second;
    if (f.local == 0) continue;  // a rank past the last row holds nothing of it
    item.size = f.sizes;
    item.offsets.assign(f.sizes.size(), 0);
    item.offsets[0] = std::min(rank * f.chunk, f.sizes[0]);
    out.mine.push_back(std::move(item));
  }
  std::string tag;
  try {
    tag = group.broadcast_object(rank == 0 ? checkpoint::new_shard_tag() : std::string(), 0);
  } catch (...) {
    group.fail("the DCP save's name", std::current_exception());
  }
  out.staged = dcp::staging_dir(path, tag);
  out.file = "__" + std::to_string(rank) + "_0.distcp";
  loom::detail::agree_on(group, std::string(who) + ": creating " + out.staged.string(), [&] {
    if (rank != 0) return;
    std::error_code ec;
    std::filesystem::create_directories(out.staged, ec);
    if (ec) throw Error("cannot create " + out.staged.string() + ": " + ec.message());
  });
  return out;
}

/// FsdpCheckpoint::Dcp's save, its second part (on `group`: the strategy's, or the group of
/// an asynchronous save's thread): each rank writes its items to its `__R_0.distcp`; rank 0
/// learns where the other ranks' chunks lie, writes the `.metadata` and renames the directory
/// into place. A failure on any rank is every rank's, and removes the staged directory.
void write_dcp(ProcessGroup& group, const DcpSave& plan, const checkpoint::SaveOptions& options) {
  namespace dcp = checkpoint::dcp;
  const int rank = group.rank(), world = group.world_size();
  const auto& mine = plan.mine;
  try {
    std::vector<dcp::StorageInfo> where;
    const auto file = plan.staged / plan.file;
    loom::detail::agree_on(group, std::string(who) + ": writing " + file.string(), [&] {
      if (!mine.empty()) where = dcp::write_items(file, mine, options);
    });
    // Where every other rank's chunks lie, told to rank 0.
    c10::impl::GenericList records(c10::AnyType::get());
    for (std::size_t i = 0; i < mine.size() && rank != 0; ++i) {
      records.push_back(chunk_record(mine[i], where[i]));
    }
    std::vector<c10::IValue> others;
    try {
      for (int r = 1; r < world; ++r) {
        others.push_back(group.broadcast_object(
            rank == r ? c10::IValue(records)
                      : c10::IValue(c10::impl::GenericList(c10::AnyType::get())),
            r));
      }
    } catch (...) {
      group.fail("telling rank 0 where the DCP chunks lie", std::current_exception());
    }
    loom::detail::agree_on(group, std::string(who) + ": publishing " + plan.path.string(), [&] {
      if (rank != 0) return;
      dcp::Metadata m;
      m.version = "1.0.0";
      m.paths = plan.paths;
      dcp::describe(m, mine, where);
      for (const auto& list : others) {
        for (const auto& r : list.toListRef()) {
          const auto e = r.toListRef();
          auto& t = m.tensors[e[0].toStringRef()];
          t.dtype = static_cast<c10::ScalarType>(e[1].toInt());
          t.size = e[2].toIntVector();
          t.chunks.push_back(
              dcp::Chunk{e[3].toIntVector(), e[4].toIntVector(),
                         dcp::StorageInfo{e[5].toStringRef(), static_cast<uint64_t>(e[6].toInt()),
                                          static_cast<uint64_t>(e[7].toInt())}});
        }
      }
      dcp::publish(plan.staged, plan.path, m, options);
    });
  } catch (...) {
    if (rank == 0) {
      std::error_code ec;
      std::filesystem::remove_all(plan.staged, ec);
    }
    throw;
  }
}

}  // namespace

void Fsdp::save_sharded(const std::filesystem::path& path, const State& state,
                        const checkpoint::CheckpointIO& io) {
  auto& s = *state_;
  const state::Dict top = state::save_entries(state);
  const auto found = slots(state, top, by_impl(s.order), piece_shaped);
  checkpoint::ShardIndex index;
  index.format = 2;
  std::vector<at::Tensor> pieces;
  for (const auto& slot : found) {
    index.slots.push_back(slot.path);
    index.rows.push_back(slot.param->sizes[0]);
    pieces.push_back(slot.dict.at(slot.key).toTensor());
  }
  const c10::IValue own =
      group_.rank() == 0 ? c10::IValue() : checkpoint::pieces_file(index.slots, pieces);
  detail::save_sharded(group_, path, c10::IValue(top), std::move(index), own, who, io);
}

void Fsdp::save_checkpoint(const std::filesystem::path& path, const State& state,
                           const checkpoint::CheckpointIO& io) {
  auto& s = *state_;
  check_step_ready();  // every unit's pieces on its parameters
  if (s.options.checkpoint == FsdpCheckpoint::Dcp) {
    DcpSave plan = plan_dcp(group_, path, state, s.order);
    const auto* async = dynamic_cast<const checkpoint::AsyncFile*>(&io);
    if (async == nullptr) {
      write_dcp(group_, plan, checkpoint::SaveOptions{});
      return;
    }
    // Asynchronous (Checkpoints' {.async = true}): this rank's items copied now, written in
    // the writer's thread, whose collectives run on a gloo group of their own (made at the
    // first such save), as Python's dcp.async_save runs on one.
    if (!s.saves || s.saves->failed()) {
      try {
        s.saves = detail::side_group(group_, "asynchronous DCP saves");
      } catch (...) {
        group_.fail("making the group of asynchronous DCP saves", std::current_exception());
      }
    }
    c10::impl::GenericList values(c10::AnyType::get());  // the live ones, copied by run()
    for (auto& item : plan.mine) values.push_back(std::exchange(item.value, c10::IValue()));
    checkpoint::AsyncWriter& writer = async->writer();
    auto shared = std::make_shared<DcpSave>(std::move(plan));
    writer.run(values,
               [shared, group = s.saves, options = writer.options()](const c10::IValue& copy) {
                 const auto list = copy.toListRef();
                 for (std::size_t i = 0; i < list.size(); ++i) shared->mine[i].value = list[i];
                 write_dcp(*group, *shared, options);
               });
    return;
  }
  if (s.options.checkpoint == FsdpCheckpoint::Sharded && group_.world_size() > 1) {
    save_sharded(path, state, io);
    return;
  }
  // The consolidated file (FSDP2's full state dict): every sharded tensor gathered whole, on
  // every rank, rank 0 writes. The same file as SingleProcess and Ddp write of the model.
  const state::Dict top = state::save_entries(state);
  const auto found = slots(state, top, by_impl(s.order), piece_shaped);
  std::vector<std::pair<FsdpParam*, at::Tensor>> pieces;
  pieces.reserve(found.size());
  for (const auto& slot : found) pieces.emplace_back(slot.param, slot.dict.at(slot.key).toTensor());
  const auto whole = gather_whole(group_, pieces);
  for (std::size_t i = 0; i < found.size(); ++i) {
    found[i].dict.insert_or_assign(found[i].key, whole[i]);
  }
  group_.save_on_rank_zero(path, c10::IValue(top), io);
}

c10::IValue Fsdp::load_checkpoint(const std::filesystem::path& path, const State& state,
                                  const checkpoint::CheckpointIO& io, c10::Device device) {
  auto& s = *state_;
  check_step_ready();
  c10::IValue value;
  const int64_t rank = group_.rank(), world = group_.world_size();
  loom::detail::agree_on(group_, std::string(who) + ": loading " + path.string(), [&] {
    checkpoint::DeferredChecks checks;  // every CRC-32 inside the agreement
    if (checkpoint::dcp::is_checkpoint(path)) {
      // Python's DCP directory: of each sharded tensor only the chunks holding this rank's
      // rows are read, and only those rows kept.
      value = checkpoint::dcp::load(path, device, dcp_rows(state, by_impl(s.order), rank, world));
    } else {
      // Of a sharded Fsdp file only this rank's rows (a piece on any world size).
      value = checkpoint::merge_shards(
          path, io.load(path, device), io, device, {},
          [&](int64_t whole) { return checkpoint::rows_of(whole, rank, world); });
    }
    checks.finish();
  });
  if (!value.isGenericDict()) return value;  // rt.load names what is wrong
  // A whole tensor (saved by any strategy at any world size) cut to this rank's piece; one of
  // another shape (a piece already) is left as it is, for the entry's load to check.
  const auto found =
      slots(state, value.toGenericDict(), by_impl(s.order),
            [](const at::Tensor& t, const FsdpParam& f) { return t.sizes().vec() == f.sizes; });
  for (const auto& slot : found) {
    const FsdpParam& f = *slot.param;
    const at::Tensor whole = slot.dict.at(slot.key).toTensor();
    const int64_t first = std::min(rank * f.chunk, f.sizes[0]);
    slot.dict.insert_or_assign(slot.key, whole.narrow(0, first, f.local).clone());
  }
  return value;
}

}  // namespace loom::dist
