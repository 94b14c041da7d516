#pragma once
// A view over a source of batches that yields each batch moved to a device, then passed
// through a prefetch function: what DevicePolicy::dataloader_to_device returns.
#include <cstddef>
#include <iterator>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>

#include <loom/batch/walk.hpp>

namespace loom::device {

/// Applies nothing: the prefetch function used when none is given.
struct NoPrefetch {
  template <class B>
  B operator()(B b) const {
    return b;
  }
};

/// Yields `fn(batch::map(b, move))` for every batch b of `source`, in order, inline on the
/// iterating thread, with grad mode off while `fn` runs. device/prefetch.hpp has the threaded twin.
///
/// Source is any range whose iterators dereference to a batch (`torch::data` loaders included:
/// pass `*loader`). The view holds a reference: the source must outlive it.
template <class Source, class Move, class Fn>
class DeviceLoader {
  using source_iterator = decltype(std::declval<Source&>().begin());
  using source_sentinel = decltype(std::declval<Source&>().end());
  using source_batch = std::remove_cvref_t<decltype(*std::declval<source_iterator&>())>;

 public:
  /// The type of the batches this view yields.
  using batch_type = std::remove_cvref_t<std::invoke_result_t<Fn&, source_batch>>;

  DeviceLoader(Source& source, Move move, Fn fn)
      : source_(&source), move_(std::move(move)), fn_(std::move(fn)) {}

  class iterator {
   public:
    using value_type = batch_type;
    using difference_type = std::ptrdiff_t;
    using iterator_concept = std::input_iterator_tag;

    iterator() = default;
    iterator(DeviceLoader* owner, source_iterator it) : owner_(owner), it_(std::move(it)) {}

    value_type& operator*() const {
      if (!current_) {
        c10::AutoGradMode no_grad(false);  // as on PrefetchLoader's producer thread
        current_.emplace(owner_->fn_(batch::map(*it_, owner_->move_)));
      }
      return *current_;
    }
    iterator& operator++() {
      current_.reset();
      ++it_;
      return *this;
    }
    void operator++(int) { ++*this; }
    friend bool operator==(const iterator& i, std::default_sentinel_t) { return i.at_end(); }

   private:
    bool at_end() const { return it_ == *owner_->end_; }

    DeviceLoader* owner_ = nullptr;
    mutable source_iterator it_{};
    mutable std::optional<value_type> current_;
  };

  iterator begin() {
    end_.emplace(source_->end());
    return iterator(this, source_->begin());
  }
  std::default_sentinel_t end() const { return {}; }

 private:
  friend class iterator;
  Source* source_;
  Move move_;
  Fn fn_;
  std::optional<source_sentinel> end_;
};

}  // namespace loom::device
