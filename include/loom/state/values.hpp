#pragma once
// Typed lookups in the dicts rt.load reads from a checkpoint, for the state/ headers that walk
// them by key path ("optimizer.param_groups.0.lr"). They are state_reader.hpp's conversions
// and error wording with the owner "loom::load":
//
//   loom::load: missing key "optimizer.param_groups.0.lr"
//   loom::load: key "optimizer.param_groups.0.lr": expected a number, got a str
#include <string>
#include <string_view>
#include <vector>

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

#include <loom/error.hpp>
#include <loom/state_dict.hpp>
#include <loom/state_reader.hpp>

namespace loom::state {

/// The owner of the errors of rt.load's walk through a checkpoint.
inline constexpr std::string_view load_owner = "loom::load";

/// Throws loom::Error `loom::load: key "PATH": WHAT`.
[[noreturn]] inline void fail(std::string_view path, std::string_view what) {
  fail_key(load_owner, path, what);
}

/// `v` as a dict, or an error naming `path`.
inline Dict as_dict(const c10::IValue& v, std::string_view path) {
  return dict_of(v, load_owner, path);
}

/// d[key], or `loom::load: missing key "PATH.key"`.
inline c10::IValue at(const Dict& d, std::string_view key, std::string_view path) {
  auto it = d.find(c10::IValue(std::string(key)));
  if (it == d.end()) fail_missing(load_owner, join(path, key));
  return it->value();
}

/// Whether d holds the string key `key`.
inline bool has(const Dict& d, std::string_view key) {
  return d.find(c10::IValue(std::string(key))) != d.end();
}

/// A number (Python float, int or bool) as double.
inline double as_double(const c10::IValue& v, std::string_view path) {
  return number_of(v, load_owner, path);
}

/// An integer (Python int or bool); a float is refused.
inline int64_t as_int(const c10::IValue& v, std::string_view path) {
  return integer_of(v, load_owner, path);
}

/// A bool (Python bool, or the ints 0 and 1).
inline bool as_bool(const c10::IValue& v, std::string_view path) {
  return boolean_of(v, load_owner, path);
}

/// A list or tuple's elements.
inline std::vector<c10::IValue> as_sequence(const c10::IValue& v, std::string_view path) {
  return sequence_of(v, load_owner, path);
}

/// A tensor.
inline at::Tensor as_tensor(const c10::IValue& v, std::string_view path) {
  return tensor_of(v, load_owner, path);
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
