// Sharded checkpoints (checkpoint/shards.hpp): the index in the main file, the shard files'
// names, and reading shards back into one value.
#include <loom/checkpoint/shards.hpp>

#include <algorithm>
#include <chrono>
#include <exception>
#include <iomanip>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <ATen/core/List.h>

#include <loom/error.hpp>

#include "../state/optimizer_shards.hpp"

namespace loom::checkpoint {

namespace {

const std::string& index_key() {
  static const std::string key(shard_index_key);
  return key;
}

[[noreturn]] void bad_index(const std::filesystem::path& path, const std::string& why) {
  throw Error("loom: the shard index ('" + index_key() + "') of " + path.string() + " " + why);
}

std::vector<std::int64_t> ints(const c10::impl::GenericDict& d, const char* key,
                               const std::filesystem::path& path) {
  if (!d.contains(key) || !d.at(key).isList())
    bad_index(path, std::string("has no list '") + key + "'");
  std::vector<std::int64_t> out;
  for (const c10::IValue& v : d.at(key).toListRef()) {
    if (!v.isInt()) bad_index(path, std::string("has a non-integer in '") + key + "'");
    out.push_back(v.toInt());
  }
  return out;
}

c10::impl::GenericList int_list(const std::vector<std::int64_t>& values) {
  c10::impl::GenericList out(c10::IntType::get());
  for (auto v : values) out.push_back(v);
  return out;
}

c10::impl::GenericList path_list(const std::vector<std::vector<c10::IValue>>& slots) {
  c10::impl::GenericList out(c10::ListType::create(c10::AnyType::get()));
  for (const auto& slot : slots) {
    c10::impl::GenericList keys(c10::AnyType::get());
    for (const auto& k : slot) keys.push_back(k);
    out.push_back(keys);
  }
  return out;
}

/// The slots of a list of key lists (strings and integers); nullopt where it is not one.
std::optional<std::vector<std::vector<c10::IValue>>> slot_paths(const c10::IValue& v) {
  if (!v.isList()) return std::nullopt;
  std::vector<std::vector<c10::IValue>> out;
  for (const c10::IValue& slot : v.toListRef()) {
    if (!slot.isList() || slot.toListRef().empty()) return std::nullopt;
    std::vector<c10::IValue> keys;
    for (const c10::IValue& k : slot.toListRef()) {
      if (!k.isString() && !k.isInt()) return std::nullopt;
      keys.push_back(k);
    }
    out.push_back(std::move(keys));
  }
  return out;
}

/// A slot's keys as one string: "optimizer/state/2/exp_avg".
std::string slot_name(const std::vector<c10::IValue>& slot) {
  std::string out;
  for (const auto& k : slot) {
    if (!out.empty()) out += '/';
    out += k.isString() ? k.toStringRef() : std::to_string(k.toInt());
  }
  return out;
}

/// The dict that holds `slot`'s last key, if `top` has every dict on the way.
std::optional<c10::impl::GenericDict> holder(const c10::IValue& top,
                                             const std::vector<c10::IValue>& slot) {
  if (!top.isGenericDict()) return std::nullopt;
  auto d = top.toGenericDict();
  for (std::size_t i = 0; i + 1 < slot.size(); ++i) {
    if (!d.contains(slot[i]) || !d.at(slot[i]).isGenericDict()) return std::nullopt;
    d = d.at(slot[i]).toGenericDict();
  }
  return d;
}

/// One file of a sharded checkpoint as io loads it; a missing or unreadable one is a
/// loom::Error naming it and `main`.
c10::IValue load_shard(const std::filesystem::path& main, const std::filesystem::path& file,
                       const CheckpointIO& io, c10::Device device) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) {
    throw Error("loom: " + main.string() + " names the shard file " + file.string() +
                ", which is missing (the save that wrote it did not finish on every rank)");
  }
  c10::IValue shard;
  try {
    shard = io.load(file, device);
  } catch (const std::exception& e) {
    throw Error("loom: the shard file " + file.string() + " of " + main.string() +
                " does not load: " + e.what());
  }
  if (!shard.isGenericDict()) {
    throw Error("loom: the shard file " + file.string() + " does not hold a dict");
  }
  return shard;
}

