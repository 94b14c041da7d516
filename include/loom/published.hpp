#pragma once
// loom::Published<M>: a learner thread publishes its model's weights; any number of reader
// threads (actors, an inference service) take the latest version and run it, lock-free and
// never torn. LibTorch has no thread-safe way to read weights an optimizer is writing (a
// module is not safe to copy while it trains, and most modules cannot be cloned at all).
//
//   loom::Published<Policy> published(policy);            // after rt.setup: version 0
//   // learner thread:
//   rt.optimizer_step(opt);
//   published.publish(policy);                            // version 1, 2, ...
//   // any reader thread:
//   c10::InferenceMode guard;
//   auto snap = published.latest();                       // holds one version while alive
//   at::Tensor action = snap->forward(observation);       // snap.version() says which
//
// Published keeps replicas of the model (made once, by loom), each a slot: publish() copies
// the model's parameters and buffers into a slot no reader holds (cast to the readers' dtype,
// on their device) and then makes it the latest; latest() pins the latest slot while its
// Snapshot lives. The two meet only through atomics: a reader never waits for the learner nor
// the learner for a reader, a reader never sees a slot being written (the learner writes only
// slots no reader holds and that are not the latest), and a snapshot's weights are exactly one
// version's. A reader holding an old snapshot costs memory, not time: when every slot is held
// the learner makes another; slots are reused once released, so after warm-up (readers + 2
// slots) publish() allocates nothing. A snapshot's replica is shared by the readers holding
// the same version, in eval mode, its parameters not requiring grad: its forward must not
// change the module (true of LibTorch's layers in eval mode), and readers run it under
// c10::InferenceMode or a NoGradGuard.
//
// Learner on CUDA, readers on the CPU (PublishOptions::device): the copy runs on a side stream
// into pinned memory after the learner's stream has reached publish(), and the learner's
// stream waits for the copy before it goes on (the next optimizer step cannot overwrite
// weights being read); nothing waits on the host. The version becomes the latest when its copy
// has completed, seen at the learner's next publish() or poll().
#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <loom/nn/impl_of.hpp>

namespace loom {

/// Where and how readers get the weights.
struct PublishOptions {
  /// The dtype of the snapshots' floating-point parameters and buffers (the learner trains
  /// fp32 master weights, actors run bf16): none, the model's.
  std::optional<c10::ScalarType> dtype = std::nullopt;
  /// The snapshots' device (the learner on CUDA, actors on the CPU): none, the model's.
  std::optional<c10::Device> device = std::nullopt;
};

namespace detail {

/// The type-independent part of Published: the slots, their atomics and the copies
/// (src/published.cpp).
class PublishedCore {
 public:
  struct Slot;
  using MakeReplica = std::function<std::shared_ptr<torch::nn::Module>()>;

  PublishedCore(const torch::nn::Module& model, MakeReplica make, PublishOptions options);
  ~PublishedCore();
  PublishedCore(const PublishedCore&) = delete;
  PublishedCore& operator=(const PublishedCore&) = delete;

  int64_t publish(const torch::nn::Module& model);
  bool poll();
  /// The latest slot, pinned, and its version.
  Slot* acquire(int64_t& version) const;
  static void release(Slot* slot) noexcept;
  static torch::nn::Module& module_of(Slot* slot) noexcept;
  int64_t version() const noexcept;
  std::size_t replicas() const noexcept;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace detail

/// See the top of this header. `M`: a module holder (a TORCH_MODULE, torch::nn::Linear) or a
/// std::shared_ptr to a module.
template <class M>
class Published {
 public:
  /// The module class a snapshot holds (the holder's Impl).
  using Module = typename nn::detail::ImplOf<M>::type;
  /// Builds an empty replica of the model (its values are copied in by loom): needed only for
  /// a module that is neither torch::nn::Cloneable nor default-constructible.
  using Factory = std::function<M()>;

  /// A reader's hold on one version: the replica stays as it is while the snapshot lives.
  /// Move-only; any thread may destroy it.
  class Snapshot {
   public:
    Snapshot() = default;
    Snapshot(Snapshot&& o) noexcept
        : core_(std::move(o.core_)), slot_(std::exchange(o.slot_, nullptr)), version_(o.version_) {}
    Snapshot& operator=(Snapshot&& o) noexcept {
      if (this != &o) {
        reset();
        core_ = std::move(o.core_);
        slot_ = std::exchange(o.slot_, nullptr);
        version_ = o.version_;
      }
      return *this;
    }
    Snapshot(const Snapshot&) = delete;
    Snapshot& operator=(const Snapshot&) = delete;
    ~Snapshot() { reset(); }

