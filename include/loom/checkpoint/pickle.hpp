#pragma once
// loom's pickle layer for torch.save files: a writer whose output stock Python opens with
// torch.load(weights_only=True) and no allowlist, and a restricted reader for files Python's
// torch.save wrote (state_dict OrderedDicts, any int, fp8 and uint16+ tensors included).
//
// LibTorch's own Pickler tags every dict and list with torch.jit._pickle globals that Python's
// weights_only unpickler refuses, and its Unpickler drops OrderedDicts and most ints >= 2^31;
// hence this layer (docs/checkpoints.md). Values are c10::IValues: None, bool, int, double,
// str, tensors, tuples, lists, dicts (str or int keys) and devices.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <loom/error.hpp>

namespace loom::checkpoint::detail {

// ---- dtypes and their Python names --------------------------------------------------------

struct DtypeName {
  c10::ScalarType type;
  const char* python;   // torch.<python>, as in `torch float8_e4m3fn`
  const char* storage;  // the legacy typed storage (torch.<storage>), or null: v3 + UntypedStorage
};

inline const std::vector<DtypeName>& dtype_names() {
  using S = c10::ScalarType;
  static const std::vector<DtypeName> names{
      {S::Float, "float32", "FloatStorage"},
      {S::Double, "float64", "DoubleStorage"},
      {S::Half, "float16", "HalfStorage"},
      {S::BFloat16, "bfloat16", "BFloat16Storage"},
      {S::Long, "int64", "LongStorage"},
      {S::Int, "int32", "IntStorage"},
      {S::Short, "int16", "ShortStorage"},
      {S::Char, "int8", "CharStorage"},
      {S::Byte, "uint8", "ByteStorage"},
      {S::Bool, "bool", "BoolStorage"},
      {S::ComplexFloat, "complex64", "ComplexFloatStorage"},
      {S::ComplexDouble, "complex128", "ComplexDoubleStorage"},
      {S::ComplexHalf, "complex32", nullptr},
      {S::Float8_e4m3fn, "float8_e4m3fn", nullptr},
      {S::Float8_e5m2, "float8_e5m2", nullptr},
      {S::Float8_e4m3fnuz, "float8_e4m3fnuz", nullptr},
      {S::Float8_e5m2fnuz, "float8_e5m2fnuz", nullptr},
      {S::UInt16, "uint16", nullptr},
      {S::UInt32, "uint32", nullptr},
      {S::UInt64, "uint64", nullptr},
  };
  return names;
}

inline const DtypeName* dtype_name(c10::ScalarType t) {
  for (const auto& n : dtype_names()) {
    if (n.type == t) return &n;
  }
  return nullptr;
}

// ---- the limit on nesting, one for the writer and the reader --------------------------------

/// How deeply a checkpoint's values may nest: a list, tuple or dict is one level deeper than the
/// deepest of its elements and keys (scalars, strings, tensors, devices and empty containers are
/// level 0), so `[[1]]` and `{"a": [1]}` nest 2 deep. The reader refuses more, guarding its
/// stack against hostile files; the writer refuses exactly the same values, so loom never writes
/// a file it cannot read back.
inline constexpr int max_depth = 256;

// ---- opcodes (protocol 2, and the few of 3/4 that torch.save(pickle_protocol=4) emits) ------

/// The pickle opcodes loom writes or reads, by their byte (Python's pickletools names, in
/// PascalCase). BinBytes and ShortBinBytes are named only: a checkpoint holds no bytes objects,
/// and the reader refuses them as it refuses any opcode it does not handle.
enum class Opcode : unsigned char {
  Mark = '(',
  Stop = '.',
  Pop = '0',
  PopMark = '1',
  BinInt = 'J',
  BinInt1 = 'K',
  BinInt2 = 'M',
  None = 'N',
  BinUnicode = 'X',
  Append = 'a',
  Build = 'b',
  Global = 'c',
  Dict = 'd',
  EmptyDict = '}',
  Appends = 'e',
  BinGet = 'h',
  LongBinGet = 'j',
  List = 'l',
  EmptyList = ']',
  BinPut = 'q',
  LongBinPut = 'r',
  SetItem = 's',
  Tuple = 't',
  EmptyTuple = ')',
  SetItems = 'u',
  BinFloat = 'G',
  BinPersId = 'Q',
  Reduce = 'R',
  BinBytes = 'B',
  ShortBinBytes = 'C',
  Proto = 0x80,
  Tuple1 = 0x85,
  Tuple2 = 0x86,
  Tuple3 = 0x87,
  NewTrue = 0x88,
  NewFalse = 0x89,
  Long1 = 0x8a,
  ShortBinUnicode = 0x8c,
  BinUnicode8 = 0x8d,
  StackGlobal = 0x93,
  Memoize = 0x94,
  Frame = 0x95,
};

// ---- the writer ---------------------------------------------------------------------------

/// Pickles an IValue as torch.save does (protocol 2, tensors by persistent id), with plain
/// dicts, lists and tuples. Storages shared by several tensors are written once.
class PickleWriter {
 public:
  /// One storage to write as the record `data/KEY`: its bytes, on the CPU.
  struct Storage {
    std::string key;
    at::Tensor bytes;  // uint8, contiguous, CPU
  };

