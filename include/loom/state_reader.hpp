#pragma once
// loom::state::Reader: the one reader of the states that load_state_dict receives (a
// StateDict, or a dict in Python's layout), and the one wording of their errors:
//
//   OWNER: missing key "PATH"
//   OWNER: key "PATH": expected a number, got a str
//   OWNER: key "PATH": WHAT                      (a check of the owner's own)
//   OWNER: unexpected key(s) "a", "b"
//
// OWNER names the function that loads ("loom::amp::GradScaler::load_state_dict"); PATH is the
// key's path from the top of the state, its parts joined by "." ("_schedule_phases.0.end_lr").
// A value is named in Python's words: a float, an int, a bool, a str, a tensor, a list, a
// tuple, a dict, None.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <loom/error.hpp>
#include <loom/state_dict.hpp>

namespace loom::state {

/// "a.b" (or "b" when `a` is empty, "a" when `b` is).
inline std::string join(std::string_view a, std::string_view b) {
  if (a.empty()) return std::string(b);
  if (b.empty()) return std::string(a);
  return std::string(a) + "." + std::string(b);
}

/// What `v` is, in Python's words: "a float", "an int", "a bool", "a str", "a tensor", ...
inline std::string kind_of(const c10::IValue& v) {
  if (v.isNone()) return "None";
  if (v.isDouble()) return "a float";
  if (v.isInt()) return "an int";
  if (v.isBool()) return "a bool";
  if (v.isString()) return "a str";
  if (v.isTensor()) return "a tensor";
  if (v.isList()) return "a list";
  if (v.isTuple()) return "a tuple";
  if (v.isGenericDict()) return "a dict";
  return "a " + v.tagKind();
}

/// Throws loom::Error `OWNER: key "PATH": WHAT` (`OWNER: WHAT` when `path` is empty).
[[noreturn]] inline void fail_key(std::string_view owner, std::string_view path,
                                  std::string_view what) {
  std::string text(owner);
  text += ": ";
  if (!path.empty()) text += "key \"" + std::string(path) + "\": ";
  text += what;
  throw Error(text);
}

/// Throws loom::Error `OWNER: missing key "PATH"`.
[[noreturn]] inline void fail_missing(std::string_view owner, std::string_view path) {
  throw Error(std::string(owner) + ": missing key \"" + std::string(path) + "\"");
}

/// Throws loom::Error `OWNER: unexpected key(s) "a", "b"`.
[[noreturn]] inline void fail_unexpected(std::string_view owner,
                                         const std::vector<std::string>& paths) {
  std::string text(owner);
  text += ": unexpected key(s) ";
  for (std::size_t i = 0; i < paths.size(); ++i) {
    if (i) text += ", ";
    text += "\"" + paths[i] + "\"";
  }
  throw Error(text);
}

/// Throws loom::Error `OWNER: key "PATH": expected EXPECTED, got KIND`.
[[noreturn]] inline void fail_type(std::string_view owner, std::string_view path,
                                   std::string_view expected, const c10::IValue& got) {
  fail_key(owner, path, "expected " + std::string(expected) + ", got " + kind_of(got));
}

// The conversions, one rule each (Python's: a bool is an int, an int is a number).

/// A number: a float, an int or a bool, as double.
inline double number_of(const c10::IValue& v, std::string_view owner, std::string_view path) {
  if (v.isDouble()) return v.toDouble();
  if (v.isInt()) return static_cast<double>(v.toInt());
  if (v.isBool()) return v.toBool() ? 1.0 : 0.0;
  fail_type(owner, path, "a number", v);
}

/// An integer: an int or a bool; a float is refused.
inline int64_t integer_of(const c10::IValue& v, std::string_view owner, std::string_view path) {
  if (v.isInt()) return v.toInt();
  if (v.isBool()) return v.toBool() ? 1 : 0;
  fail_type(owner, path, "an int", v);
}

/// A bool, or the ints 0 and 1.
inline bool boolean_of(const c10::IValue& v, std::string_view owner, std::string_view path) {
  if (v.isBool()) return v.toBool();
  if (v.isInt() && (v.toInt() == 0 || v.toInt() == 1)) return v.toInt() == 1;
  fail_type(owner, path, "a bool", v);
}

/// A str.
inline std::string string_of(const c10::IValue& v, std::string_view owner, std::string_view path) {
  if (v.isString()) return v.toStringRef();
  fail_type(owner, path, "a str", v);
}

/// A tensor.
inline at::Tensor tensor_of(const c10::IValue& v, std::string_view owner, std::string_view path) {
  if (v.isTensor()) return v.toTensor();
  fail_type(owner, path, "a tensor", v);
}

/// A list's or a tuple's elements.
inline std::vector<c10::IValue> sequence_of(const c10::IValue& v, std::string_view owner,
                                            std::string_view path) {
  if (v.isList()) {
    auto l = v.toList();
    return std::vector<c10::IValue>(l.begin(), l.end());
  }
  if (v.isTuple()) {
    const auto& e = v.toTupleRef().elements();
    return std::vector<c10::IValue>(e.begin(), e.end());
  }
  fail_type(owner, path, "a list", v);
}

/// A dict (of any keys).
inline Dict dict_of(const c10::IValue& v, std::string_view owner, std::string_view path) {
  if (v.isGenericDict()) return v.toGenericDict();
  fail_type(owner, path, "a dict", v);
}

/// Reads one state: typed getters that name the key's path when it is missing or of another
/// kind, and finish(), which refuses the keys nothing read. Every getter marks its key read;
/// ignore() marks a key that is accepted and not used.
///
///   state::Reader r("loom::amp::GradScaler::load_state_dict", state);
///   const double scale = r.number("scale");
///   const int64_t tracker = r.integer("_growth_tracker");
///   r.finish();
class Reader {
 public:
  /// A reader of a StateDict; `owner` starts every error.
  Reader(std::string owner, const StateDict& state) : owner_(std::move(owner)) {
    for (const auto& [key, value] : state) entries_.push_back({key, value, false});
  }