/// Format 2: each slot of `index` assembled in `top` from the pieces of the files that hold
/// the rows `rows` names (all by default).
void merge_pieces(c10::IValue& top, const ShardIndex& index, const std::filesystem::path& path,
                  const CheckpointIO& io, c10::Device device,
                  const std::function<Rows(std::int64_t whole)>& rows) {
  const std::int64_t world = index.world_size;
  auto wanted = [&](std::size_t i) {
    const std::int64_t whole = index.rows[i];
    const Rows want = rows ? rows(whole) : Rows{0, whole};
    if (want.first < 0 || want.count < 0 || want.first + want.count > whole) {
      throw Error("loom: rows [" + std::to_string(want.first) + ", " +
                  std::to_string(want.first + want.count) + ") asked of " +
                  slot_name(index.slots[i]) + " in " + path.string() + ", which has " +
                  std::to_string(whole));
    }
    return want;
  };
  auto overlap = [](Rows a, Rows b) {
    const std::int64_t lo = std::max(a.first, b.first);
    const std::int64_t hi = std::min(a.first + a.count, b.first + b.count);
    return Rows{lo, std::max<std::int64_t>(hi - lo, 0)};
  };
  // The files that hold some wanted row, each read once: its pieces by slot name.
  std::vector<std::map<std::string, at::Tensor>> files(static_cast<std::size_t>(world));
  for (std::int64_t r = 1; r < world; ++r) {
    bool needed = false;
    for (std::size_t i = 0; i < index.slots.size() && !needed; ++i) {
      needed = overlap(wanted(i), rows_of(index.rows[i], r, world)).count > 0;
    }
    if (!needed) continue;
    const auto file = path.parent_path() / index.files[static_cast<std::size_t>(r - 1)];
    const auto shard = load_shard(path, file, io, device).toGenericDict();
    const auto slots = shard.contains("slots") ? slot_paths(shard.at("slots")) : std::nullopt;
    if (!slots || !shard.contains("pieces") || !shard.at("pieces").isList() ||
        shard.at("pieces").toListRef().size() != slots->size()) {
      throw Error("loom: the shard file " + file.string() +
                  " does not hold a list 'slots' and as many 'pieces'");
    }
    const auto& pieces = shard.at("pieces").toListRef();
    for (std::size_t i = 0; i < slots->size(); ++i) {
      if (!pieces[i].isTensor()) {
        throw Error("loom: the shard file " + file.string() + " holds a piece of " +
                    slot_name((*slots)[i]) + " that is not a tensor");
      }
      files[static_cast<std::size_t>(r)][slot_name((*slots)[i])] = pieces[i].toTensor();
    }
  }
  for (std::size_t i = 0; i < index.slots.size(); ++i) {
    const auto& slot = index.slots[i];
    const std::string name = slot_name(slot);
    auto d = holder(top, slot);
    if (!d || !d->contains(slot.back()) || !d->at(slot.back()).isTensor()) {
      throw Error("loom: " + path.string() + " indexes " + name + ", which it does not hold");
    }
    const at::Tensor first = d->at(slot.back()).toTensor();
    const Rows want = wanted(i);
    std::vector<at::Tensor> parts;
    for (std::int64_t r = 0; r < world; ++r) {
      const Rows have = rows_of(index.rows[i], r, world);
      const Rows take = overlap(want, have);
      if (take.count == 0) continue;
      const std::string where =
          r == 0 ? path.string()
                 : (path.parent_path() / index.files[static_cast<std::size_t>(r - 1)]).string();
      at::Tensor piece = first;
      if (r > 0) {
        const auto& held = files[static_cast<std::size_t>(r)];
        const auto it = held.find(name);
        if (it == held.end()) throw Error("loom: the shard file " + where + " has no " + name);
        piece = it->second;
      }
      if (piece.dim() == 0 || piece.size(0) != have.count) {
        throw Error("loom: " + where + " holds " + std::to_string(piece.dim() ? piece.size(0) : 0) +
                    " rows of " + name + " where rank " + std::to_string(r) + " of " +
                    std::to_string(world) + " has " + std::to_string(have.count));
      }
      parts.push_back(piece.narrow(0, take.first - have.first, take.count));
    }
    at::Tensor out = parts.empty()       ? first.narrow(0, 0, 0)
                     : parts.size() == 1 ? parts.front()
                                         : at::cat(parts, 0);
    d->insert_or_assign(slot.back(), out);
  }
}

}  // namespace