  std::string pickle(const c10::IValue& v) {
    out_.clear();
    put(Opcode::Proto);
    byte(2);
    write(v, 0);
    put(Opcode::Stop);
    return std::move(out_);
  }
  const std::vector<Storage>& storages() const noexcept { return storages_; }

 private:
  void put(Opcode o) { out_.push_back(static_cast<char>(o)); }
  void byte(unsigned char c) { out_.push_back(static_cast<char>(c)); }
  template <class T>
  void little(T v) {
    char b[sizeof(T)];
    // The host is little-endian: checkpoint/io.hpp static_asserts std::endian::native.
    std::memcpy(b, &v, sizeof(T));
    out_.append(b, sizeof(T));
  }
  void string(std::string_view s) {
    put(Opcode::BinUnicode);
    little(static_cast<uint32_t>(s.size()));
    out_.append(s.data(), s.size());
  }
  void global(std::string_view module, std::string_view name) {
    put(Opcode::Global);
    out_.append(module.data(), module.size());
    out_.push_back('\n');
    out_.append(name.data(), name.size());
    out_.push_back('\n');
  }
  void integer(int64_t v) {
    if (v >= 0 && v < 256) {
      put(Opcode::BinInt1);
      byte(static_cast<unsigned char>(v));
    } else if (v >= 0 && v < 65536) {
      put(Opcode::BinInt2);
      little(static_cast<uint16_t>(v));
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      put(Opcode::BinInt);
      little(static_cast<int32_t>(v));
    } else {  // LONG1: the shortest little-endian two's complement, as Python writes it
      unsigned char b[8];
      std::memcpy(b, &v, 8);
      int n = 8;
      while (n > 1 && ((b[n - 1] == 0x00 && !(b[n - 2] & 0x80)) ||
                       (b[n - 1] == 0xff && (b[n - 2] & 0x80)))) {
        --n;
      }
      put(Opcode::Long1);
      byte(static_cast<unsigned char>(n));
      out_.append(reinterpret_cast<const char*>(b), static_cast<std::size_t>(n));
    }
  }
  void real(double d) {
    put(Opcode::BinFloat);
    uint64_t bits;
    std::memcpy(&bits, &d, 8);
    for (int i = 7; i >= 0; --i) byte(static_cast<unsigned char>(bits >> (8 * i)));
  }
  void tuple_end(std::size_t n, bool marked) {
    if (marked) {
      put(Opcode::Tuple);
    } else if (n == 1) {
      put(Opcode::Tuple1);
    } else if (n == 2) {
      put(Opcode::Tuple2);
    } else if (n == 3) {
      put(Opcode::Tuple3);
    }
  }
  void ints_tuple(c10::IntArrayRef v) {
    if (v.empty()) {
      put(Opcode::EmptyTuple);
      return;
    }
    const bool marked = v.size() > 3;
    if (marked) put(Opcode::Mark);
    for (auto x : v) integer(x);
    tuple_end(v.size(), marked);
  }

