#pragma once
// A view over a source of batches that runs the source, the device move and the prefetch
// function on one producer thread, a bounded number of batches ahead of the consumer.
//
//   consumer thread (the training loop)          producer thread (one per epoch)
//   begin(): stop the last epoch, start one  ->  scope = stage.producer_scope()  grad off
//   ++it: pop the next item (blocks)         <-  wait for room; ++source; *source
//         item.take(): ready on this thread      stage.produce(batch, fn): move, fn
//   ~iterator / ~PrefetchLoader: stop, join      pushes a batch, an exception, or the end
//
// The queue holds at most `depth` items, and the producer fetches a batch from the source
// only when there is room for it, so at most `depth` batches are fetched and not yet handed
// out (the one the consumer holds not counted). A Stage says how a batch reaches the device:
// HostStage below for devices whose moves need no synchronisation (Cpu), CudaStage in
// device/cuda_prefetch.hpp (a side stream and an event). Page: docs/data-path.md
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>

#include <loom/batch/walk.hpp>
#include <loom/error.hpp>

namespace loom::device {

/// Asks dataloader_to_device for a producer thread that runs `depth` batches ahead.
///
/// depth 1 is double buffering (the consumer uses batch i while batch i+1 is made); 2 is the
/// most loom accepts, since each extra batch costs device memory and hides no more latency.
struct Prefetch {
  std::size_t depth = 1;
};

/// How a batch moves on the producer thread when the device needs no synchronisation.
///
///   stage.producer_scope()   built first on the producer thread: disables grad mode
///   stage.produce(b, fn)     fn(batch::map(b, move)), as a Ready<B>
///   ready.take()             on the consumer thread: the batch
template <class Move>
class HostStage {
 public:
  /// A batch made on the producer thread, ready as it is.
  template <class B>
  struct Ready {
    B batch;
    B take() && { return std::move(batch); }
  };

  explicit HostStage(Move move) : move_(std::move(move)) {}

  /// This stage for an epoch started on the calling (consumer) thread.
  HostStage for_epoch() const { return *this; }

  /// Grad mode is per thread: prefetch_fn never records autograd history.
  c10::AutoGradMode producer_scope() const { return c10::AutoGradMode(false); }

  template <class B, class Fn>
  auto produce(const B& b, Fn& fn) const {
    using Out = std::remove_cvref_t<std::invoke_result_t<Fn&, B>>;
    return Ready<Out>{fn(batch::map(b, move_))};
  }

 private:
  Move move_;
};

/// Yields `fn(batch::map(b, move))` for every batch b of `source`, in order, made on a producer
/// thread at most `depth` batches ahead; see the diagram at the top of this file.
///
/// Source is any range whose iterators dereference to a batch (`torch::data` loaders included:
/// pass `*loader`); only the producer thread touches it while an epoch runs. The view holds a
/// reference: the source must outlive it. An exception from the source or from `fn` is
/// rethrown by the iterator increment (or begin()) that would have yielded that batch.
/// Leaving a loop early, destroying the view, or calling begin() again stops the producer and
/// joins it (after the batch it is making, if any).
template <class Source, class Stage, class Fn>
class PrefetchLoader {
  using source_iterator = decltype(std::declval<Source&>().begin());
  using source_batch = std::remove_cvref_t<decltype(*std::declval<source_iterator&>())>;
  using staged_type = decltype(std::declval<const Stage&>().produce(
      std::declval<const source_batch&>(), std::declval<Fn&>()));

 public:
  /// The type of the batches this view yields.
  using batch_type = std::remove_cvref_t<decltype(std::declval<staged_type&&>().take())>;

  PrefetchLoader(Source& source, Stage stage, Fn fn, Prefetch prefetch)
      : shared_(std::make_shared<Shared>(Shared{&source, std::move(stage), std::move(fn)})),
        depth_(prefetch.depth) {
    if (depth_ < 1 || depth_ > 2) {
      throw Error("loom::Prefetch: depth must be 1 or 2, not " + std::to_string(depth_));
    }
  }
  PrefetchLoader(PrefetchLoader&&) noexcept = default;
  PrefetchLoader& operator=(PrefetchLoader&& other) noexcept {
    if (this != &other) {
      stop();
      shared_ = std::move(other.shared_);
      depth_ = other.depth_;
      epoch_ = std::move(other.epoch_);
    }
    return *this;
  }
  ~PrefetchLoader() { stop(); }

 private:
  /// What the producer thread uses; it holds a reference, so the view may move meanwhile.
  struct Shared {
    Source* source;
    Stage stage;
    Fn fn;
  };

  /// What the producer hands over: a staged batch, an exception, or (neither) the end.
  struct Item {
    std::optional<staged_type> staged;
    std::exception_ptr error;
  };