bool has_shard_index(const c10::IValue& value) {
  return value.isGenericDict() && value.toGenericDict().contains(index_key());
}

ShardIndex shard_index(const c10::IValue& value, const std::filesystem::path& path) {
  if (!has_shard_index(value)) bad_index(path, "is missing");
  const c10::IValue& v = value.toGenericDict().at(index_key());
  if (!v.isGenericDict()) bad_index(path, "is not a dict");
  const auto d = v.toGenericDict();
  if (!d.contains("format") || !d.at("format").isInt() ||
      (d.at("format").toInt() != 1 && d.at("format").toInt() != 2)) {
    bad_index(path, "is not of format 1 or 2 (a newer loom wrote it?)");
  }
  ShardIndex index;
  index.format = d.at("format").toInt();
  if (!d.contains("world_size") || !d.at("world_size").isInt() || d.at("world_size").toInt() < 1) {
    bad_index(path, "has no positive 'world_size'");
  }
  index.world_size = d.at("world_size").toInt();
  if (!d.contains("files") || !d.at("files").isList()) bad_index(path, "has no list 'files'");
  for (const c10::IValue& f : d.at("files").toListRef()) {
    if (!f.isString()) bad_index(path, "has a file name that is not a string");
    const std::string name = f.toStringRef();
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
      bad_index(path, "names '" + name + "', not a file beside it");
    }
    index.files.push_back(name);
  }
  if (static_cast<std::int64_t>(index.files.size()) != index.world_size - 1) {
    bad_index(path, "names " + std::to_string(index.files.size()) + " files for a world of " +
                        std::to_string(index.world_size) + " (one per rank but rank 0)");
  }
  if (index.format == 2) {
    const auto slots = d.contains("slots") ? slot_paths(d.at("slots")) : std::nullopt;
    if (!slots) bad_index(path, "has no list 'slots' of key lists");
    index.slots = *slots;
    index.rows = ints(d, "rows", path);
    if (index.rows.size() != index.slots.size()) {
      bad_index(path, "has " + std::to_string(index.slots.size()) + " slots and " +
                          std::to_string(index.rows.size()) + " row counts");
    }
    for (auto r : index.rows) {
      if (r < 0) bad_index(path, "has a negative row count");
    }
    return index;
  }
  index.owners = ints(d, "owners", path);
  index.numels = ints(d, "numels", path);
  if (index.owners.size() != index.numels.size()) {
    bad_index(path, "has " + std::to_string(index.owners.size()) + " owners and " +
                        std::to_string(index.numels.size()) + " element counts");
  }
  return index;
}

c10::IValue with_shard_index(const c10::IValue& value, const ShardIndex& index) {
  if (!value.isGenericDict()) throw Error("loom: a sharded checkpoint's value must be a dict");
  auto top = value.toGenericDict().copy();
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("format", index.format);
  d.insert("world_size", index.world_size);
  c10::impl::GenericList files(c10::StringType::get());
  for (const auto& f : index.files) files.push_back(f);
  d.insert("files", files);
  if (index.format == 2) {
    d.insert("slots", path_list(index.slots));
    d.insert("rows", int_list(index.rows));
  } else {
    d.insert("owners", int_list(index.owners));
    d.insert("numels", int_list(index.numels));
  }
  top.insert_or_assign(index_key(), d);
  return top;
}

std::filesystem::path shard_path(const std::filesystem::path& path, std::string_view tag, int rank,
                                 int world) {
  std::string name = path.stem().string();
  name += ".";
  name += tag;
  name += ".shard-" + std::to_string(rank) + "-of-" + std::to_string(world) + ".pt";
  return path.parent_path() / name;
}