  void write(const c10::IValue& v, int depth) {
    // `depth` counts the containers around v: at the deepest element, how deeply the whole value
    // nests as the reader counts it (max_depth), so the writer refuses what the reader would.
    if (depth > max_depth) {
      throw Error("loom::checkpoint: cannot save a value whose containers nest deeper than " +
                  std::to_string(max_depth) + " (the most a checkpoint may nest, read or written)");
    }
    if (v.isNone()) {
      put(Opcode::None);
    } else if (v.isBool()) {
      put(v.toBool() ? Opcode::NewTrue : Opcode::NewFalse);
    } else if (v.isInt()) {
      integer(v.toInt());
    } else if (v.isDouble()) {
      real(v.toDouble());
    } else if (v.isString()) {
      string(v.toStringRef());
    } else if (v.isTensor()) {
      tensor(v.toTensor());
    } else if (v.isTuple()) {
      const auto& e = v.toTupleRef().elements();
      if (e.empty()) {
        put(Opcode::EmptyTuple);
        return;
      }
      const bool marked = e.size() > 3;
      if (marked) put(Opcode::Mark);
      for (const auto& x : e) write(x, depth + 1);
      tuple_end(e.size(), marked);
    } else if (v.isList()) {
      put(Opcode::EmptyList);
      const auto l = v.toListRef();
      if (l.empty()) return;
      put(Opcode::Mark);
      for (const auto& x : l) write(x, depth + 1);
      put(Opcode::Appends);
    } else if (v.isGenericDict()) {
      put(Opcode::EmptyDict);
      const auto d = v.toGenericDict();
      if (d.empty()) return;
      put(Opcode::Mark);
      for (const auto& e : d) {
        write(e.key(), depth + 1);
        write(e.value(), depth + 1);
      }
      put(Opcode::SetItems);
    } else if (v.isDevice()) {
      const auto dev = v.toDevice();
      global("torch", "device");
      string(c10::DeviceTypeName(dev.type(), /*lower_case=*/true));
      if (dev.has_index()) {
        integer(dev.index());
        put(Opcode::Tuple2);
      } else {
        put(Opcode::Tuple1);
      }
      put(Opcode::Reduce);
    } else {
      throw Error(std::string("loom::checkpoint: cannot save a value of type ") + v.type()->str() +
                  " (a checkpoint holds tensors, numbers, strings, bools, None, devices, and "
                  "lists, tuples and dicts of them)");
    }
  }

  void tensor(const at::Tensor& t) {
    if (!t.defined()) {
      put(Opcode::None);  // Python has no undefined tensor; None is what it would see
      return;
    }
    if (t.is_sparse() || t.is_quantized() || t.layout() != c10::kStrided) {
      throw Error("loom::checkpoint: only dense strided tensors can be saved");
    }
    const auto* name = dtype_name(t.scalar_type());
    if (name == nullptr) {
      throw Error(std::string("loom::checkpoint: cannot save a tensor of dtype ") +
                  c10::toString(t.scalar_type()));
    }
    const auto& storage = t.storage();
    const auto* impl = storage.unsafeGetStorageImpl();
    auto it = keys_.find(impl);
    std::string key;
    if (it == keys_.end()) {
      key = std::to_string(keys_.size());
      keys_.emplace(impl, std::make_pair(key, t.scalar_type()));
      auto bytes = at::empty({static_cast<int64_t>(storage.nbytes())},
                             at::TensorOptions(at::kByte).device(storage.device()));
      if (storage.nbytes() > 0) {
        bytes.set_(c10::Storage(storage), 0, {static_cast<int64_t>(storage.nbytes())}, {1});
      }
      storages_.push_back({key, bytes.cpu().contiguous()});
    } else {
      if (it->second.second != t.scalar_type()) {
        throw Error(
            "loom::checkpoint: cannot save tensors that view the same data as different "
            "dtypes");
      }
      key = it->second.first;
    }
    const auto elem = static_cast<int64_t>(t.element_size());
    const bool v3 = name->storage == nullptr;
    global("torch._utils", v3 ? "_rebuild_tensor_v3" : "_rebuild_tensor_v2");
    put(Opcode::Mark);
    // persistent id: ('storage', storage type, key, location, numel)
    put(Opcode::Mark);
    string("storage");
    if (v3) {
      global("torch.storage", "UntypedStorage");
    } else {
      global("torch", name->storage);
    }
    string(key);
    string(location(storage.device()));
    integer(v3 ? static_cast<int64_t>(storage.nbytes())
               : static_cast<int64_t>(storage.nbytes()) / elem);
    put(Opcode::Tuple);
    put(Opcode::BinPersId);
    integer(t.storage_offset());
    ints_tuple(t.sizes());
    ints_tuple(t.strides());
    put(t.requires_grad() ? Opcode::NewTrue : Opcode::NewFalse);
    global("collections", "OrderedDict");
    put(Opcode::EmptyTuple);
    put(Opcode::Reduce);
    if (v3) global("torch", name->python);
    put(Opcode::Tuple);
    put(Opcode::Reduce);
  }

  static std::string location(const c10::Device& d) {
    if (d.is_cpu()) return "cpu";
    return d.str();  // "cuda:0"
  }

