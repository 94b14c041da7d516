#pragma once
// Asynchronous saves: snapshot(value) copies a checkpoint value's tensors into host memory of
// its own (pinned, by asynchronous copies, for device tensors), and AsyncWriter writes such a
// snapshot through a CheckpointIO in a background thread while training goes on.
// loom::Checkpoints::save(rt, step, state, {.async = true}) uses both; AsyncFile is the
// CheckpointIO that a strategy's save_checkpoint hands the value to on the ranks that write.
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <loom/checkpoint/checkpoint_io.hpp>
#include <loom/checkpoint/io.hpp>
#include <loom/error.hpp>

namespace loom::checkpoint {

/// Host buffers one snapshot leaves for the next (AsyncWriter keeps them): storages by their
/// size in bytes and whether they are pinned.
using BufferPool = std::multimap<std::pair<int64_t, bool>, c10::Storage>;

/// A copy of a checkpoint value that training can no longer change: the same dicts, lists,
/// tuples and scalars, every tensor's storage copied once into host memory (tensors that share
/// a storage still share the copy, with their offsets and strides, as torch.save keeps them).
/// Device storages are copied into pinned memory without waiting for the device; ready()
/// waits for those copies. Given a BufferPool, it copies into the pool's buffers of the right
/// sizes before it allocates any (a fresh allocation costs a page fault per page, and pinning).
class Snapshot {
 public:
  explicit Snapshot(const c10::IValue& value, BufferPool* pool = nullptr)
      : pool_(pool), value_(copy(value)) {
    for (auto& [device, event] : events_) {
      (void)device;
      c10::impl::VirtualGuardImpl guard(event.device_type());
      event.record(guard.getStream(event.device()));
    }
  }
  Snapshot(const Snapshot&) = delete;
  Snapshot& operator=(const Snapshot&) = delete;

  /// The copy, once the device copies have finished (waits for them).
  const c10::IValue& ready() {
    for (auto& [device, event] : events_) {
      (void)device;
      event.synchronize();
    }
    events_.clear();
    return value_;
  }
  /// Bytes of tensor storage copied.
  std::size_t bytes() const { return bytes_; }
  /// Hands the copy's buffers to `pool` for the next snapshot; the copy must not be used after.
  void release_buffers(BufferPool& pool) {
    for (auto& [key, storage] : buffers_) pool.emplace(key, std::move(storage));
    buffers_.clear();
  }

 private:
  c10::IValue copy(const c10::IValue& v) {
    if (v.isTensor()) return copy_tensor(v.toTensor());
    if (v.isGenericDict()) {
      const auto from = v.toGenericDict();
      c10::impl::GenericDict to(from.keyType(), from.valueType());
      to.reserve(from.size());
      for (const auto& item : from) to.insert(item.key(), copy(item.value()));
      return to;
    }
    if (v.isList()) {
      const auto from = v.toList();
      c10::impl::GenericList to(from.elementType());
      to.reserve(from.size());
      for (std::size_t i = 0; i < from.size(); ++i) to.push_back(copy(from.get(i)));
      return to;
    }
    if (v.isTuple()) {
      std::vector<c10::IValue> items;
      for (const auto& item : v.toTupleRef().elements()) items.push_back(copy(item));
      return c10::ivalue::Tuple::create(std::move(items));
    }
    if (v.isNone() || v.isInt() || v.isDouble() || v.isBool() || v.isString() ||
        v.isComplexDouble()) {
      return v;  // immutable
    }
    throw Error(std::string("loom::checkpoint::Snapshot: cannot copy a value of type ") +
                v.tagKind() + " for an asynchronous save");
  }

  at::Tensor copy_tensor(const at::Tensor& t) {
    if (!t.defined()) return t;
    if (t.layout() != at::kStrided || t.is_quantized() || t.is_nested()) {
      throw Error(
          "loom::checkpoint::Snapshot: an asynchronous save takes dense tensors; this "
          "one is " +
          std::string(c10::toString(t.layout())) + " " + std::string(t.toString()));
    }
    const c10::Storage& from = t.storage();
    auto it = storages_.find(from.unsafeGetStorageImpl());
    if (it == storages_.end()) {
      const auto nbytes = static_cast<int64_t>(from.nbytes());
      const bool on_device = !t.device().is_cpu();
      at::Tensor buffer;
      const std::pair<int64_t, bool> key{nbytes, on_device};
      if (auto kept = pool_ ? pool_->find(key) : BufferPool::iterator();
          pool_ && kept != pool_->end()) {
        buffer = at::empty({0}, at::TensorOptions(at::kByte));
        buffer.set_(kept->second, 0, {nbytes}, {1});
        pool_->erase(kept);
      } else {
        buffer = at::empty({nbytes}, at::TensorOptions(at::kByte).pinned_memory(on_device));
      }
      buffers_.emplace_back(key, buffer.storage());
      if (nbytes > 0) {
        at::Tensor source = at::empty({0}, t.options().dtype(at::kByte));
        source.set_(from, 0, {nbytes}, {1});
        buffer.copy_(source, /*non_blocking=*/on_device);
        if (on_device && events_.find(t.device()) == events_.end()) {
          events_.emplace(t.device(), c10::Event(t.device().type()));
        }
      }
      bytes_ += static_cast<std::size_t>(nbytes);
      it = storages_.emplace(from.unsafeGetStorageImpl(), buffer.storage()).first;
    }
    at::Tensor out = at::empty({0}, at::TensorOptions(t.scalar_type()));
    out.set_(it->second, t.storage_offset(), t.sizes(), t.strides());
    return out;
  }