  /// One pass over the source: the queue, its producer thread, and the stop flag.
  class Epoch {
   public:
    explicit Epoch(std::size_t depth) : depth_(depth) {}
    Epoch(const Epoch&) = delete;
    Epoch& operator=(const Epoch&) = delete;
    ~Epoch() { stop(); }

    /// Starts the producer; the stage is bound to the calling (consumer) thread's state.
    void start(std::shared_ptr<Shared> shared) {
      Stage stage = shared->stage.for_epoch();
      thread_ = std::thread(
          [this, shared = std::move(shared), stage = std::move(stage)] { run(*shared, stage); });
    }

    /// Tells the producer to stop and waits for it; safe to call more than once.
    void stop() {
      {
        std::lock_guard lock(mutex_);
        stop_ = true;
      }
      room_.notify_all();
      ready_.notify_all();
      std::lock_guard join_lock(join_mutex_);
      if (thread_.joinable()) thread_.join();
    }

    /// The next item, waiting for the producer if needed; the end once stopped.
    Item pop() {
      std::unique_lock lock(mutex_);
      ready_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return Item{};
      Item item = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      room_.notify_one();
      return item;
    }

   private:
    void run(Shared& shared, const Stage& stage) {
      [[maybe_unused]] auto scope = stage.producer_scope();
      try {
        if (!wait_for_room()) return;
        auto it = shared.source->begin();
        auto end = shared.source->end();
        while (!(it == end)) {
          if (!push(Item{stage.produce(*it, shared.fn), nullptr})) return;
          if (!wait_for_room()) return;
          ++it;
        }
        push(Item{});
      } catch (...) {
        push(Item{std::nullopt, std::current_exception()});
      }
    }

    /// Waits until the queue has room for one more batch; false once stopped.
    bool wait_for_room() {
      std::unique_lock lock(mutex_);
      room_.wait(lock, [&] { return stop_ || queue_.size() < depth_; });
      return !stop_;
    }

    bool push(Item item) {
      {
        std::lock_guard lock(mutex_);
        if (stop_) return false;
        queue_.push_back(std::move(item));
      }
      ready_.notify_one();
      return true;
    }

    std::size_t depth_;
    std::mutex mutex_;
    std::condition_variable ready_;  // an item was pushed, or stop_ was set
    std::condition_variable room_;   // an item was popped, or stop_ was set
    std::deque<Item> queue_;
    bool stop_ = false;
    std::mutex join_mutex_;
    std::thread thread_;
  };

 public:
  /// A move-only input iterator; it owns its epoch and stops it when destroyed.
  class iterator {
   public:
    using value_type = batch_type;
    using difference_type = std::ptrdiff_t;
    using iterator_concept = std::input_iterator_tag;

    iterator() = default;
    explicit iterator(std::shared_ptr<Epoch> epoch) : epoch_(std::move(epoch)) { next(); }
    iterator(iterator&&) noexcept = default;
    iterator& operator=(iterator&& other) noexcept {
      if (this != &other) {
        if (epoch_) epoch_->stop();
        epoch_ = std::move(other.epoch_);
        current_ = std::move(other.current_);
        finished_ = other.finished_;
      }
      return *this;
    }
    ~iterator() {
      if (epoch_) epoch_->stop();
    }

    value_type& operator*() const { return *current_; }
    iterator& operator++() {
      next();
      return *this;
    }
    void operator++(int) { ++*this; }
    friend bool operator==(const iterator& i, std::default_sentinel_t) { return !i.current_; }

   private:
    void next() {
      current_.reset();
      if (!epoch_ || finished_) return;
      finished_ = true;  // until a batch arrives: an error or the end leaves the iterator at end
      Item item = epoch_->pop();
      if (item.error) std::rethrow_exception(item.error);
      if (item.staged) {
        current_.emplace(std::move(*item.staged).take());
        finished_ = false;
      }
    }

    std::shared_ptr<Epoch> epoch_;
    mutable std::optional<value_type> current_;
    bool finished_ = false;
  };

  /// Starts an epoch (stopping the previous one) and waits for its first batch.
  iterator begin() {
    stop();
    auto epoch = std::make_shared<Epoch>(depth_);
    epoch->start(shared_);
    epoch_ = epoch;
    return iterator(std::move(epoch));
  }
  std::default_sentinel_t end() const { return {}; }

  /// How many batches the producer may run ahead.
  std::size_t depth() const { return depth_; }

 private:
  void stop() {
    if (auto epoch = epoch_.lock()) epoch->stop();
  }

  std::shared_ptr<Shared> shared_;
  std::size_t depth_;
  std::weak_ptr<Epoch> epoch_;
};

}  // namespace loom::device
