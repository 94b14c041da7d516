#pragma once
// Bitwise comparison of checkpoint values in tests: dicts (keys in order), lists, tuples,
// tensors, numbers, strings, devices.
#include <cstring>
#include <string>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

namespace loom::testing {

/// What to compare of two tensors besides dtype, shape and bits.
enum class Layout {
  Ignore,  ///< values only
  Exact,   ///< strides, storage offset and requires_grad too (what a file round trip keeps)
};

/// The first difference between `a` and `b`, at the path `where`; empty when they are the same
/// (types included; tensors and doubles bit for bit). CHECK(difference(a, b).empty()) shows it.
inline std::string difference(const c10::IValue& a, const c10::IValue& b,
                              Layout layout = Layout::Ignore, const std::string& where = "value") {
  const auto kinds = [&] { return where + ": " + a.tagKind() + " vs " + b.tagKind(); };
  if (a.tagKind() != b.tagKind()) return kinds();
  if (b.isTensor()) {
    const auto x = a.toTensor(), y = b.toTensor();
    if (x.scalar_type() != y.scalar_type()) {
      return where + ": dtype " + c10::toString(x.scalar_type()) + " vs " +
             c10::toString(y.scalar_type());
    }
    if (x.sizes() != y.sizes()) return where + ": the shapes differ";
    if (layout == Layout::Exact &&
        (x.strides() != y.strides() || x.storage_offset() != y.storage_offset() ||
         x.requires_grad() != y.requires_grad())) {
      return where + ": the strides, storage offsets or requires_grad differ";
    }
    if (x.numel() == 0) return {};
    const auto xb = x.detach().cpu().contiguous(), yb = y.detach().cpu().contiguous();
    return std::memcmp(xb.const_data_ptr(), yb.const_data_ptr(), xb.nbytes()) == 0
               ? std::string()
               : where + ": the values differ";
  }
  if (b.isGenericDict()) {
    const auto x = a.toGenericDict(), y = b.toGenericDict();
    if (x.size() != y.size()) return where + ": the dicts' sizes differ";
    auto xi = x.begin();
    for (auto yi = y.begin(); yi != y.end(); ++yi, ++xi) {
      const auto& k = yi->key();
      const std::string key = k.isString() ? k.toStringRef()
                              : k.isInt()  ? std::to_string(k.toInt())
                                           : k.tagKind();
      if (auto d = difference(xi->key(), k, layout, where + " key " + key); !d.empty()) return d;
      if (auto d = difference(xi->value(), yi->value(), layout, where + "." + key); !d.empty())
        return d;
    }
    return {};
  }
  if (b.isList() || b.isTuple()) {
    const bool list = b.isList();
    const auto x = list ? a.toListRef().vec() : a.toTupleRef().elements().vec();
    const auto y = list ? b.toListRef().vec() : b.toTupleRef().elements().vec();
    if (x.size() != y.size()) return where + ": the lengths differ";
    for (std::size_t i = 0; i < x.size(); ++i) {
      const auto at = where + (list ? "[" : "(") + std::to_string(i) + (list ? "]" : ")");
      if (auto d = difference(x[i], y[i], layout, at); !d.empty()) return d;
    }
    return {};
  }
  if (b.isDouble()) {
    const double x = a.toDouble(), y = b.toDouble();
    return std::memcmp(&x, &y, sizeof x) == 0
               ? std::string()
               : where + ": " + std::to_string(x) + " vs " + std::to_string(y);
  }
  if (b.isInt() || b.isBool() || b.isString() || b.isNone() || b.isDevice()) {
    return a == b ? std::string() : where + ": the values differ";
  }
  return where + ": cannot compare a " + b.tagKind();
}

}  // namespace loom::testing