  std::string out_;
  std::vector<Storage> storages_;
  std::unordered_map<const c10::StorageImpl*, std::pair<std::string, c10::ScalarType>> keys_;
};

// ---- the reader ---------------------------------------------------------------------------

/// Gives the bytes of record `data/KEY` (a CPU uint8 tensor of exactly `nbytes`), or throws.
using StorageLoader = std::function<at::Tensor(const std::string& key, int64_t nbytes)>;

/// A restricted unpickler for torch.save's data.pkl: it builds values and never runs code. It
/// knows only the globals of tensors and containers (Python's weights_only set, less what a
/// checkpoint cannot hold); any other global, opcode or malformed input is a loom::Error.
/// Bounded: nesting depth, stack, memo and copied elements are capped, tensor views are
/// checked against their storage, and no input makes it allocate more than the file holds.
class PickleReader {
 public:
  PickleReader(std::string_view data, StorageLoader load, std::optional<c10::Device> map_to)
      : data_(data), load_(std::move(load)), map_to_(map_to) {}

  c10::IValue read() {
    while (true) {
      if (pos_ >= data_.size()) fail("the pickle ends without STOP");
      const auto code = static_cast<unsigned char>(data_[pos_++]);
      if (static_cast<Opcode>(code) == Opcode::Stop) break;
      step(code);
    }
    if (stack_.size() != 1 || !marks_.empty()) fail("the pickle leaves a malformed stack");
    return value(std::move(stack_.back()), "the checkpoint");
  }

 private:
  // A stack entry: a value, or one of the things that exist only while unpickling.
  struct Item {
    enum class Kind { Value, Global, StorageType, Storage, Dtype, RawTuple };
    Kind kind = Kind::Value;
    c10::IValue v;                             // value
    std::string name;                          // global: "module.name"
    c10::Storage store;                        // storage
    c10::ScalarType type = c10::kByte;         // storage_type, storage (typed), dtype
    bool typed = false;                        // storage_type / storage: a legacy typed one
    std::shared_ptr<std::vector<Item>> items;  // raw_tuple: a tuple holding non-values
    int depth = 0;                             // how deep its containers nest
  };

