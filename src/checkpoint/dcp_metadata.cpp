// loom::checkpoint::dcp's `.metadata` (include/loom/checkpoint/dcp.hpp): the values of the
// restricted unpickler (dcp_unpickler.hpp) checked into dcp::Metadata, and is_checkpoint,
// parse_metadata, read_metadata. The load of a directory's items is in dcp.cpp.
#include <loom/checkpoint/dcp.hpp>

#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <utility>

#include <loom/error.hpp>

#include "dcp_unpickler.hpp"

namespace loom::checkpoint::dcp {

namespace {

using detail::kMeta;
using detail::max_chunks;
using detail::Py;
using detail::Reader;

// ---- the metadata, checked ----------------------------------------------------------------

class Interpreter {
 public:
  explicit Interpreter(std::string what) : what_(std::move(what)) {}

  [[noreturn]] void fail(const std::string& why) const {
    throw Error("loom::checkpoint: " + what_ + " is not a DCP .metadata loom reads: " + why);
  }

  /// The field `name` of `obj` (an object of class `cls`, its state a dict, or a dataclass
  /// with slots' (None, dict) pair); null when absent.
  const Py* field(const Py* obj, const char* cls, const char* name) const {
    const std::string full = std::string(cls) == "_StorageInfo"
                                 ? std::string("torch.distributed.checkpoint.filesystem.") + cls
                                 : std::string(kMeta) + cls;
    if (obj->kind != Py::Kind::Object || obj->s != full) {
      fail(std::string("a ") + cls + " is expected where the pickle holds another value");
    }
    const Py* state = obj->state;
    if (state != nullptr && state->kind == Py::Kind::Tuple && state->items.size() == 2 &&
        state->items[1]->kind == Py::Kind::Dict) {
      state = state->items[1];
    }
    if (state == nullptr || state->kind != Py::Kind::Dict) return nullptr;
    for (const auto& [k, v] : state->dict) {
      if (k->kind == Py::Kind::Str && k->s == name) return v;
    }
    return nullptr;
  }
  const Py* need(const Py* obj, const char* cls, const char* name) const {
    const Py* v = field(obj, cls, name);
    if (v == nullptr) fail(std::string("a ") + cls + " without its " + name);
    return v;
  }
  static std::vector<int64_t> ints(const Py* v, bool* ok) {
    std::vector<int64_t> out;
    *ok = v->kind == Py::Kind::Tuple || v->kind == Py::Kind::List;
    if (!*ok) return out;
    for (const Py* e : v->items) {
      if (e->kind != Py::Kind::Int) {
        *ok = false;
        return out;
      }
      out.push_back(e->i);
    }
    return out;
  }
  uint64_t count(const Py* v, const std::string& what) const {
    if (v->kind != Py::Kind::Int || v->i < 0) fail(what + " is not a non-negative int");
    return static_cast<uint64_t>(v->i);
  }
  StorageInfo storage_info(const Py* info, const std::string& key) const {
    const char* cls = "_StorageInfo";
    StorageInfo out;
    const Py* path = need(info, cls, "relative_path");
    if (path->kind != Py::Kind::Str) fail("the item of '" + key + "' names no file");
    out.file = path->s;
    if (out.file.empty() || out.file.find('/') != std::string::npos ||
        out.file.find('\\') != std::string::npos || out.file == "." || out.file == "..") {
      fail("the item of '" + key + "' names '" + out.file + "', not a file in the directory");
    }
    out.offset = count(need(info, cls, "offset"), "the offset of '" + key + "'");
    out.length = count(need(info, cls, "length"), "the length of '" + key + "'");
    if (out.offset > UINT64_MAX - out.length) fail("the item of '" + key + "' ends past 2^64");
    if (const Py* t = field(info, cls, "transform_descriptors");
        t != nullptr && t->kind != Py::Kind::None &&
        !((t->kind == Py::Kind::List || t->kind == Py::Kind::Tuple) && t->items.empty())) {
      fail("the item of '" + key +
           "' was transformed when saved (compressed or extended: _extensions), which loom "
           "does not read");
    }
    return out;
  }

