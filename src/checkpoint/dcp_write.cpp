// loom::checkpoint::dcp's writing (include/loom/checkpoint/dcp.hpp): a state dict flattened as
// DCP flattens it, its items written one after another to a `__R_0.distcp` file, the
// `.metadata` pickled as Python pickles DCP's dataclasses, and the staged directory published
// by one rename. loom::Fsdp's sharded save (src/dist/fsdp_checkpoint.cpp) uses these pieces.
#include <loom/checkpoint/dcp.hpp>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <system_error>
#include <utility>

#include <fcntl.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <ATen/core/List.h>

#include <loom/checkpoint/io.hpp>
#include <loom/checkpoint/pickle.hpp>
#include <loom/error.hpp>

#include "temp_file.hpp"

namespace loom::checkpoint::dcp {

namespace {

// ---- flattening ---------------------------------------------------------------------------

/// Whether DCP's traversal walks into `v` (_traverse_obj: a dict always; a list when one of
/// its elements is a tensor, a dict or a list it walks into) rather than keep it as one leaf.
bool walked(const c10::IValue& v) {
  if (v.isGenericDict()) return true;
  if (!v.isList()) return false;
  for (const auto& e : v.toListRef()) {
    if (e.isTensor() || walked(e)) return true;
  }
  return false;
}

std::string step_text(const PathStep& s) {
  if (const auto* name = std::get_if<std::string>(&s)) return *name;
  return std::to_string(std::get<int64_t>(s));
}

void walk(const c10::IValue& v, std::vector<PathStep>& path, std::vector<WriteItem>& out) {
  if (v.isGenericDict()) {
    for (const auto& e : v.toGenericDict()) {
      const c10::IValue& k = e.key();
      if (k.isString()) {
        path.emplace_back(k.toStringRef());
      } else if (k.isInt()) {
        path.emplace_back(std::to_string(k.toInt()));  // str(key), as DCP's traversal
      } else {
        throw Error("loom::checkpoint: a DCP checkpoint's dict keys are strings or ints; one is " +
                    k.type()->str());
      }
      walk(e.value(), path, out);
      path.pop_back();
    }
    return;
  }
  if (walked(v)) {
    const auto list = v.toListRef();
    for (std::size_t i = 0; i < list.size(); ++i) {
      path.emplace_back(static_cast<int64_t>(i));
      walk(list[i], path, out);
      path.pop_back();
    }
    return;
  }
  WriteItem item;
  for (const auto& s : path) {
    if (!item.key.empty()) item.key += '.';
    item.key += step_text(s);
  }
  item.path = path;
  item.value = v;
  if (v.isTensor()) {
    item.size = v.toTensor().sizes().vec();
    item.offsets.assign(item.size.size(), 0);
  }
  out.push_back(std::move(item));
}

// ---- the `.metadata` pickle ---------------------------------------------------------------

/// Pickles DCP's Metadata as Python's pickle (protocol 2's opcodes) writes it: each dataclass
/// by NEWOBJ of its class and BUILD with its fields; torch.Size, layouts and the memory-format
/// encoding by REDUCE, dtypes as globals of module torch. Python's pickle.load (DCP's
/// FileSystemReader) rebuilds the objects; loom's parse_metadata reads it back.
class MetadataPickler {
 public:
  std::string pickle(const Metadata& m) {
    put(0x80);
    put(2);  // PROTO 2
    object("Metadata");
    put('}');
    put('(');
    string("state_dict_metadata");
    put('}');
    if (!m.tensors.empty() || !m.objects.empty()) {
      put('(');
      for (const auto& [key, t] : m.tensors) {
        string(key);
        tensor_metadata(t);
      }
      for (const auto& [key, where] : m.objects) {
        (void)where;
        string(key);
        object("BytesStorageMetadata");
      }
      put('u');
    }
    string("planner_data");
    put('}');
    if (!m.paths.empty()) {
      put('(');
      for (const auto& [key, path] : m.paths) {
        string(key);
        put('(');
        for (const auto& s : path) {
          if (const auto* name = std::get_if<std::string>(&s)) {
            string(*name);
          } else {
            integer(std::get<int64_t>(s));
          }
        }
        put('t');
      }
      put('u');
    }
    string("storage_data");
    put('}');
    bool any = false;
    for (const auto& [key, t] : m.tensors) {
      for (std::size_t i = 0; i < t.chunks.size(); ++i) {
        if (!any) put('(');
        any = true;
        index(key, &t.chunks[i].offsets, static_cast<int64_t>(i));
        storage_info(t.chunks[i].where);
      }
    }
    for (const auto& [key, where] : m.objects) {
      if (!any) put('(');
      any = true;
      index(key, nullptr, 0);
      storage_info(where);
    }
    if (any) put('u');
    string("storage_meta");
    put('N');
    string("version");
    string(m.version.empty() ? "1.0.0" : m.version);
    put('u');
    put('b');  // BUILD the Metadata
    put('.');
    return std::move(out_);
  }

