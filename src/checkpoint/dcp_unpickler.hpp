#pragma once
// The restricted unpickler of DCP's `.metadata` (src/checkpoint/dcp_metadata.cpp reads its
// values into dcp::Metadata): an arena of values, so cycles a hostile pickle makes neither leak
// nor recurse; the only globals it accepts are DCP's metadata classes, torch's dtypes,
// torch.Size, the layout and memory-format encodings and pathlib's paths. Internal to loom's
// library.
#include <bit>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <c10/core/ScalarType.h>

#include <loom/checkpoint/pickle.hpp>
#include <loom/error.hpp>

namespace loom::checkpoint::dcp::detail {

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

inline bool is_class(const std::string& name) {
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

inline bool is_function(const std::string& name) {
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

}  // namespace loom::checkpoint::dcp::detail
