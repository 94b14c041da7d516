#pragma once
#include <c10/core/DefaultDtype.h>
#include <c10/core/ScalarType.h>
#include <c10/core/ScalarTypeToTypeMeta.h>
#include <c10/util/typeid.h>

#include <new>
#include <utility>

namespace loom {

/// A scope guard that changes nothing: what a policy returns when a context has no effect.
struct [[nodiscard]] NullGuard {
  NullGuard() = default;
  NullGuard(const NullGuard&) = delete;
  NullGuard& operator=(const NullGuard&) = delete;
  ~NullGuard() = default;
};

/// A scope guard that sets LibTorch's process-global default dtype and restores it on exit.
///
/// Only the floating types LibTorch can default to are allowed (the C++ setter checks nothing).
/// The previous value comes back when the scope ends, exceptions included; guards nest LIFO.
/// The default dtype is process-global: never keep guards alive on two threads at once.
template <c10::ScalarType Dtype>
class [[nodiscard]] DefaultDtypeGuard {
  static_assert(
      Dtype == c10::kFloat || Dtype == c10::kDouble || Dtype == c10::kHalf ||
          Dtype == c10::kBFloat16,
      "loom::DefaultDtypeGuard<Dtype>: Dtype must be kFloat, kDouble, kHalf or kBFloat16, "
      "the floating types LibTorch can use as its default dtype");

 public:
  DefaultDtypeGuard() : saved_(c10::get_default_dtype()) {
    c10::set_default_dtype(c10::scalarTypeToTypeMeta(Dtype));
  }
  DefaultDtypeGuard(const DefaultDtypeGuard&) = delete;
  DefaultDtypeGuard& operator=(const DefaultDtypeGuard&) = delete;
  ~DefaultDtypeGuard() { c10::set_default_dtype(saved_); }

 private:
  caffe2::TypeMeta saved_;
};

/// A scope guard that is `Guard` when enabled and nothing otherwise: the guard is built in place
/// from what `make()` returns (a guard need not be movable), and ended when the scope ends.
/// Runtime::no_backward_sync returns one, so a loop can write one line for every micro-batch.
template <class Guard>
class [[nodiscard]] OptionalScope {
 public:
  template <class Make>
  OptionalScope(bool enabled, Make&& make) : engaged_(enabled) {
    if (enabled) ::new (static_cast<void*>(&guard_)) Guard(std::forward<Make>(make)());
  }
  OptionalScope(const OptionalScope&) = delete;
  OptionalScope& operator=(const OptionalScope&) = delete;
  ~OptionalScope() {
    if (engaged_) guard_.~Guard();
  }

  /// Whether the guard is alive.
  bool engaged() const noexcept { return engaged_; }

 private:
  union {
    Guard guard_;
  };
  bool engaged_;
};

}  // namespace loom