  Metadata run(const Py* root) const {
    const char* cls = "Metadata";
    Metadata m;
    if (root->kind != Py::Kind::Object || root->s != std::string(kMeta) + "Metadata") {
      fail("its value is not a torch.distributed.checkpoint.metadata.Metadata");
    }
    if (const Py* v = field(root, cls, "version"); v != nullptr && v->kind == Py::Kind::Str) {
      m.version = v->s;
    }
    // Where each item lies: (key, offsets) for a tensor's chunk, key alone for an object.
    std::map<std::pair<std::string, std::vector<int64_t>>, StorageInfo> chunk_at;
    std::map<std::string, StorageInfo> object_at;
    const Py* storage = need(root, cls, "storage_data");
    if (storage->kind != Py::Kind::Dict) fail("its storage_data is not a dict");
    for (const auto& [index, info] : storage->dict) {
      const Py* fqn = need(index, "MetadataIndex", "fqn");
      if (fqn->kind != Py::Kind::Str) fail("a MetadataIndex whose fqn is not a string");
      const StorageInfo where = storage_info(info, fqn->s);
      const Py* offset = field(index, "MetadataIndex", "offset");
      if (offset == nullptr || offset->kind == Py::Kind::None) {
        object_at[fqn->s] = where;
      } else {
        bool ok = false;
        auto o = ints(offset, &ok);
        if (!ok) fail("the MetadataIndex of '" + fqn->s + "' has an offset that is not ints");
        chunk_at[{fqn->s, std::move(o)}] = where;
      }
    }
    const Py* items = need(root, cls, "state_dict_metadata");
    if (items->kind != Py::Kind::Dict) fail("its state_dict_metadata is not a dict");
    for (const auto& [k, v] : items->dict) {
      if (k->kind != Py::Kind::Str) fail("a key of state_dict_metadata is not a string");
      const std::string& key = k->s;
      if (m.tensors.count(key) || m.objects.count(key)) fail("the key '" + key + "' twice");
      if (v->kind == Py::Kind::Object && v->s == std::string(kMeta) + "BytesStorageMetadata") {
        const auto it = object_at.find(key);
        if (it == object_at.end()) fail("the object '" + key + "' is stored nowhere");
        m.objects[key] = it->second;
        continue;
      }
      m.tensors[key] = tensor(v, key, chunk_at);
    }
    if (const Py* planner = field(root, cls, "planner_data");
        planner != nullptr && planner->kind == Py::Kind::Dict) {
      for (const auto& [k, v] : planner->dict) {
        if (k->kind != Py::Kind::Str) fail("a key of planner_data is not a string");
        if (v->kind != Py::Kind::Tuple && v->kind != Py::Kind::List) {
          fail("the path of '" + k->s + "' in planner_data is not a tuple");
        }
        std::vector<PathStep> path;
        for (const Py* step : v->items) {
          if (step->kind == Py::Kind::Str) {
            path.emplace_back(step->s);
          } else if (step->kind == Py::Kind::Int && step->i >= 0) {
            path.emplace_back(step->i);
          } else {
            fail("the path of '" + k->s + "' holds a step that is not a name or an index");
          }
        }
        if (path.empty() || path.size() > 64) {
          fail("the path of '" + k->s + "' has " + std::to_string(path.size()) +
               " steps (1 to 64)");
        }
        m.paths[k->s] = std::move(path);
      }
    }
    return m;
  }