  /// A reader of a loaded value, which must be a dict of str keys; `path` is its own key path
  /// ("" at the top of the state).
  Reader(std::string owner, const c10::IValue& state, std::string path = {})
      : owner_(std::move(owner)), path_(std::move(path)) {
    for (const auto& e : dict_of(state, owner_, path_)) {
      if (!e.key().isString()) {
        fail_key(owner_, path_, "expected a dict of str keys, got " + kind_of(e.key()) + " key");
      }
      entries_.push_back({e.key().toStringRef(), e.value(), false});
    }
  }

  /// The name every error starts with.
  const std::string& owner() const noexcept { return owner_; }
  /// This dict's key path ("" at the top).
  const std::string& path() const noexcept { return path_; }
  /// `key`'s path: path().key.
  std::string path(std::string_view key) const { return join(path_, key); }

  bool empty() const noexcept { return entries_.empty(); }
  std::size_t size() const noexcept { return entries_.size(); }
  /// Whether the dict holds `key` (does not mark it read).
  bool has(std::string_view key) const { return index(key) != npos; }

  /// The value of `key`, or an error naming its path.
  const c10::IValue& value(std::string_view key) {
    const auto* v = find(key);
    if (v == nullptr) fail_missing(owner_, path(key));
    return *v;
  }
  /// The value of `key`, or null where the dict has none.
  const c10::IValue* find(std::string_view key) {
    const std::size_t i = index(key);
    if (i == npos) return nullptr;
    entries_[i].read = true;
    return &entries_[i].value;
  }

  double number(std::string_view key) { return number_of(value(key), owner_, path(key)); }
  int64_t integer(std::string_view key) { return integer_of(value(key), owner_, path(key)); }
  bool boolean(std::string_view key) { return boolean_of(value(key), owner_, path(key)); }
  std::string string(std::string_view key) { return string_of(value(key), owner_, path(key)); }
  at::Tensor tensor(std::string_view key) { return tensor_of(value(key), owner_, path(key)); }
  /// A list's or a tuple's elements.
  std::vector<c10::IValue> list(std::string_view key) {
    return sequence_of(value(key), owner_, path(key));
  }
  /// A list of numbers; an element of another kind is named by its path ("base_lrs.1").
  std::vector<double> numbers(std::string_view key) {
    const auto elements = list(key);
    std::vector<double> out;
    out.reserve(elements.size());
    for (std::size_t i = 0; i < elements.size(); ++i) {
      out.push_back(number_of(elements[i], owner_, join(path(key), std::to_string(i))));
    }
    return out;
  }
  /// A dict of any keys, as it is.
  Dict dict(std::string_view key) { return dict_of(value(key), owner_, path(key)); }
  /// A reader of the dict of str keys at `key`; its errors name the keys' full paths.
  Reader child(std::string_view key) { return Reader(owner_, value(key), path(key)); }
  /// Readers of a list of dicts, one per element ("key.0", "key.1", ...).
  std::vector<Reader> children(std::string_view key) {
    const auto elements = list(key);
    std::vector<Reader> out;
    out.reserve(elements.size());
    for (std::size_t i = 0; i < elements.size(); ++i) {
      out.emplace_back(owner_, elements[i], join(path(key), std::to_string(i)));
    }
    return out;
  }

  // Optional keys: nullopt where the dict has none, an error where it has another kind.
  std::optional<double> optional_number(std::string_view key) { return optional(key, number_of); }
  std::optional<int64_t> optional_integer(std::string_view key) {
    return optional(key, integer_of);
  }
  std::optional<bool> optional_boolean(std::string_view key) { return optional(key, boolean_of); }
  std::optional<std::string> optional_string(std::string_view key) {
    return optional(key, string_of);
  }
  std::optional<at::Tensor> optional_tensor(std::string_view key) {
    return optional(key, tensor_of);
  }

  /// Accepts `key` without reading it (a key of another version or another policy).
  void ignore(std::string_view key) { (void)find(key); }

  /// Throws `OWNER: unexpected key(s) ...` naming every key nothing read, in the dict's order.
  void finish() const {
    std::vector<std::string> unread;
    for (const auto& e : entries_) {
      if (!e.read) unread.push_back(path(e.key));
    }
    if (!unread.empty()) fail_unexpected(owner_, unread);
  }

  /// Throws `OWNER: key "PATH": WHAT` for `key` ("" names this dict itself).
  [[noreturn]] void fail(std::string_view key, std::string_view what) const {
    fail_key(owner_, path(key), what);
  }

 private:
  struct Entry {
    std::string key;
    c10::IValue value;
    bool read;
  };
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);

  std::size_t index(std::string_view key) const {
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      if (entries_[i].key == key) return i;
    }
    return npos;
  }
  template <class Convert>
  auto optional(std::string_view key, Convert convert)
      -> std::optional<decltype(convert(c10::IValue(), std::string_view(), std::string_view()))> {
    const auto* v = find(key);
    if (v == nullptr) return std::nullopt;
    return convert(*v, owner_, path(key));
  }

  std::string owner_;
  std::string path_;
  std::vector<Entry> entries_;
};

}  // namespace loom::state