 private:
  void put(int c) { out_.push_back(static_cast<char>(c)); }
  void string(std::string_view s) {
    put('X');  // BINUNICODE
    const auto n = static_cast<uint32_t>(s.size());
    char b[4];
    std::memcpy(b, &n, 4);  // the host is little-endian (checkpoint/io.hpp)
    out_.append(b, 4);
    out_.append(s.data(), s.size());
  }
  void integer(int64_t v) {
    if (v >= INT32_MIN && v <= INT32_MAX) {
      put('J');  // BININT
      const auto x = static_cast<int32_t>(v);
      char b[4];
      std::memcpy(b, &x, 4);
      out_.append(b, 4);
      return;
    }
    put(0x8a);  // LONG1, 8 bytes of two's complement
    put(8);
    char b[8];
    std::memcpy(b, &v, 8);
    out_.append(b, 8);
  }
  void global(std::string_view module, std::string_view name) {
    put('c');
    out_.append(module);
    put('\n');
    out_.append(name);
    put('\n');
  }
  /// An instance of DCP's class `name` (NEWOBJ with no arguments); the caller BUILDs it.
  void object(std::string_view name) {
    if (name == "_StorageInfo") {
      global("torch.distributed.checkpoint.filesystem", name);
    } else {
      global("torch.distributed.checkpoint.metadata", name);
    }
    put(')');
    put(0x81);  // NEWOBJ
  }
  void size(const std::vector<int64_t>& dims) {  // torch.Size(tuple)
    global("torch", "Size");
    put('(');
    put('(');
    for (const auto d : dims) integer(d);
    put('t');
    put('t');
    put('R');
  }
  void tensor_metadata(const TensorEntry& t) {
    object("TensorStorageMetadata");
    put('}');
    put('(');
    string("properties");
    object("TensorProperties");
    // TensorProperties.__setstate__'s tuple: dtype, layout, requires_grad, memory format
    // (its encoding: 0, contiguous), pin_memory (the 5-tuple without strides; torch 2.15 reads 5 or
    // 6).
    put('(');
    const detail::DtypeName* dtype = detail::dtype_name(t.dtype);
    if (dtype == nullptr) {
      throw Error(std::string("loom::checkpoint: DCP cannot hold a tensor of ") +
                  c10::toString(t.dtype));
    }
    global("torch", dtype->python);
    global("torch.serialization", "_get_layout");
    string("torch.strided");
    put(0x85);  // TUPLE1
    put('R');
    put(0x89);  // False
    global("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING");
    integer(0);
    put(0x85);
    put('R');
    put(0x89);
    put('t');
    put('b');
    string("size");
    size(t.size);
    string("chunks");
    put(']');
    if (!t.chunks.empty()) {
      put('(');
      for (const auto& c : t.chunks) {
        object("ChunkStorageMetadata");
        put('}');
        put('(');
        string("offsets");
        size(c.offsets);
        string("sizes");
        size(c.sizes);
        put('u');
        put('b');
      }
      put('e');  // APPENDS
    }
    put('u');
    put('b');
  }
  void index(const std::string& key, const std::vector<int64_t>* offsets, int64_t i) {
    object("MetadataIndex");
    put('}');
    put('(');
    string("fqn");
    string(key);
    if (offsets != nullptr) {
      string("offset");
      size(*offsets);
      string("index");
      integer(i);
    } else {
      string("index");
      put('N');
    }
    put('u');
    put('b');
  }
  void storage_info(const StorageInfo& where) {
    object("_StorageInfo");
    put('}');
    put('(');
    string("relative_path");
    string(where.file);
    string("offset");
    integer(static_cast<int64_t>(where.offset));
    string("length");
    integer(static_cast<int64_t>(where.length));
    put('u');
    put('b');
  }