  [[noreturn]] void fail(const std::string& what) const {
    throw Error("loom::checkpoint: corrupt or unsupported checkpoint: " + what + " (byte " +
                std::to_string(pos_) + " of data.pkl)");
  }
  [[noreturn]] void too_deep() const {
    fail("containers nest deeper than " + std::to_string(max_depth) +
         " (the most a checkpoint may nest, read or written)");
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
  std::string bytes(uint64_t n) {
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
  void push(Item it) {
    if (stack_.size() >= max_stack) fail("the stack grows past " + std::to_string(max_stack));
    if (it.depth > max_depth) too_deep();
    stack_.push_back(std::move(it));
  }
  void push_value(c10::IValue v, int depth = 0) {
    Item it;
    it.v = std::move(v);
    it.depth = depth;
    push(std::move(it));
  }
  Item pop() {
    if (stack_.size() <= floor()) fail("a pop from an empty stack");
    Item it = std::move(stack_.back());
    stack_.pop_back();
    return it;
  }
  Item& top() {
    if (stack_.size() <= floor()) fail("an empty stack");
    return stack_.back();
  }
  std::vector<Item> pop_items(std::size_t n) {
    if (stack_.size() - floor() < n) fail("a tuple of more items than the stack holds");
    std::vector<Item> items(std::make_move_iterator(stack_.end() - static_cast<std::ptrdiff_t>(n)),
                            std::make_move_iterator(stack_.end()));
    stack_.resize(stack_.size() - n);
    return items;
  }
  std::vector<Item> pop_mark() {
    if (marks_.empty()) fail("no MARK");
    const auto n = stack_.size() - marks_.back();
    auto items = pop_items(n);
    marks_.pop_back();
    return items;
  }

  c10::IValue value(Item&& it, const std::string& what) const {
    if (it.kind != Item::Kind::Value) {
      const char* kinds[] = {"value", "global", "storage type", "storage", "dtype", "tuple"};
      fail(what + " is a " + kinds[static_cast<int>(it.kind)] +
           (it.kind == Item::Kind::Global ? " " + it.name : ""));
    }
    return std::move(it.v);
  }
  static int depth_of(const std::vector<Item>& items) {
    int d = 0;
    for (const auto& i : items) d = std::max(d, i.depth);
    return d + 1;
  }

  void tuple(std::vector<Item>&& items) {
    Item t;
    t.depth = depth_of(items);
    const bool values = std::all_of(items.begin(), items.end(),
                                    [](const Item& i) { return i.kind == Item::Kind::Value; });
    if (values) {
      std::vector<c10::IValue> e;
      e.reserve(items.size());
      for (auto& i : items) e.push_back(std::move(i.v));
      t.v = c10::ivalue::Tuple::create(std::move(e));
    } else {  // persistent ids and REDUCE arguments hold globals, storages and dtypes
      t.kind = Item::Kind::RawTuple;
      t.items = std::make_shared<std::vector<Item>>(std::move(items));
    }
    push(std::move(t));
  }
  std::vector<Item> tuple_items(Item&& it, const char* what) const {
    if (it.kind == Item::Kind::RawTuple) return *it.items;
    auto v = value(std::move(it), what);
    if (!v.isTuple()) fail(std::string(what) + " is not a tuple");
    std::vector<Item> out;
    for (const auto& e : v.toTupleRef().elements()) {
      Item i;
      i.v = e;
      out.push_back(std::move(i));
    }
    return out;
  }

  void set_items(Item& d, std::vector<Item>&& kv) {
    if (d.kind != Item::Kind::Value || !d.v.isGenericDict())
      fail("SETITEM(S) on something not a dict");
    if (kv.size() % 2 != 0) fail("SETITEMS with an odd number of items");
    d.depth = std::max(d.depth, depth_of(kv));
    if (d.depth > max_depth) too_deep();
    auto dict = d.v.toGenericDict();
    for (std::size_t i = 0; i < kv.size(); i += 2) {
      auto k = value(std::move(kv[i]), "a dict key");
      if (!(k.isString() || k.isInt() || k.isDouble() || k.isBool())) {
        fail("a dict key of type " + k.type()->str());
      }
      dict.insert_or_assign(std::move(k), value(std::move(kv[i + 1]), "a dict value"));
    }
  }
  void append_items(Item& l, std::vector<Item>&& items) {
    if (l.kind != Item::Kind::Value || !l.v.isList()) fail("APPEND(S) to something not a list");
    l.depth = std::max(l.depth, depth_of(items));
    if (l.depth > max_depth) too_deep();
    auto list = l.v.toList();
    for (auto& i : items) list.push_back(value(std::move(i), "a list element"));
  }

  // A memo hit on a list or dict is copied, so no input can make a container hold itself; the
  // copies are counted against a budget, so no small input can make a huge value.
  c10::IValue copy(const c10::IValue& v) {
    if (++copied_ > max_copied)
      fail("shared containers copied past " + std::to_string(max_copied) + " elements");
    if (v.isList()) {
      c10::impl::GenericList out(c10::AnyType::get());
      for (const auto& e : v.toListRef()) out.push_back(copy(e));
      return out;
    }
    if (v.isGenericDict()) {
      c10::impl::GenericDict out(c10::AnyType::get(), c10::AnyType::get());
      for (const auto& e : v.toGenericDict()) out.insert(e.key(), copy(e.value()));
      return out;
    }
    if (v.isTuple()) {
      std::vector<c10::IValue> e;
      for (const auto& x : v.toTupleRef().elements()) e.push_back(copy(x));
      return c10::ivalue::Tuple::create(std::move(e));
    }
    return v;  // scalars, strings, tensors (tensors share, as in Python)
  }
  void memo_put(uint64_t key) {
    if (memo_.size() >= max_memo && !memo_.count(key))
      fail("the memo grows past " + std::to_string(max_memo));
    memo_[key] = top();
  }
  void memo_get(uint64_t key) {
    auto it = memo_.find(key);
    if (it == memo_.end()) fail("a memo key that was never put: " + std::to_string(key));
    Item got = it->second;
    if (got.kind == Item::Kind::Value) got.v = copy(got.v);
    push(std::move(got));
  }

  void step(unsigned char code) {
    switch (static_cast<Opcode>(code)) {
      case Opcode::Proto: {
        const auto v = little<uint8_t>();
        if (v < 2 || v > 5) fail("pickle protocol " + std::to_string(v));
        return;
      }
      case Opcode::Frame:
        little<uint64_t>();
        return;
      case Opcode::Mark:
        marks_.push_back(stack_.size());
        return;
      case Opcode::Pop:
        pop();
        return;
      case Opcode::PopMark:
        pop_mark();
        return;
      case Opcode::None:
        push_value(c10::IValue());
        return;
      case Opcode::NewTrue:
        push_value(true);
        return;
      case Opcode::NewFalse:
        push_value(false);
        return;
      case Opcode::BinInt:
        push_value(int64_t{little<int32_t>()});
        return;
      case Opcode::BinInt1:
        push_value(int64_t{little<uint8_t>()});
        return;
      case Opcode::BinInt2:
        push_value(int64_t{little<uint16_t>()});
        return;
      case Opcode::Long1: {
        const auto n = little<uint8_t>();
        if (n > 8) fail("an int wider than 64 bits");
        const auto b = bytes(n);
        uint64_t u = 0;
        for (std::size_t i = 0; i < n; ++i)
          u |= uint64_t{static_cast<unsigned char>(b[i])} << (8 * i);
        if (n > 0 && n < 8 && (static_cast<unsigned char>(b[n - 1]) & 0x80))
          u |= ~uint64_t{0} << (8 * n);
        int64_t v;
        std::memcpy(&v, &u, 8);
        push_value(v);
        return;
      }
      case Opcode::BinFloat: {
        need(8);
        uint64_t bits = 0;
        for (int i = 0; i < 8; ++i)
          bits = (bits << 8) | static_cast<unsigned char>(data_[pos_ + i]);
        pos_ += 8;
        double d;
        std::memcpy(&d, &bits, 8);
        push_value(d);
        return;
      }
      case Opcode::BinUnicode:
        push_value(bytes(little<uint32_t>()));
        return;
      case Opcode::ShortBinUnicode:
        push_value(bytes(little<uint8_t>()));
        return;
      case Opcode::BinUnicode8:
        push_value(bytes(little<uint64_t>()));
        return;
      case Opcode::EmptyTuple:
        push_value(c10::ivalue::Tuple::create(std::vector<c10::IValue>{}));
        return;
      case Opcode::Tuple1:
        tuple(pop_items(1));
        return;
      case Opcode::Tuple2:
        tuple(pop_items(2));
        return;
      case Opcode::Tuple3:
        tuple(pop_items(3));
        return;
      case Opcode::Tuple:
        tuple(pop_mark());
        return;
      case Opcode::EmptyList:
        push_value(c10::impl::GenericList(c10::AnyType::get()));
        return;
      case Opcode::List: {
        Item l;
        l.v = c10::impl::GenericList(c10::AnyType::get());
        append_items(l, pop_mark());
        push(std::move(l));
        return;
      }
      case Opcode::Append: {
        std::vector<Item> x;
        x.push_back(pop());
        append_items(top(), std::move(x));
        return;
      }
      case Opcode::Appends: {
        auto items = pop_mark();
        append_items(top(), std::move(items));
        return;
      }
      case Opcode::EmptyDict:
        push_value(c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get()));
        return;
      case Opcode::Dict: {
        Item d;
        d.v = c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get());
        set_items(d, pop_mark());
        push(std::move(d));
        return;
      }
      case Opcode::SetItem: {
        std::vector<Item> kv(2);
        kv[1] = pop();
        kv[0] = pop();
        set_items(top(), std::move(kv));
        return;
      }
      case Opcode::SetItems: {
        auto items = pop_mark();
        set_items(top(), std::move(items));
        return;
      }
      case Opcode::BinPut:
        memo_put(little<uint8_t>());
        return;
      case Opcode::LongBinPut:
        memo_put(little<uint32_t>());
        return;
      case Opcode::Memoize:
        memo_put(memo_.size());
        return;
      case Opcode::BinGet:
        memo_get(little<uint8_t>());
        return;
      case Opcode::LongBinGet:
        memo_get(little<uint32_t>());
        return;
      case Opcode::Global: {
        auto module = line();
        auto name = line();
        push(global(module + "." + name));
        return;
      }
      case Opcode::StackGlobal: {  // protocol 4: the module and the name as strings
        auto name = value(pop(), "STACK_GLOBAL's name");
        auto module = value(pop(), "STACK_GLOBAL's module");
        if (!name.isString() || !module.isString()) fail("STACK_GLOBAL of non-strings");
        push(global(module.toStringRef() + "." + name.toStringRef()));
        return;
      }
      case Opcode::BinPersId: {
        auto pid = tuple_items(pop(), "a persistent id");
        push(persistent(pid));
        return;
      }
      case Opcode::Reduce: {
        auto args = tuple_items(pop(), "REDUCE's arguments");
        auto fn = pop();
        push(reduce(fn, args));
        return;
      }
      case Opcode::Build: {
        // Python's weights_only unpickler allows BUILD on an OrderedDict (its _metadata) and
        // on a tensor (its __dict__); neither holds anything a loom checkpoint uses.
        pop();
        const auto& obj = top();
        if (obj.kind != Item::Kind::Value || !(obj.v.isGenericDict() || obj.v.isTensor())) {
          fail("BUILD on something that is not a dict or a tensor");
        }
        return;
      }
      default: {
        char hex[8];
        std::snprintf(hex, sizeof(hex), "0x%02x", code);
        fail(std::string("the pickle opcode ") + hex + " is not supported");
      }
    }
  }

