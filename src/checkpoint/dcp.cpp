// loom::checkpoint::dcp (include/loom/checkpoint/dcp.hpp): the `.metadata` unpickler (an arena
// of values, so cycles a hostile pickle makes neither leak nor recurse), the metadata checked
// into dcp::Metadata, and the load of a directory's items into one nested state dict.
#include <loom/checkpoint/dcp.hpp>

#include <algorithm>
#include <bit>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <ATen/core/List.h>

#include <loom/checkpoint/io.hpp>
#include <loom/checkpoint/pickle.hpp>
#include <loom/error.hpp>

namespace loom::checkpoint::dcp {
namespace {

// ---- the unpickler ------------------------------------------------------------------------

/// A value of the pickle. Owned by the reader's arena; containers hold pointers into it.
struct Py {
  enum class Kind { None, Bool, Int, Float, Str, Tuple, List, Dict, Object, Global, Dtype };
  Kind kind = Kind::None;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                          // Str: the text; Global, Object: the class
  std::vector<Py*> items;                 // Tuple, List
  std::vector<std::pair<Py*, Py*>> dict;  // Dict, in insertion order
  Py* state = nullptr;                    // Object: what BUILD gave it
  c10::ScalarType dtype = c10::kFloat;    // Dtype
};

constexpr const char* kMeta = "torch.distributed.checkpoint.metadata.";
constexpr std::size_t max_values = 1 << 22;  // far above any real metadata; bounds a hostile one
constexpr std::size_t max_stack = 1 << 16;
constexpr std::size_t max_chunks = 1 << 14;  // of one tensor

bool is_class(const std::string& name) {
  static const char* const classes[] = {
      "Metadata",         "TensorStorageMetadata", "BytesStorageMetadata",
      "TensorProperties", "ChunkStorageMetadata",  "MetadataIndex",
      "StorageMeta"};
  if (name.rfind(kMeta, 0) == 0) {
    const std::string short_name = name.substr(std::strlen(kMeta));
    for (const char* c : classes) {
      if (short_name == c) return true;
    }
    return false;
  }
  return name == "torch.distributed.checkpoint.filesystem._StorageInfo";
}

bool is_function(const std::string& name) {
  return name == "torch.Size" || name == "torch.serialization._get_layout" ||
         name == std::string(kMeta) + "_MEM_FORMAT_ENCODING" || name == "pathlib.PosixPath" ||
         name == "pathlib.WindowsPath" || name == "pathlib.PurePosixPath" ||
         name == "pathlib._local.PosixPath" || name == "pathlib._local.WindowsPath";
}

class Reader {
 public:
  Reader(std::string_view data, std::string what) : data_(data), what_(std::move(what)) {}

  const Py* read() {
    while (true) {
      if (pos_ >= data_.size()) fail("the pickle ends without STOP");
      const auto code = static_cast<unsigned char>(data_[pos_++]);
      if (code == '.') break;
      step(code);
    }
    if (stack_.size() != 1 || !marks_.empty()) fail("the pickle leaves a malformed stack");
    return stack_.back();
  }

  [[noreturn]] void fail(const std::string& why) const {
    throw Error("loom::checkpoint: " + what_ + " is not a DCP .metadata loom reads: " + why +
                " (byte " + std::to_string(pos_) + ")");
  }

