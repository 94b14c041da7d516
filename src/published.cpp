// loom::Published's slots (include/loom/published.hpp): the learner's copies into replicas and
// the atomics through which readers pin one version.
#include <loom/published.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/grad_mode.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/nn/module.h>

#include <loom/error.hpp>

namespace loom::detail {

namespace {

// A slot's holders while the learner writes it: readers who pin it then see a negative count
// and let go. Far below any count of readers, so that their increments never make it >= 0.
constexpr int64_t kWriting = std::numeric_limits<int64_t>::min() / 2;

/// The parameters and then the buffers of `m`, by name, in the module's order.
std::vector<std::pair<std::string, at::Tensor>> tensors_of(const torch::nn::Module& m) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : m.named_parameters(/*recurse=*/true)) out.emplace_back(p.key(), p.value());
  for (const auto& b : m.named_buffers(/*recurse=*/true)) out.emplace_back(b.key(), b.value());
  return out;
}

}  // namespace

struct PublishedCore::Slot {
  std::shared_ptr<torch::nn::Module> replica;
  std::vector<at::Tensor> tensors;  // the replica's, in tensors_of's order
  // Readers pinning the slot; kWriting (plus readers backing off) while the learner writes.
  std::atomic<int64_t> holders{0};
  std::atomic<int64_t> version{-1};
  // Across devices: the copy's completion on the side stream.
  std::optional<at::cuda::CUDAEvent> copied;
};

struct PublishedCore::State {
  MakeReplica make;
  PublishOptions options;
  const torch::nn::Module* model = nullptr;  // the learner's, whose tensors `sources` are
  std::vector<at::Tensor> sources;           // the learner's tensors, in tensors_of's order
  std::vector<std::string> names;
  // Slots are only added (by the learner) and never move: readers reach one through latest.
  std::deque<Slot> slots;
  std::atomic<std::size_t> count{0};
  std::atomic<Slot*> latest{nullptr};
  std::atomic<int64_t> latest_version{-1};
  std::vector<Slot*> in_flight;  // learner only: copied on a side stream, still marked
  int64_t next_version = 0;
  // CUDA sources copied to another device: on a side stream.
  bool side_copy = false;
  std::optional<c10::cuda::CUDAStream> side;
  std::optional<at::cuda::CUDAEvent> reached;  // the learner's stream at publish()

  Slot& add_slot() {
    std::shared_ptr<torch::nn::Module> replica = make();
    if (!replica) {
      throw Error(
          "loom::Published: the module is neither torch::nn::Cloneable nor "
          "default-constructible; give Published a Factory that builds one (its values are "
          "copied in by loom)");
    }
    const c10::Device device =
        options.device.value_or(sources.empty() ? c10::Device(c10::kCPU) : sources[0].device());
    if (options.dtype) {
      replica->to(device, *options.dtype);
    } else {
      replica->to(device);
    }
    replica->eval();
    auto tensors = tensors_of(*replica);
    if (tensors.size() != names.size()) {
      throw Error("loom::Published: the replica has " + std::to_string(tensors.size()) +
                  " parameters and buffers, the model " + std::to_string(names.size()) +
                  " (a Factory must build the same module)");
    }
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      if (tensors[i].first != names[i] || tensors[i].second.sizes() != sources[i].sizes()) {
        throw Error("loom::Published: the replica's '" + tensors[i].first +
                    "' does not match the model's '" + names[i] +
                    "' (a Factory must build the same module)");
      }
    }
    Slot& slot = slots.emplace_back();  // checked first: a slot is whole or not there
    slot.replica = std::move(replica);
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      at::Tensor t = tensors[i].second;
      t.requires_grad_(false);
      if (side_copy && !t.is_pinned()) t.set_data(t.pin_memory());  // asynchronous copies in
      slot.tensors.push_back(t);
    }
    count.store(slots.size(), std::memory_order_relaxed);
    return slot;
  }

  /// A slot no reader holds that is not the latest (nor a copy in flight, still marked),
  /// marked as being written; a new one when there is none.
  Slot& claim() {
    Slot* const now = latest.load(std::memory_order_relaxed);
    for (Slot& s : slots) {
      int64_t free = 0;
      if (&s != now &&
          s.holders.compare_exchange_strong(free, kWriting, std::memory_order_acquire)) {
        return s;
      }
    }
    Slot& s = add_slot();
    s.holders.store(kWriting, std::memory_order_relaxed);
    in_flight.reserve(slots.size());  // so that land() never allocates
    return s;
  }

  /// The slot written: readers may pin it (the release orders the copies before them).
  static void unmark(Slot& s) { s.holders.fetch_sub(kWriting, std::memory_order_release); }

  /// Makes `s` the latest unless a newer version already is.
  void make_latest(Slot& s) {
    const int64_t v = s.version.load(std::memory_order_relaxed);
    if (v <= latest_version.load(std::memory_order_relaxed)) return;
    latest.store(&s, std::memory_order_release);
    latest_version.store(v, std::memory_order_release);
  }

  /// Copies to another device that have completed: their slots unmarked, the newest the
  /// latest. Whether a new version became the latest.
  bool land() {
    bool newer = false;
    std::erase_if(in_flight, [&](Slot* s) {
      if (!s->copied->query()) return false;
      unmark(*s);
      const int64_t before = latest_version.load(std::memory_order_relaxed);
      make_latest(*s);
      newer = newer || latest_version.load(std::memory_order_relaxed) != before;
      return true;
    });
    return newer;
  }
};