  BufferPool* pool_;
  std::vector<std::pair<std::pair<int64_t, bool>, c10::Storage>> buffers_;
  std::unordered_map<const c10::StorageImpl*, c10::Storage> storages_;
  std::unordered_map<c10::Device, c10::Event> events_;
  std::size_t bytes_ = 0;
  c10::IValue value_;
};

/// Writes snapshots through a CheckpointIO in a background thread, one at a time. Once a write
/// is done, its copy's host buffers are kept for the next snapshot (a run's saves have the
/// same sizes): a steady run holds one copy of its state in host memory between saves.
///
///   AsyncWriter writer;
///   writer.start(path, value);        // the snapshot is taken here; the write runs on
///   ...train...
///   if (auto error = writer.wait()) std::rethrow_exception(error);
class AsyncWriter {
 public:
  explicit AsyncWriter(SaveOptions options = {}) : options_(options) {}
  AsyncWriter(const AsyncWriter&) = delete;
  AsyncWriter& operator=(const AsyncWriter&) = delete;
  /// Joins a write under way (its error, if any, is dropped: call wait() to see it).
  ~AsyncWriter() { (void)wait(); }

  void set_options(SaveOptions options) { options_ = options; }

  /// Copies `value` (Snapshot) and starts writing the copy to `path` through TorchFile (atomic,
  /// SaveOptions as given) in a thread of its own. One write at a time: wait() for the last
  /// one first (a loom::Error otherwise).
  void start(const std::filesystem::path& path, const c10::IValue& value) {
    const SaveOptions options = options_;
    run(value, [path, options](const c10::IValue& copy) { save_value(path, copy, options); });
  }

  /// Copies `value` (Snapshot) and calls `write(copy)` in a thread of its own: a save of
  /// another layout than one file (a DCP directory, whose ranks also agree in that thread on
  /// a group of their own). What `write` throws is wait()'s error. One write at a time.
  void run(const c10::IValue& value, std::function<void(const c10::IValue&)> write) {
    if (thread_.joinable()) {
      throw Error("loom::checkpoint::AsyncWriter: a write is under way; wait() for it first");
    }
    auto snapshot = std::make_shared<Snapshot>(value, &pool_);
    pool_.clear();  // what the new copy did not reuse
    snapshot_ = snapshot;
    thread_ = std::thread([this, snapshot, write = std::move(write)] {
      try {
        write(snapshot->ready());
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        error_ = std::current_exception();
      }
    });
  }

  /// The SaveOptions writes are made with.
  const SaveOptions& options() const { return options_; }

  /// True while a write started by start() or run() may be under way (until wait()).
  bool pending() const { return thread_.joinable(); }

  /// Waits for the write under way, if any, and returns its error (nullptr when it succeeded
  /// or there was none), clearing it.
  std::exception_ptr wait() {
    if (thread_.joinable()) thread_.join();
    if (snapshot_) {  // written: its buffers serve the next snapshot
      snapshot_->release_buffers(pool_);
      snapshot_.reset();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    return std::exchange(error_, nullptr);
  }

 private:
  SaveOptions options_;
  std::shared_ptr<Snapshot> snapshot_;  // the copy being written
  BufferPool pool_;                     // the last copy's buffers, for the next one
  std::thread thread_;
  std::mutex mutex_;
  std::exception_ptr error_;
};

/// The CheckpointIO of an asynchronous save: save() hands the value to an AsyncWriter (the
/// snapshot is taken before it returns, the file is written later); load() reads as TorchFile.
class AsyncFile final : public CheckpointIO {
 public:
  explicit AsyncFile(AsyncWriter& writer) : writer_(&writer) {}
  void save(const std::filesystem::path& path, const c10::IValue& value) const override {
    writer_->start(path, value);
  }
  c10::IValue load(const std::filesystem::path& path, c10::Device map_location) const override {
    return load_value(path, map_location);
  }
  /// The writer: a strategy that writes another layout than one file per rank hands it its
  /// own write (AsyncWriter::run).
  AsyncWriter& writer() const { return *writer_; }

 private:
  AsyncWriter* writer_;
};

}  // namespace loom::checkpoint