    /// The replica holding this version's weights (read-only in spirit: see the top).
    Module& module() const { return static_cast<Module&>(detail::PublishedCore::module_of(slot_)); }
    Module* operator->() const { return &module(); }
    /// The version: 0 at construction, then one more each publish().
    int64_t version() const noexcept { return version_; }
    explicit operator bool() const noexcept { return slot_ != nullptr; }
    /// Lets the version go (the destructor does it too).
    void reset() noexcept {
      if (slot_ != nullptr) detail::PublishedCore::release(std::exchange(slot_, nullptr));
      core_.reset();
    }

   private:
    friend class Published;
    Snapshot(std::shared_ptr<const detail::PublishedCore> core, detail::PublishedCore::Slot* slot,
             int64_t version)
        : core_(std::move(core)), slot_(slot), version_(version) {}
    std::shared_ptr<const detail::PublishedCore> core_;  // keeps the slots alive
    detail::PublishedCore::Slot* slot_ = nullptr;
    int64_t version_ = -1;
  };

  /// Replicas of `model` (by `make`, else Module::clone() for a torch::nn::Cloneable module,
  /// else a default-constructed M) with the readers' dtype and device, and version 0: the
  /// model's weights now. The model's parameters and buffers are taken here (the tensors
  /// themselves: build Published after rt.setup).
  explicit Published(const M& model, PublishOptions options = {}, Factory make = {})
      : core_(std::make_shared<detail::PublishedCore>(
            as_module(model), replica_maker(model, std::move(make)), options)) {}

  /// Copies the model's weights into a slot no reader holds and makes it the latest; returns
  /// its version. Called by one thread (the learner), which never waits for a reader. `model`
  /// is the one Published was built from (another module is a loom::Error).
  int64_t publish(const M& model) { return core_->publish(as_module(model)); }

  /// Makes a version whose copy to another device has completed the latest (publish() does it
  /// too); true if one was. Learner thread only.
  bool poll() { return core_->poll(); }

  /// The latest version, pinned until the snapshot is destroyed. Any thread, lock-free.
  Snapshot latest() const {
    int64_t version = 0;
    detail::PublishedCore::Slot* slot = core_->acquire(version);
    return Snapshot(core_, slot, version);
  }

  /// The latest version's number.
  int64_t version() const noexcept { return core_->version(); }
  /// How many replicas exist (the memory readers' snapshots cost).
  std::size_t replicas() const noexcept { return core_->replicas(); }

 private:
  static_assert(torch::detail::is_module_holder<M>::value ||
                    std::is_same_v<M, std::shared_ptr<Module>>,
                "loom::Published<M>: M is a module holder (a TORCH_MODULE, torch::nn::Linear) "
                "or a std::shared_ptr to a module");
  static_assert(std::is_base_of_v<torch::nn::Module, Module>,
                "loom::Published<M>: M holds a torch::nn::Module");

  static const torch::nn::Module& as_module(const M& model) {
    if constexpr (torch::detail::is_module_holder<M>::value) {
      return *model.ptr();
    } else {
      return *model;
    }
  }

  static detail::PublishedCore::MakeReplica replica_maker(const M& model, Factory make) {
    std::shared_ptr<Module> source;
    if constexpr (torch::detail::is_module_holder<M>::value) {
      source = model.ptr();
    } else {
      source = model;
    }
    return [source, make = std::move(make)]() -> std::shared_ptr<torch::nn::Module> {
      if (make) {
        M built = make();
        if constexpr (torch::detail::is_module_holder<M>::value) {
          return built.ptr();
        } else {
          return built;
        }
      }
      if constexpr (std::is_base_of_v<torch::nn::Cloneable<Module>, Module>) {
        return source->clone();
      } else if constexpr (std::is_default_constructible_v<Module>) {
        return std::make_shared<Module>();
      } else {
        return nullptr;  // PublishedCore: a loom::Error asking for a Factory
      }
    };
  }

  std::shared_ptr<detail::PublishedCore> core_;
};

}  // namespace loom