  static Item named(std::string name) {
    Item it;
    it.kind = Item::Kind::Global;
    it.name = std::move(name);
    return it;
  }

  Item global(const std::string& name) const {
    static const char* const allowed[] = {"collections.OrderedDict",
                                          "collections.Counter",
                                          "torch._utils._rebuild_tensor_v2",
                                          "torch._utils._rebuild_tensor_v3",
                                          "torch._utils._rebuild_parameter",
                                          "torch.Size",
                                          "torch.device",
                                          "builtins.set",
                                          "__builtin__.set"};
    for (const char* a : allowed) {
      if (name == a) return named(name);
    }
    Item it;
    if (name == "torch.storage.UntypedStorage") {
      it.kind = Item::Kind::StorageType;
      return it;
    }
    if (name.rfind("torch.", 0) == 0 && name.find('.', 6) == std::string::npos) {
      const auto short_name = name.substr(6);  // torch.<X>: a dtype or a typed storage
      for (const auto& n : dtype_names()) {
        if (short_name == n.python) {
          it.kind = Item::Kind::Dtype;
          it.type = n.type;
          return it;
        }
        if (n.storage != nullptr && short_name == n.storage) {
          it.kind = Item::Kind::StorageType;
          it.type = n.type;
          it.typed = true;
          return it;
        }
      }
    }
    throw Error("loom::checkpoint: the checkpoint needs the Python global '" + name +
                "', which loom does not load: it loads tensors, numbers, strings and containers "
                "of them, as torch.load(weights_only=True) does");
  }

