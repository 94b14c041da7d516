// loom::checkpoint::dcp's load (include/loom/checkpoint/dcp.hpp): a DCP directory's items read
// from their byte ranges (all of them, or the chunks of the rows a RowsOf asks for) into one
// nested state dict, an optimizer keyed by names keyed by ids again. The `.metadata` reader is
// src/checkpoint/dcp_metadata.cpp.
#include <loom/checkpoint/dcp.hpp>

#include <algorithm>
#include <fstream>
#include <optional>
#include <unordered_map>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <ATen/core/List.h>

#include <loom/checkpoint/io.hpp>
#include <loom/error.hpp>

namespace loom::checkpoint::dcp {
namespace {

/// The bytes of `where` in `dir`, read from that range alone.
std::string read_item(const std::filesystem::path& dir, const StorageInfo& where,
                      const std::string& key) {
  const auto path = dir / where.file;
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw Error("loom::checkpoint: " + path.string() + " (holding '" + key + "') is missing");
  in.seekg(0, std::ios::end);
  const auto size = static_cast<uint64_t>(in.tellg());
  if (where.offset > size || where.length > size - where.offset) {
    throw Error("loom::checkpoint: '" + key + "' lies at bytes " + std::to_string(where.offset) +
                "-" + std::to_string(where.offset + where.length) + " of " + path.string() +
                ", which has " + std::to_string(size) + " (truncated?)");
  }
  std::string bytes(static_cast<std::size_t>(where.length), '\0');
  in.seekg(static_cast<std::streamoff>(where.offset));
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!in) throw Error("loom::checkpoint: reading '" + key + "' from " + path.string() + " failed");
  return bytes;
}

/// `value` read as the torch.save file it should be; an error names `key`.
c10::IValue read_value(const std::filesystem::path& dir, const StorageInfo& where,
                       const std::string& key, ReadCount& count) {
  const std::string bytes = read_item(dir, where, key);  // its errors name the key and file
  ++count.items;
  count.bytes += static_cast<int64_t>(bytes.size());
  try {
    return checkpoint::load_bytes(bytes);
  } catch (const Error& e) {
    throw Error("loom::checkpoint: the item of '" + key + "' in " + (dir / where.file).string() +
                " is not readable: " + e.what());
  }
}

/// Sets `value` at `path[from..]` below `node` (a dict or a list), making the dicts and lists
/// on the way: a name step is a dict key, an index step a list position.
void place(c10::IValue& node, const std::vector<PathStep>& path, std::size_t from,
           c10::IValue value, const std::string& key) {
  const PathStep& step = path[from];
  const bool last = from + 1 == path.size();
  auto fresh = [&] {  // what the next step needs
    return std::holds_alternative<int64_t>(path[from + 1])
               ? c10::IValue(c10::impl::GenericList(c10::AnyType::get()))
               : c10::IValue(c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()));
  };
  if (const auto* name = std::get_if<std::string>(&step)) {
    if (!node.isGenericDict()) {
      throw Error("loom::checkpoint: the path of '" + key + "' names a key where a list is");
    }
    auto dict = node.toGenericDict();
    if (last) {
      dict.insert_or_assign(*name, std::move(value));
      return;
    }
    auto it = dict.find(*name);
    c10::IValue child = it != dict.end() ? it->value() : fresh();
    place(child, path, from + 1, std::move(value), key);
    dict.insert_or_assign(*name, child);
    return;
  }
  const int64_t index = std::get<int64_t>(step);
  if (!node.isList()) {
    throw Error("loom::checkpoint: the path of '" + key + "' gives an index where a dict is");
  }
  auto list = node.toList();
  if (index > static_cast<int64_t>(list.size()) + 4096) {
    throw Error("loom::checkpoint: the path of '" + key + "' gives the index " +
                std::to_string(index) + " of a list of " + std::to_string(list.size()));
  }
  while (static_cast<int64_t>(list.size()) <= index) list.push_back(c10::IValue());
  const auto i = static_cast<std::size_t>(index);
  if (last) {
    list.set(i, std::move(value));
    return;
  }
  c10::IValue child = list.get(i).isNone() ? fresh() : list.get(i);
  place(child, path, from + 1, std::move(value), key);
  list.set(i, child);
}

