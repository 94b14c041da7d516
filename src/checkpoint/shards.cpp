// Sharded checkpoints (checkpoint/shards.hpp): the index in the main file, the shard files'
// names, and reading shards back into one value.
#include <loom/checkpoint/shards.hpp>

#include <exception>
#include <string>
#include <utility>

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

}  // namespace

bool has_shard_index(const c10::IValue& value) {
  return value.isGenericDict() && value.toGenericDict().contains(index_key());
}

ShardIndex shard_index(const c10::IValue& value, const std::filesystem::path& path) {
  if (!has_shard_index(value)) bad_index(path, "is missing");
  const c10::IValue& v = value.toGenericDict().at(index_key());
  if (!v.isGenericDict()) bad_index(path, "is not a dict");
  const auto d = v.toGenericDict();
  if (!d.contains("format") || !d.at("format").isInt() || d.at("format").toInt() != 1) {
    bad_index(path, "is not of format 1 (a newer loom wrote it?)");
  }
  ShardIndex index;
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
  d.insert("format", std::int64_t{1});
  d.insert("world_size", index.world_size);
  c10::impl::GenericList files(c10::StringType::get());
  for (const auto& f : index.files) files.push_back(f);
  d.insert("files", files);
  d.insert("owners", int_list(index.owners));
  d.insert("numels", int_list(index.numels));
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

void read_shard(c10::IValue& value, const std::filesystem::path& main,
                const std::filesystem::path& file, const CheckpointIO& io, c10::Device device) {
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
                         const std::function<bool(int rank)>& wanted) {
  if (!has_shard_index(value)) return value;
  const ShardIndex index = shard_index(value, path);
  auto top = value.toGenericDict().copy();
  (void)top.erase(index_key());
  c10::IValue out(top);
  for (std::size_t i = 0; i < index.files.size(); ++i) {
    if (wanted && !wanted(static_cast<int>(i) + 1)) continue;
    read_shard(out, path, path.parent_path() / index.files[i], io, device);
  }
  return out;
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