  Item persistent(const std::vector<Item>& pid) {
    auto is = [&](std::size_t i, bool (c10::IValue::*test)() const) {
      return pid[i].kind == Item::Kind::Value && (pid[i].v.*test)();
    };
    if (pid.size() != 5 || !is(0, &c10::IValue::isString) || pid[0].v.toStringRef() != "storage" ||
        pid[1].kind != Item::Kind::StorageType || !is(2, &c10::IValue::isString) ||
        !is(3, &c10::IValue::isString) || !is(4, &c10::IValue::isInt)) {
      fail("a persistent id that is not ('storage', storage type, key, location, numel)");
    }
    const bool typed = pid[1].typed;
    const auto& key = pid[2].v.toStringRef();
    const auto numel = pid[4].v.toInt();
    const int64_t elem = typed ? static_cast<int64_t>(c10::elementSize(pid[1].type)) : 1;
    if (numel < 0 || numel > max_bytes / elem)
      fail("a storage of " + std::to_string(numel) + " elements");
    Item it;
    it.kind = Item::Kind::Storage;
    it.typed = typed;
    it.type = pid[1].type;
    auto found = storages_.find(key);
    if (found == storages_.end()) {
      auto bytes = load_(key, numel * elem);
      if (map_to_ && !map_to_->is_cpu()) bytes = bytes.to(*map_to_);  // once per storage
      found = storages_.emplace(key, std::make_pair(bytes.storage(), numel * elem)).first;
    } else if (found->second.second != numel * elem) {
      fail("storage " + key + " is used with two different sizes");
    }
    it.store = found->second.first;
    return it;
  }