/// Whether `groups` is an optimizer's param_groups: a list of dicts, each with a "params" list.
bool param_groups(const c10::IValue& groups) {
  if (!groups.isList()) return false;
  for (const auto& g : groups.toListRef()) {
    if (!g.isGenericDict()) return false;
    const auto d = g.toGenericDict();
    const auto params = d.find("params");
    if (params == d.end() || !params->value().isList()) return false;
  }
  return true;
}

/// An optimizer state keyed by parameter names (get_state_dict's) keyed by ids instead, in the
/// order of the param_groups' "params"; one keyed by ids that flattening made strings ("0")
/// keyed by ints again; a "state" that flattening dropped (an empty dict leaves no item) made
/// empty again. Any other dict is left as it is.
void ids_for_names(c10::IValue& v) {
  if (!v.isGenericDict()) return;
  auto d = v.toGenericDict();
  const auto groups = d.find("param_groups");
  if (groups == d.end() || !param_groups(groups->value())) {
    for (auto& e : d) {
      c10::IValue child = e.value();
      ids_for_names(child);
    }
    return;
  }
  if (d.find("state") == d.end()) {
    d.insert("state", c10::impl::GenericDict(c10::IntType::get(), c10::AnyType::get()));
  }
  const auto state = d.find("state");
  if (!state->value().isGenericDict()) return;
  std::unordered_map<std::string, int64_t> ids;
  auto list = groups->value().toList();
  for (std::size_t g = 0; g < list.size(); ++g) {
    auto group = list.get(g).toGenericDict();
    c10::impl::GenericList numbered(c10::IntType::get());
    for (const auto& p : group.at("params").toList()) {
      std::string name;
      if (p.get().isInt()) {
        name = std::to_string(p.get().toInt());  // an id: its state's key, flattened
      } else if (p.get().isString()) {
        name = p.get().toStringRef();
      } else {
        return;  // not an optimizer's: as it is
      }
      const auto id = p.get().isInt() ? p.get().toInt() : static_cast<int64_t>(ids.size());
      if (!ids.emplace(name, id).second) {
        throw Error("loom::checkpoint: the optimizer's param_groups name '" + name + "' twice");
      }
      numbered.push_back(id);
    }
    group.insert_or_assign("params", numbered);
  }
  c10::impl::GenericDict by_id(c10::IntType::get(), c10::AnyType::get());
  for (const auto& e : state->value().toGenericDict()) {
    if (e.key().isInt()) {
      by_id.insert(e.key(), e.value());
      continue;
    }
    if (!e.key().isString()) return;
    const auto it = ids.find(e.key().toStringRef());
    if (it == ids.end()) {
      throw Error("loom::checkpoint: the optimizer's state names '" + e.key().toStringRef() +
                  "', which no param_group lists");
    }
    by_id.insert(it->second, e.value());
  }
  // In id order, as optimizer.state_dict() lists them.
  c10::impl::GenericDict sorted(c10::IntType::get(), c10::AnyType::get());
  std::vector<int64_t> keys;
  for (const auto& e : by_id) keys.push_back(e.key().toInt());
  std::sort(keys.begin(), keys.end());
  for (const auto k : keys) sorted.insert(k, by_id.at(k));
  d.insert_or_assign("state", sorted);
}

}  // namespace

c10::IValue load(const std::filesystem::path& dir, c10::Device device) {
  return load(dir, device, nullptr);
}