  TensorEntry tensor(
      const Py* v, const std::string& key,
      const std::map<std::pair<std::string, std::vector<int64_t>>, StorageInfo>& chunk_at) const {
    const char* cls = "TensorStorageMetadata";
    TensorEntry t;
    const Py* props = need(v, cls, "properties");
    // TensorProperties pickles its state as a tuple: (dtype, layout, requires_grad,
    // memory_format, pin_memory, ...).
    const Py* pstate = props->kind == Py::Kind::Object ? props->state : nullptr;
    if (props->kind != Py::Kind::Object || props->s != std::string(kMeta) + "TensorProperties" ||
        pstate == nullptr) {
      fail("the tensor '" + key + "' has no TensorProperties");
    }
    const Py* dtype = nullptr;
    const Py* layout = nullptr;
    if (pstate->kind == Py::Kind::Tuple && pstate->items.size() >= 2) {
      dtype = pstate->items[0];
      layout = pstate->items[1];
    } else if (pstate->kind == Py::Kind::Dict) {
      dtype = field(props, "TensorProperties", "dtype");
      layout = field(props, "TensorProperties", "layout");
    }
    if (dtype == nullptr || dtype->kind != Py::Kind::Dtype) {
      fail("the tensor '" + key + "' has a dtype loom does not know");
    }
    t.dtype = dtype->dtype;
    if (layout != nullptr && !(layout->kind == Py::Kind::Str && layout->s == "torch.strided")) {
      fail("the tensor '" + key + "' is not strided (sparse tensors are not read)");
    }
    bool ok = false;
    t.size = ints(need(v, cls, "size"), &ok);
    if (!ok) fail("the tensor '" + key + "' has a size that is not ints");
    uint64_t numel = 1;
    for (const auto d : t.size) {
      if (d < 0 || (d > 0 && numel > (uint64_t{1} << 50) / static_cast<uint64_t>(d))) {
        fail("the tensor '" + key + "' has a size out of range");
      }
      numel *= static_cast<uint64_t>(d);
    }
    const Py* chunks = need(v, cls, "chunks");
    if (chunks->kind != Py::Kind::List && chunks->kind != Py::Kind::Tuple) {
      fail("the chunks of '" + key + "' are not a list");
    }
    // Checked pairwise for overlaps below: bounded (a save over 16,384 ranks has as many).
    if (chunks->items.size() > max_chunks) {
      fail("the tensor '" + key + "' has " + std::to_string(chunks->items.size()) +
           " chunks (at most " + std::to_string(max_chunks) + ")");
    }
    uint64_t covered = 0;
    for (const Py* c : chunks->items) {
      Chunk chunk;
      bool ok1 = false, ok2 = false;
      chunk.offsets = ints(need(c, "ChunkStorageMetadata", "offsets"), &ok1);
      chunk.sizes = ints(need(c, "ChunkStorageMetadata", "sizes"), &ok2);
      if (!ok1 || !ok2 || chunk.offsets.size() != t.size.size() ||
          chunk.sizes.size() != t.size.size()) {
        fail("a chunk of '" + key + "' does not have the tensor's number of dimensions");
      }
      uint64_t n = 1;
      for (std::size_t d = 0; d < t.size.size(); ++d) {
        if (chunk.offsets[d] < 0 || chunk.sizes[d] < 0 || chunk.offsets[d] > t.size[d] ||
            chunk.sizes[d] > t.size[d] - chunk.offsets[d]) {
          fail("a chunk of '" + key + "' lies outside the tensor");
        }
        n *= static_cast<uint64_t>(chunk.sizes[d]);
      }
      const auto it = chunk_at.find({key, chunk.offsets});
      if (it == chunk_at.end()) fail("a chunk of '" + key + "' is stored nowhere");
      chunk.where = it->second;
      covered += n;
      t.chunks.push_back(std::move(chunk));
    }
    // The chunks tile the tensor: no two overlap, and together they hold every element.
    for (std::size_t a = 0; a < t.chunks.size(); ++a) {
      for (std::size_t b = a + 1; b < t.chunks.size(); ++b) {
        bool overlap = true;
        for (std::size_t d = 0; d < t.size.size() && overlap; ++d) {
          const auto& x = t.chunks[a];
          const auto& y = t.chunks[b];
          overlap =
              x.offsets[d] < y.offsets[d] + y.sizes[d] && y.offsets[d] < x.offsets[d] + x.sizes[d];
        }
        if (overlap && numel > 0) fail("two chunks of '" + key + "' overlap");
      }
    }
    if (covered != numel) {
      fail("the chunks of '" + key + "' hold " + std::to_string(covered) + " of its " +
           std::to_string(numel) + " elements");
    }
    return t;
  }

 private:
  std::string what_;
};

}  // namespace

bool is_checkpoint(const std::filesystem::path& path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec) &&
         std::filesystem::is_regular_file(path / ".metadata", ec);
}

Metadata parse_metadata(std::string_view bytes, const std::string& what) {
  Reader reader(bytes, what);
  const Py* root = reader.read();
  return Interpreter(what).run(root);
}

Metadata read_metadata(const std::filesystem::path& dir) {
  const auto path = dir / ".metadata";
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("loom::checkpoint: cannot read " + path.string());
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse_metadata(bytes, path.string());
}

}  // namespace loom::checkpoint::dcp