  Item reduce(const Item& fn, std::vector<Item>& args) {
    if (fn.kind != Item::Kind::Global) fail("REDUCE of something that is not a known global");
    const auto& f = fn.name;
    auto arg = [&](std::size_t i) -> const c10::IValue& {
      if (i >= args.size()) fail(f + " has too few arguments");
      if (args[i].kind != Item::Kind::Value)
        fail("argument " + std::to_string(i) + " of " + f + " is not a value");
      return args[i].v;
    };
    Item it;
    if (f == "collections.OrderedDict") {
      if (!args.empty()) fail("OrderedDict with arguments");
      it.v = c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get());
    } else if (f == "collections.Counter") {  // Counter(dict): the dict
      it.v = args.empty()
                 ? c10::IValue(c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get()))
                 : arg(0);
      if (!it.v.isGenericDict()) fail("Counter of something that is not a dict");
      it.depth = args.empty() ? 0 : args[0].depth;
    } else if (f == "builtins.set" || f == "__builtin__.set") {  // set(list): the list
      it.v = args.empty() ? c10::IValue(c10::impl::GenericList(c10::AnyType::get())) : arg(0);
      if (!it.v.isList()) fail("set of something that is not a list");
      it.depth = args.empty() ? 0 : args[0].depth;
    } else if (f == "torch.Size") {
      it.v = arg(0);
      if (!it.v.isTuple()) fail("torch.Size of something that is not a tuple");
      for (const auto& e : it.v.toTupleRef().elements()) {
        if (!e.isInt()) fail("torch.Size with a non-int");
      }
    } else if (f == "torch.device") {
      if (!arg(0).isString()) fail("torch.device without a type string");
      std::string s = arg(0).toStringRef();
      if (args.size() > 1) {
        if (!arg(1).isInt() || arg(1).toInt() < 0 || arg(1).toInt() > 127)
          fail("torch.device with a bad index");
        s += ":" + std::to_string(arg(1).toInt());
      }
      if (s.size() > 32) fail("a device name that long");
      try {
        it.v = c10::Device(s);
      } catch (const std::exception&) {
        fail("an unknown device '" + s + "'");
      }
    } else if (f == "torch._utils._rebuild_tensor_v2" || f == "torch._utils._rebuild_tensor_v3") {
      const bool v3 = f.back() == '3';
      if (args.size() < (v3 ? 7u : 6u) || args.size() > 8u)
        fail(f + " with " + std::to_string(args.size()) + " arguments");
      if (args[0].kind != Item::Kind::Storage) fail(f + " without a storage");
      c10::ScalarType dtype = args[0].type;
      if (v3) {
        if (args[6].kind != Item::Kind::Dtype) fail(f + " without a dtype");
        dtype = args[6].type;
      } else if (!args[0].typed) {
        fail(f + " of an untyped storage");
      }
      it.v = rebuild(args[0].store, dtype, arg(1), arg(2), arg(3), arg(4), f);
    } else if (f == "torch._utils._rebuild_parameter") {
      if (!arg(0).isTensor() || !arg(1).isBool()) fail(f + " with bad arguments");
      auto t = arg(0).toTensor();
      if (arg(1).toBool() && at::isFloatingType(t.scalar_type())) t.requires_grad_(true);
      it.v = t;
    } else {
      fail("REDUCE of " + f);
    }
    return it;
  }

  at::Tensor rebuild(const c10::Storage& storage, c10::ScalarType dtype, const c10::IValue& offset,
                     const c10::IValue& sizes, const c10::IValue& strides,
                     const c10::IValue& requires_grad, const std::string& f) const {
    auto ints = [&](const c10::IValue& v, const char* what) {
      if (!v.isTuple()) fail(f + "'s " + what + " is not a tuple");
      std::vector<int64_t> out;
      for (const auto& e : v.toTupleRef().elements()) {
        if (!e.isInt() || e.toInt() < 0 || e.toInt() > max_bytes)
          fail(f + "'s " + what + " holds a bad value");
        out.push_back(e.toInt());
      }
      return out;
    };
    if (!offset.isInt() || offset.toInt() < 0 || offset.toInt() > max_bytes)
      fail(f + "'s offset is bad");
    if (!requires_grad.isBool()) fail(f + "'s requires_grad is not a bool");
    const auto size = ints(sizes, "sizes");
    const auto stride = ints(strides, "strides");
    if (size.size() != stride.size() || size.size() > 64)
      fail(f + ": sizes and strides do not fit");
    const auto elem = static_cast<int64_t>(c10::elementSize(dtype));
    const auto capacity = static_cast<int64_t>(storage.nbytes()) / elem;
    int64_t numel = 1, last = offset.toInt();  // the highest element the view reaches
    for (std::size_t i = 0; i < size.size(); ++i) {
      if (size[i] != 0 && numel > max_bytes / size[i]) fail(f + ": too many elements");
      numel *= size[i];
    }
    if (numel > 0) {
      for (std::size_t i = 0; i < size.size(); ++i) {
        if (size[i] > 1 && stride[i] > (max_bytes - last) / (size[i] - 1))
          fail(f + ": a stride out of range");
        last += (size[i] - 1) * stride[i];
      }
      if (last >= capacity) {
        fail(f + ": the view reaches element " + std::to_string(last) + " of a storage of " +
             std::to_string(capacity));
      }
    }
    auto t = at::empty({0}, at::TensorOptions(dtype).device(storage.device()));
    t.set_(storage, offset.toInt(), size, stride);
    if (requires_grad.toBool() && at::isFloatingType(dtype)) t.requires_grad_(true);
    return t;
  }

  static constexpr std::size_t max_stack = std::size_t{1} << 20, max_memo = std::size_t{1} << 22;
  static constexpr int64_t max_bytes = int64_t{1} << 48, max_copied = int64_t{1} << 22;

  std::string_view data_;
  std::size_t pos_ = 0;
  StorageLoader load_;
  std::optional<c10::Device> map_to_;
  std::vector<Item> stack_;
  std::vector<std::size_t> marks_;
  std::unordered_map<uint64_t, Item> memo_;
  std::unordered_map<std::string, std::pair<c10::Storage, int64_t>> storages_;
  int64_t copied_ = 0;
};

}  // namespace loom::checkpoint::detail