 private:
  Py* make(Py::Kind kind) {
    if (arena_.size() >= max_values) fail("more than " + std::to_string(max_values) + " values");
    arena_.push_back(std::make_unique<Py>());
    arena_.back()->kind = kind;
    return arena_.back().get();
  }
  void need(std::size_t n) const {
    if (data_.size() - pos_ < n) fail("the pickle is truncated");
  }
  template <class T>
  T little() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, data_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string text(uint64_t n) {
    if (n > data_.size() - pos_) fail("the pickle is truncated");
    std::string s(data_.substr(pos_, static_cast<std::size_t>(n)));
    pos_ += static_cast<std::size_t>(n);
    return s;
  }
  std::string line() {
    const auto end = data_.find('\n', pos_);
    if (end == std::string_view::npos || end - pos_ > 256) fail("a GLOBAL without its newline");
    std::string s(data_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return s;
  }
  std::size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  void push(Py* v) {
    if (stack_.size() >= max_stack) fail("the stack grows past " + std::to_string(max_stack));
    stack_.push_back(v);
  }
  Py* pop() {
    if (stack_.size() <= floor()) fail("a pop from an empty stack");
    Py* v = stack_.back();
    stack_.pop_back();
    return v;
  }
  Py* top() {
    if (stack_.size() <= floor()) fail("an empty stack");
    return stack_.back();
  }
  /// The values above the last mark, which is dropped.
  std::vector<Py*> pop_mark() {
    if (marks_.empty()) fail("no MARK");
    const std::size_t m = marks_.back();
    marks_.pop_back();
    std::vector<Py*> out(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return out;
  }
  Py* tuple(std::vector<Py*> items) {
    Py* t = make(Py::Kind::Tuple);
    t->items = std::move(items);
    return t;
  }
  Py* global(const std::string& module, const std::string& name) {
    const std::string full = module + "." + name;
    if (module == "torch" && name.find('.') == std::string::npos) {
      for (const auto& n : checkpoint::detail::dtype_names()) {
        if (name == n.python) {
          Py* d = make(Py::Kind::Dtype);
          d->dtype = n.type;
          return d;
        }
      }
    }
    if (!is_class(full) && !is_function(full)) {
      fail("it names the global " + full + ", which is not one of DCP's metadata classes");
    }
    Py* g = make(Py::Kind::Global);
    g->s = full;
    return g;
  }
  void memo_put(uint64_t index) {
    if (memo_.size() >= max_values) fail("too many memo entries");
    memo_[index] = top();
  }
  Py* memo_get(uint64_t index) {
    const auto it = memo_.find(index);
    if (it == memo_.end()) fail("a memo entry that was never set");
    return it->second;
  }
  int64_t integer(const Py* v, const char* what) {
    if (v->kind != Py::Kind::Int) fail(std::string(what) + " is not an int");
    return v->i;
  }

  void reduce(Py* fn, Py* args) {
    if (fn->kind != Py::Kind::Global || !is_function(fn->s)) {
      fail("REDUCE of something that is not an allowed function");
    }
    if (args->kind != Py::Kind::Tuple) fail("REDUCE with arguments that are not a tuple");
    if (fn->s == "torch.Size") {
      if (args->items.size() != 1 || args->items[0]->kind != Py::Kind::Tuple) {
        fail("torch.Size of something that is not a tuple");
      }
      for (const Py* e : args->items[0]->items) (void)integer(e, "a torch.Size element");
      push(args->items[0]);
    } else if (fn->s == "torch.serialization._get_layout") {
      if (args->items.size() != 1 || args->items[0]->kind != Py::Kind::Str) {
        fail("_get_layout of something that is not a string");
      }
      push(args->items[0]);
    } else if (fn->s.find("_MEM_FORMAT_ENCODING") != std::string::npos) {
      if (args->items.size() != 1) fail("_MEM_FORMAT_ENCODING of something that is not an int");
      (void)integer(args->items[0], "a memory format");
      push(args->items[0]);
    } else {  // a path: its parts joined
      Py* s = make(Py::Kind::Str);
      for (const Py* part : args->items) {
        if (part->kind != Py::Kind::Str) fail("a path of something that is not a string");
        s->s += (s->s.empty() || s->s.back() == '/' ? "" : "/") + part->s;
      }
      push(s);
    }
  }

  void step(unsigned char code) {
    switch (code) {
      case 0x80:  // PROTO
        need(1);
        if (static_cast<unsigned char>(data_[pos_]) > 5) fail("a pickle protocol above 5");
        ++pos_;
        return;
      case 0x95:  // FRAME
        (void)little<uint64_t>();
        return;
      case '(':  // MARK
        if (marks_.size() >= max_stack) fail("too many MARKs");
        marks_.push_back(stack_.size());
        return;
      case '0':  // POP
        (void)pop();
        return;
      case '1':  // POP_MARK
        (void)pop_mark();
        return;
      case 'N':
        push(make(Py::Kind::None));
        return;
      case 0x88:
      case 0x89: {  // NEWTRUE, NEWFALSE
        Py* b = make(Py::Kind::Bool);
        b->b = code == 0x88;
        push(b);
        return;
      }
      case 'J':
      case 'K':
      case 'M': {  // BININT, BININT1, BININT2
        Py* v = make(Py::Kind::Int);
        v->i = code == 'J'   ? little<int32_t>()
               : code == 'K' ? little<uint8_t>()
                             : little<uint16_t>();
        push(v);
        return;
      }
      case 0x8a: {  // LONG1: n little-endian two's-complement bytes, n <= 8
        const auto n = little<uint8_t>();
        if (n > 8) fail("an int wider than 64 bits");
        need(n);
        uint64_t u = 0;
        for (unsigned k = 0; k < n; ++k) {
          u |= static_cast<uint64_t>(static_cast<unsigned char>(data_[pos_ + k])) << (8 * k);
        }
        if (n > 0 && n < 8 && (static_cast<unsigned char>(data_[pos_ + n - 1]) & 0x80)) {
          u |= ~uint64_t{0} << (8 * n);  // sign-extended
        }
        pos_ += n;
        Py* v = make(Py::Kind::Int);
        v->i = static_cast<int64_t>(u);
        push(v);
        return;
      }
      case 'G': {  // BINFLOAT, big-endian
        auto u = little<uint64_t>();
        u = __builtin_bswap64(u);
        Py* v = make(Py::Kind::Float);
        v->f = std::bit_cast<double>(u);
        push(v);
        return;
      }
      case 'X':
      case 0x8c:
      case 0x8d: {  // BINUNICODE, SHORT_BINUNICODE, BINUNICODE8
        const uint64_t n = code == 'X'    ? little<uint32_t>()
                           : code == 0x8c ? little<uint8_t>()
                                          : little<uint64_t>();
        Py* s = make(Py::Kind::Str);
        s->s = text(n);
        push(s);
        return;
      }
      case ')':
        push(tuple({}));
        return;
      case 0x85:
      case 0x86:
      case 0x87: {  // TUPLE1-3
        const std::size_t n = code - 0x84u;
        std::vector<Py*> items(n);
        for (std::size_t k = n; k-- > 0;) items[k] = pop();
        push(tuple(std::move(items)));
        return;
      }
      case 't':
        push(tuple(pop_mark()));
        return;
      case ']':
        push(make(Py::Kind::List));
        return;
      case 'a': {  // APPEND
        Py* v = pop();
        Py* list = top();
        if (list->kind != Py::Kind::List) fail("APPEND to something that is not a list");
        list->items.push_back(v);
        return;
      }
      case 'e': {  // APPENDS
        auto items = pop_mark();
        Py* list = top();
        if (list->kind != Py::Kind::List) fail("APPENDS to something that is not a list");
        list->items.insert(list->items.end(), items.begin(), items.end());
        return;
      }
      case '}':
        push(make(Py::Kind::Dict));
        return;
      case 's': {  // SETITEM
        Py* v = pop();
        Py* k = pop();
        Py* dict = top();
        if (dict->kind != Py::Kind::Dict) fail("SETITEM on something that is not a dict");
        dict->dict.emplace_back(k, v);
        return;
      }
      case 'u': {  // SETITEMS
        auto items = pop_mark();
        if (items.size() % 2 != 0) fail("SETITEMS with an odd number of values");
        Py* dict = top();
        if (dict->kind != Py::Kind::Dict) fail("SETITEMS on something that is not a dict");
        for (std::size_t k = 0; k < items.size(); k += 2) {
          dict->dict.emplace_back(items[k], items[k + 1]);
        }
        return;
      }
      case 'q':
        memo_put(little<uint8_t>());
        return;
      case 'r':
        memo_put(little<uint32_t>());
        return;
      case 0x94:  // MEMOIZE
        memo_put(memo_.size());
        return;
      case 'h':
        push(memo_get(little<uint8_t>()));
        return;
      case 'j':
        push(memo_get(little<uint32_t>()));
        return;
      case 'c': {  // GLOBAL
        const std::string module = line();
        const std::string name = line();
        push(global(module, name));
        return;
      }
      case 0x93: {  // STACK_GLOBAL
        Py* name = pop();
        Py* module = pop();
        if (module->kind != Py::Kind::Str || name->kind != Py::Kind::Str) {
          fail("STACK_GLOBAL of something that is not two strings");
        }
        push(global(module->s, name->s));
        return;
      }
      case 0x81: {  // NEWOBJ: cls.__new__(cls, *args)
        Py* args = pop();
        Py* cls = pop();
        if (cls->kind != Py::Kind::Global || !is_class(cls->s)) {
          fail("NEWOBJ of something that is not one of DCP's metadata classes");
        }
        if (args->kind != Py::Kind::Tuple || !args->items.empty()) {
          fail("NEWOBJ of " + cls->s + " with arguments");
        }
        Py* obj = make(Py::Kind::Object);
        obj->s = cls->s;
        push(obj);
        return;
      }
      case 'R': {  // REDUCE
        Py* args = pop();
        Py* fn = pop();
        reduce(fn, args);
        return;
      }
      case 'b': {  // BUILD: obj.__setstate__(state)
        Py* state = pop();
        Py* obj = top();
        if (obj->kind != Py::Kind::Object) fail("BUILD of something that is not an object");
        if (obj->state != nullptr) fail("BUILD of " + obj->s + " twice");
        obj->state = state;
        return;
      }
      default:
        fail("the opcode 0x" + [&] {
          static const char* hex = "0123456789abcdef";
          return std::string{hex[code >> 4], hex[code & 15]};
        }() + ", which DCP's metadata does not use");
    }
  }

  std::string_view data_;
  std::string what_;
  std::size_t pos_ = 0;
  std::vector<std::unique_ptr<Py>> arena_;
  std::vector<Py*> stack_;
  std::vector<std::size_t> marks_;
  std::unordered_map<uint64_t, Py*> memo_;
};

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

// ---- the load -----------------------------------------------------------------------------

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

/// An optimizer state keyed by parameter names (get_state_dict's) keyed by ids instead, in the
/// order of the param_groups' "params"; any other dict is left as it is.
void ids_for_names(c10::IValue& v) {
  if (!v.isGenericDict()) return;
  auto d = v.toGenericDict();
  const auto state = d.find("state");
  const auto groups = d.find("param_groups");
  if (state == d.end() || groups == d.end() || !state->value().isGenericDict() ||
      !groups->value().isList()) {
    for (auto& e : d) {
      c10::IValue child = e.value();
      ids_for_names(child);
    }
    return;
  }
  std::unordered_map<std::string, int64_t> ids;
  auto list = groups->value().toList();
  for (std::size_t g = 0; g < list.size(); ++g) {
    if (!list.get(g).isGenericDict()) return;
    auto group = list.get(g).toGenericDict();
    const auto params = group.find("params");
    if (params == group.end() || !params->value().isList()) return;
    c10::impl::GenericList numbered(c10::IntType::get());
    for (const auto& p : params->value().toList()) {
      if (!p.get().isString()) return;  // ids already (or not an optimizer): as it is
      const std::string name = p.get().toStringRef();
      const auto id = static_cast<int64_t>(ids.size());
      if (!ids.emplace(name, id).second) {
        throw Error("loom::checkpoint: the optimizer's param_groups name '" + name + "' twice");
      }
      numbered.push_back(id);
    }
    group.insert_or_assign("params", numbered);
  }
  c10::impl::GenericDict by_id(c10::IntType::get(), c10::AnyType::get());
  for (const auto& e : state->value().toGenericDict()) {
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

c10::IValue load(const std::filesystem::path& dir, c10::Device device) {
  return load(dir, device, nullptr);
}

c10::IValue load(const std::filesystem::path& dir, c10::Device device, const RowsOf& rows_of,
                 ReadCount* count) {
  ReadCount read;
  const Metadata m = read_metadata(dir);
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