PublishedCore::PublishedCore(const torch::nn::Module& model, MakeReplica make,
                             PublishOptions options)
    : s_(std::make_unique<State>()) {
  s_->make = std::move(make);
  s_->options = options;
  s_->model = &model;
  for (auto& [name, t] : tensors_of(model)) {
    s_->names.push_back(name);
    s_->sources.push_back(t);
  }
  const bool cuda_source = !s_->sources.empty() && s_->sources[0].is_cuda();
  s_->side_copy = cuda_source && options.device && *options.device != s_->sources[0].device();
  if (s_->side_copy) {
    s_->side =
        c10::cuda::getStreamFromPool(/*isHighPriority=*/false, s_->sources[0].device().index());
    s_->reached.emplace();
  }
  publish(model);
  // Version 0 is there when the constructor returns: its copy is waited for, once.
  for (Slot* slot : s_->in_flight) slot->copied->synchronize();
  s_->land();
}

PublishedCore::~PublishedCore() {
  // Copies still in flight read the learner's tensors and write the slots' memory.
  for (Slot* slot : s_->in_flight) slot->copied->synchronize();
}

int64_t PublishedCore::publish(const torch::nn::Module& model) {
  State& s = *s_;
  if (&model != s.model) {
    // Its tensors were taken at construction: another module's would not be what is copied.
    throw Error(
        "loom::Published::publish: not the module this Published was built from (its "
        "parameters and buffers are taken at construction)");
  }
  s.land();
  Slot& slot = s.claim();
  const int64_t version = s.next_version++;
  at::NoGradGuard no_grad;
  if (s.side_copy) {
    const c10::Device device = s.sources[0].device();
    c10::cuda::CUDAGuard guard(device);
    const auto current = c10::cuda::getCurrentCUDAStream(device.index());
    s.reached->record(current);
    s.reached->block(*s.side);  // the side stream starts where the learner's stream is
    {
      c10::cuda::CUDAStreamGuard on_side(*s.side);
      for (std::size_t i = 0; i < slot.tensors.size(); ++i) {
        slot.tensors[i].copy_(s.sources[i], /*non_blocking=*/true);
      }
    }
    if (!slot.copied) slot.copied.emplace();
    slot.copied->record(*s.side);
    slot.copied->block(current);  // the learner's next writes wait for the copy, on the GPU
    slot.version.store(version, std::memory_order_relaxed);
    s.in_flight.push_back(&slot);  // unmarked once the copy is done (land)
    s.land();
  } else {
    for (std::size_t i = 0; i < slot.tensors.size(); ++i) slot.tensors[i].copy_(s.sources[i]);
    slot.version.store(version, std::memory_order_relaxed);
    State::unmark(slot);
    s.make_latest(slot);
  }
  return version;
}

bool PublishedCore::poll() { return s_->land(); }

PublishedCore::Slot* PublishedCore::acquire(int64_t& version) const {
  for (;;) {
    Slot* slot = s_->latest.load(std::memory_order_acquire);
    if (slot->holders.fetch_add(1, std::memory_order_acq_rel) >= 0) {
      // Pinned: the learner cannot write it now, and it holds one whole version (perhaps a
      // newer one than `latest` named when it was read: the version is read after pinning).
      version = slot->version.load(std::memory_order_relaxed);
      return slot;
    }
    // Reclaimed and being written since `latest` was read: a newer slot is the latest.
    slot->holders.fetch_sub(1, std::memory_order_relaxed);
  }
}

void PublishedCore::release(Slot* slot) noexcept {
  slot->holders.fetch_sub(1, std::memory_order_release);
}

torch::nn::Module& PublishedCore::module_of(Slot* slot) noexcept { return *slot->replica; }

int64_t PublishedCore::version() const noexcept {
  return s_->latest_version.load(std::memory_order_acquire);
}

std::size_t PublishedCore::replicas() const noexcept {
  return s_->count.load(std::memory_order_relaxed);
}

}  // namespace loom::detail