Rows rows_of(std::int64_t whole, std::int64_t rank, std::int64_t world) {
  const std::int64_t chunk = (whole + world - 1) / world;
  const std::int64_t first = std::min(rank * chunk, whole);
  return Rows{first, std::min(chunk, whole - first)};
}

c10::IValue pieces_file(const std::vector<std::vector<c10::IValue>>& slots,
                        const std::vector<at::Tensor>& pieces) {
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("slots", path_list(slots));
  c10::impl::GenericList tensors(c10::TensorType::get());
  for (const auto& t : pieces) tensors.push_back(t);
  d.insert("pieces", tensors);
  return d;
}

void read_shard(c10::IValue& value, const std::filesystem::path& main,
                const std::filesystem::path& file, const CheckpointIO& io, c10::Device device) {
  const c10::IValue shard = load_shard(main, file, io, device);
  auto top = value.toGenericDict();
  for (const auto& item : shard.toGenericDict()) {
    const std::string name = item.key().isString() ? item.key().toStringRef() : "?";
    auto states = state::optimizer_state_of(top, name);
    if (!states || !item.value().isGenericDict()) {
      throw Error("loom: the shard file " + file.string() + " holds states of '" + name +
                  "', which " + main.string() + " has no optimizer entry for");
    }
    for (const auto& e : item.value().toGenericDict()) states->insert_or_assign(e.key(), e.value());
  }
}

c10::IValue merge_shards(const std::filesystem::path& path, c10::IValue value,
                         const CheckpointIO& io, c10::Device device,
                         const std::function<bool(int rank)>& wanted,
                         const std::function<Rows(std::int64_t whole)>& rows) {
  if (!has_shard_index(value)) return value;
  const ShardIndex index = shard_index(value, path);
  auto top = value.toGenericDict().copy();
  (void)top.erase(index_key());
  c10::IValue out(top);
  if (index.format == 2) {
    merge_pieces(out, index, path, io, device, rows);
    return out;
  }
  for (std::size_t i = 0; i < index.files.size(); ++i) {
    if (wanted && !wanted(static_cast<int>(i) + 1)) continue;
    read_shard(out, path, path.parent_path() / index.files[i], io, device);
  }
  return out;
}

std::string new_shard_tag() {
  const auto now = static_cast<std::uint64_t>(std::chrono::system_clock::now().time_since_epoch() /
                                              std::chrono::nanoseconds(1));
  const std::uint64_t mixed = now ^ (static_cast<std::uint64_t>(std::random_device{}()) << 32);
  std::ostringstream out;
  out << std::hex << std::setw(16) << std::setfill('0') << mixed;
  return out.str();
}

void remove_other_shards(const std::filesystem::path& path, const std::string& tag) {
  for (const auto& [file, other] : shard_files(path)) {
    if (other == tag) continue;
    std::error_code ec;
    std::filesystem::remove(file, ec);
  }
}

std::vector<std::pair<std::filesystem::path, std::string>> shard_files(
    const std::filesystem::path& path) {
  const std::string head = path.stem().string() + ".", tail = ".pt", mark = ".shard-";
  std::vector<std::pair<std::filesystem::path, std::string>> out;
  std::error_code ec;
  const auto dir = path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path();
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() <= head.size() + tail.size() || name.compare(0, head.size(), head) != 0 ||
        name.compare(name.size() - tail.size(), tail.size(), tail) != 0) {
      continue;
    }
    // TAG.shard-R-of-W: a hexadecimal tag, then the rank and world size.
    const std::string middle = name.substr(head.size(), name.size() - head.size() - tail.size());
    const auto at = middle.find(mark);
    if (at == std::string::npos || at == 0) continue;
    const std::string tag = middle.substr(0, at), rest = middle.substr(at + mark.size());
    const auto of = rest.find("-of-");
    auto digits = [](const std::string& s) {
      return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
    };
    if (tag.find_first_not_of("0123456789abcdef") != std::string::npos || of == std::string::npos ||
        !digits(rest.substr(0, of)) || !digits(rest.substr(of + 4))) {
      continue;
    }
    out.emplace_back(e.path(), tag);
  }
  return out;
}

}  // namespace loom::checkpoint