c10::IValue load(const std::filesystem::path& dir, c10::Device device, const RowsOf& rows_of,
                 ReadCount* count, const Skip& skip) {
  ReadCount read;
  Metadata m = read_metadata(dir);
  if (skip) {
    auto skipped = [&](const std::string& key) {
      const auto it = m.paths.find(key);
      return skip(it != m.paths.end() ? it->second : std::vector<PathStep>{key});
    };
    std::erase_if(m.tensors, [&](const auto& item) { return skipped(item.first); });
    std::erase_if(m.objects, [&](const auto& item) { return skipped(item.first); });
  }
  // Every chunk's item holds at least the chunk's bytes and lies inside its file: checked
  // before any tensor is allocated, so a metadata that claims more than the files hold is an
  // error naming the key, not an allocation of what it claims.
  std::map<std::string, std::optional<uint64_t>> sizes;  // none: the file is missing
  for (const auto& [key, t] : m.tensors) {
    for (const auto& chunk : t.chunks) {
      const auto path = dir / chunk.where.file;
      auto it = sizes.find(chunk.where.file);
      if (it == sizes.end()) {
        std::error_code ec;
        const auto n = std::filesystem::file_size(path, ec);
        it = sizes.emplace(chunk.where.file, ec ? std::nullopt : std::optional<uint64_t>(n)).first;
      }
      if (!it->second) {
        throw Error("loom::checkpoint: " + path.string() + " (holding '" + key + "') is missing");
      }
      uint64_t bytes = static_cast<uint64_t>(c10::elementSize(t.dtype));
      for (const auto d : chunk.sizes) bytes *= static_cast<uint64_t>(d);
      const uint64_t size = *it->second;
      if (chunk.where.length < bytes || chunk.where.offset > size ||
          chunk.where.length > size - chunk.where.offset) {
        throw Error("loom::checkpoint: a chunk of '" + key + "' (" + std::to_string(bytes) +
                    " bytes) is said to lie at bytes " + std::to_string(chunk.where.offset) + "-" +
                    std::to_string(chunk.where.offset + chunk.where.length) + " of " +
                    path.string() + ", which has " + std::to_string(size) +
                    " (truncated, or not this checkpoint's)");
      }
    }
  }
  c10::IValue root(c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()));
  auto put = [&](const std::string& key, c10::IValue value) {
    const auto it = m.paths.find(key);
    const std::vector<PathStep> own{key};
    place(root, it != m.paths.end() ? it->second : own, 0, std::move(value), key);
  };
  for (const auto& [key, t] : m.tensors) {
    // The rows wanted, [first, last) of dim 0: all of them unless rows_of asks for fewer.
    int64_t first = 0, last = t.size.empty() ? 1 : t.size[0];
    if (rows_of && !t.size.empty()) {
      const auto it = m.paths.find(key);
      const std::vector<PathStep> own{key};
      if (const auto rows = rows_of(it != m.paths.end() ? it->second : own, t.size)) {
        if (rows->first < 0 || rows->second < 0 || rows->first > t.size[0] - rows->second) {
          throw Error("loom::checkpoint: rows " + std::to_string(rows->first) + "+" +
                      std::to_string(rows->second) + " asked of '" + key + "', which has " +
                      std::to_string(t.size[0]));
        }
        first = rows->first;
        last = rows->first + rows->second;
      }
    }
    std::vector<int64_t> shape = t.size;
    if (!shape.empty()) shape[0] = last - first;
    at::Tensor out = at::empty(shape, at::TensorOptions().dtype(t.dtype));
    for (const auto& chunk : t.chunks) {
      // The chunk's rows that are wanted; a chunk holding none of them is not read.
      const bool rows = !chunk.offsets.empty();
      const int64_t from = rows ? std::max(first, chunk.offsets[0]) : 0;
      const int64_t to = rows ? std::min(last, chunk.offsets[0] + chunk.sizes[0]) : 0;
      if (rows && from >= to && !(first == 0 && last == t.size[0])) continue;
      const c10::IValue v = read_value(dir, chunk.where, key, read);
      if (!v.isTensor() || v.toTensor().scalar_type() != t.dtype ||
          v.toTensor().sizes().vec() != chunk.sizes) {
        throw Error("loom::checkpoint: the item of '" + key + "' in " +
                    (dir / chunk.where.file).string() + " is not the " + c10::toString(t.dtype) +
                    " chunk of the size its metadata gives");
      }
      at::Tensor region = out;
      at::Tensor piece = v.toTensor();
      if (rows) {
        region = region.narrow(0, from - first, std::max<int64_t>(to - from, 0));
        piece = piece.narrow(0, from - chunk.offsets[0], std::max<int64_t>(to - from, 0));
      }
      for (std::size_t d = 1; d < chunk.offsets.size(); ++d) {
        region = region.narrow(static_cast<int64_t>(d), chunk.offsets[d], chunk.sizes[d]);
      }
      region.copy_(piece);
    }
    put(key, device.is_cpu() ? out : out.to(device));
  }
  for (const auto& [key, where] : m.objects) put(key, read_value(dir, where, key, read));
  for (auto& e : root.toGenericDict()) {
    c10::IValue v = e.value();
    ids_for_names(v);
  }
  if (count != nullptr) *count = read;
  return root;
}

}  // namespace loom::checkpoint::dcp