  std::string out_;
};

}  // namespace

std::vector<WriteItem> flatten(const c10::IValue& state) {
  if (!state.isGenericDict()) {
    throw Error("loom::checkpoint: a DCP checkpoint holds a dict; this value is " +
                state.type()->str());
  }
  std::vector<WriteItem> out;
  std::vector<PathStep> path;
  walk(state, path, out);
  std::set<std::string> keys;
  for (const auto& item : out) {
    if (!keys.insert(item.key).second) {
      throw Error("loom::checkpoint: two values of the state flatten to the DCP key '" + item.key +
                  "'");
    }
  }
  return out;
}

void key_by_names(c10::IValue& optimizer, const std::vector<std::string>& names) {
  if (!optimizer.isGenericDict()) return;
  auto d = optimizer.toGenericDict();
  const auto state = d.find("state");
  const auto groups = d.find("param_groups");
  if (state == d.end() || groups == d.end() || !state->value().isGenericDict() ||
      !groups->value().isList()) {
    return;
  }
  auto name_of = [&](const c10::IValue& id) -> const std::string& {
    if (!id.isInt() || id.toInt() < 0 || id.toInt() >= static_cast<int64_t>(names.size())) {
      throw Error("loom::checkpoint: the optimizer's parameter " + c10::str(id) +
                  " has no name (a DCP checkpoint keys an optimizer's state by the names of "
                  "the module's parameters)");
    }
    return names[static_cast<std::size_t>(id.toInt())];
  };
  c10::impl::GenericDict named(c10::StringType::get(), c10::AnyType::get());
  for (const auto& e : state->value().toGenericDict()) named.insert(name_of(e.key()), e.value());
  auto list = groups->value().toList();
  for (std::size_t g = 0; g < list.size(); ++g) {
    if (!list.get(g).isGenericDict()) continue;
    auto group = list.get(g).toGenericDict();
    const auto params = group.find("params");
    if (params == group.end() || !params->value().isList()) continue;
    c10::impl::GenericList by_name(c10::StringType::get());
    for (const auto& p : params->value().toList()) by_name.push_back(name_of(p.get()));
    group.insert_or_assign("params", by_name);
  }
  d.insert_or_assign("state", named);
}

std::vector<StorageInfo> write_items(const std::filesystem::path& file,
                                     const std::vector<WriteItem>& items,
                                     const SaveOptions& options) {
  std::vector<StorageInfo> out;
  out.reserve(items.size());
  detail::TempFile f(file);
  for (const auto& item : items) {
    c10::IValue value = item.value;
    if (value.isTensor()) {
      // The chunk alone (not the storage it may view), on the host.
      value = value.toTensor().detach().to(at::kCPU).contiguous().clone();
    }
    const std::string bytes = save_bytes(value);
    out.push_back(StorageInfo{file.filename().string(), f.size(), bytes.size()});
    f.write(bytes.data(), bytes.size());
    if (f.error() != 0) {
      throw Error("loom::checkpoint: writing " + file.string() +
                  " failed: " + std::strerror(f.error()));
    }
  }
  f.close(options.sync);
  f.keep();
  return out;
}

void describe(Metadata& m, const std::vector<WriteItem>& items,
              const std::vector<StorageInfo>& where) {
  for (std::size_t i = 0; i < items.size(); ++i) {
    const WriteItem& item = items[i];
    if (!item.value.isTensor()) {
      m.objects.emplace(item.key, where[i]);
      continue;
    }
    TensorEntry& t = m.tensors[item.key];
    t.dtype = item.value.toTensor().scalar_type();
    t.size = item.size;
    t.chunks.push_back(Chunk{item.offsets, item.value.toTensor().sizes().vec(), where[i]});
  }
}

std::string metadata_bytes(const Metadata& m) {
  std::string bytes = MetadataPickler().pickle(m);
  (void)parse_metadata(bytes, "the metadata being written");  // its checks: chunks tile, ...
  return bytes;
}

std::filesystem::path staging_dir(const std::filesystem::path& dir, const std::string& tag) {
  const auto name = dir.filename().string();
  return (dir.has_parent_path() ? dir.parent_path() : std::filesystem::path(".")) /
         ("." + name + ".partial-" + tag);
}

void publish(const std::filesystem::path& staged, const std::filesystem::path& dir,
             const Metadata& metadata, const SaveOptions& options) {
  const std::string bytes = metadata_bytes(metadata);
  detail::write_atomically(
      staged / ".metadata", "loom::checkpoint",
      [&](detail::TempFile& f) { f.write(bytes.data(), bytes.size()); }, options.sync);
  const auto parent = dir.has_parent_path() ? dir.parent_path() : std::filesystem::path(".");
  std::error_code ec;
  const bool exists =
      std::filesystem::symlink_status(dir, ec).type() != std::filesystem::file_type::not_found;
  if (exists) {
    // One rename swaps the new directory in and the old checkpoint out (renameat2's
    // RENAME_EXCHANGE): no moment without a whole checkpoint at `dir`.
    if (::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) != 0) {
      throw Error("loom::checkpoint: cannot put " + staged.string() + " in the place of " +
                  dir.string() + ": " + std::strerror(errno));
    }
    if (options.sync) detail::sync_directory(parent);
    std::filesystem::remove_all(staged, ec);  // the old checkpoint, now at the staged name
    return;
  }
  std::filesystem::rename(staged, dir, ec);
  if (ec) {
    throw Error("loom::checkpoint: cannot rename " + staged.string() + " to " + dir.string() +
                ": " + ec.message());
  }
  if (options.sync) detail::sync_directory(parent);
}

void save(const std::filesystem::path& dir, const c10::IValue& state, const SaveOptions& options) {
  std::vector<WriteItem> items = flatten(state);
  const auto staged = staging_dir(dir, std::to_string(::getpid()));
  std::error_code ec;
  std::filesystem::remove_all(staged, ec);
  std::filesystem::create_directories(staged, ec);
  if (ec) {
    throw Error("loom::checkpoint: cannot create " + staged.string() + ": " + ec.message());
  }
  try {
    const auto where = write_items(staged / "__0_0.distcp", items, options);
    Metadata m;
    m.version = "1.0.0";
    for (const auto& item : items) m.paths.emplace(item.key, item.path);
    describe(m, items, where);
    publish(staged, dir, m, options);
  } catch (...) {
    std::filesystem::remove_all(staged, ec);
    throw;
  }
}

}  // namespace loom::checkpoint::dcp
