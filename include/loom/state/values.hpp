#pragma once
// Small helpers over c10::IValue dicts read from checkpoints: typed lookups whose errors name
// the key path ("optimizer.param_groups.0.lr"), and the dict type loom writes.
#include <string>
#include <string_view>
#include <vector>

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

#include <loom/error.hpp>

namespace loom::state {

/// The dict type of what loom writes: any keys (strings, ints) to any values, in insertion order.
using Dict = c10::impl::GenericDict;

/// An empty Dict.
inline Dict new_dict() { return Dict(c10::AnyType::get(), c10::AnyType::get()); }

/// "a.b" (or "b" when `a` is empty).
inline std::string join(std::string_view a, std::string_view b) {
  return a.empty() ? std::string(b) : std::string(a) + "." + std::string(b);
}

/// Throws loom::Error "loom::load: 'PATH': WHAT".
[[noreturn]] inline void fail(std::string_view path, std::string_view what) {
  throw Error("loom::load: '" + std::string(path) + "': " + std::string(what));
}

/// `v` as a dict, or an error naming `path`.
inline Dict as_dict(const c10::IValue& v, std::string_view path) {
  if (!v.isGenericDict()) fail(path, "expected a dict, the checkpoint holds a " + v.tagKind());
  return v.toGenericDict();
}

/// d[key] or an error "has no 'key'" naming `path`.
inline c10::IValue at(const Dict& d, std::string_view key, std::string_view path) {
  auto it = d.find(c10::IValue(std::string(key)));
  if (it == d.end()) fail(path, "the checkpoint has no key '" + std::string(key) + "'");
  return it->value();
}

/// Whether d holds the string key `key`.
inline bool has(const Dict& d, std::string_view key) {
  return d.find(c10::IValue(std::string(key))) != d.end();
}

/// A number (Python float or int) as double.
inline double as_double(const c10::IValue& v, std::string_view path) {
  if (v.isDouble()) return v.toDouble();
  if (v.isInt()) return static_cast<double>(v.toInt());
  if (v.isBool()) return v.toBool() ? 1.0 : 0.0;
  fail(path, "expected a number, the checkpoint holds a " + v.tagKind());
}

/// An integer (Python int or bool); a float is refused.
inline int64_t as_int(const c10::IValue& v, std::string_view path) {
  if (v.isInt()) return v.toInt();
  if (v.isBool()) return v.toBool() ? 1 : 0;
  fail(path, "expected an integer, the checkpoint holds a " + v.tagKind());
}

/// A bool (Python bool, or the ints 0 and 1).
inline bool as_bool(const c10::IValue& v, std::string_view path) {
  if (v.isBool()) return v.toBool();
  if (v.isInt() && (v.toInt() == 0 || v.toInt() == 1)) return v.toInt() == 1;
  fail(path, "expected a bool, the checkpoint holds a " + v.tagKind());
}

/// A list or tuple's elements.
inline std::vector<c10::IValue> as_sequence(const c10::IValue& v, std::string_view path) {
  if (v.isList()) {
    auto l = v.toList();
    return std::vector<c10::IValue>(l.begin(), l.end());
  }
  if (v.isTuple()) {
    const auto& e = v.toTupleRef().elements();
    return std::vector<c10::IValue>(e.begin(), e.end());
  }
  fail(path, "expected a list or a tuple, the checkpoint holds a " + v.tagKind());
}

/// A tensor.
inline at::Tensor as_tensor(const c10::IValue& v, std::string_view path) {
  if (!v.isTensor()) fail(path, "expected a tensor, the checkpoint holds a " + v.tagKind());
  return v.toTensor();
}

/// "[2, 3]".
inline std::string shape_string(at::IntArrayRef sizes) {
  std::string s = "[";
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(sizes[i]);
  }
  return s + "]";
}

}  // namespace loom::state
