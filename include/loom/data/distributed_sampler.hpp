#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/data/samplers/base.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <loom/error.hpp>
#include <loom/state_dict.hpp>
#include <loom/state_reader.hpp>

namespace loom::data {

/// What DistributedSampler is given besides the dataset's size; the defaults are Python's.
struct DistributedSamplerOptions {
  std::int64_t num_replicas = 1;  ///< the world size
  std::int64_t rank = 0;          ///< this process's rank, in [0, num_replicas)
  bool shuffle = true;            ///< a fresh permutation every epoch
  std::uint64_t seed = 0;         ///< the same on every rank; the epoch is added to it
  bool drop_last = false;         ///< drop the tail instead of padding with the head
};

/// Python's torch.utils.data.DistributedSampler, index for index, as a LibTorch sampler
/// (usable with torch::data::make_data_loader).
///
/// Each epoch: the indices 0..N-1, permuted by randperm(N) on a CPU generator seeded
/// `seed + epoch` when shuffling; then padded by repeating the head to a multiple of
/// num_replicas (or, with drop_last, cut to one); then every num_replicas-th index from
/// `rank` on. Every rank sees the same number of samples, so every rank runs the same
/// number of steps. Call set_epoch(e) before each epoch, as in Python: the loader's reset()
/// at the start of an iteration draws that epoch's permutation. After load_state_dict (or
/// load), the first reset() of the loaded epoch keeps the loaded position, so that a data
/// loader, which resets its sampler when its iteration begins, continues mid-epoch. A
/// LibTorch data loader owns its sampler: give it SamplerRef(sampler) to keep this one, the
/// one a checkpoint names, in use.
/// (LibTorch's DistributedRandomSampler seeds by the epoch alone, pads before shuffling and
/// splits into contiguous blocks: it does not reproduce a Python run.)
class DistributedSampler : public torch::data::samplers::Sampler<> {
 public:
  DistributedSampler(std::size_t dataset_size, DistributedSamplerOptions options)
      : size_(dataset_size), options_(options) {
    if (options_.num_replicas < 1) {
      throw Error("loom::data::DistributedSampler: num_replicas is " +
                  std::to_string(options_.num_replicas) + "; it must be at least 1");
    }
    if (options_.rank < 0 || options_.rank >= options_.num_replicas) {
      throw Error("loom::data::DistributedSampler: invalid rank " + std::to_string(options_.rank) +
                  ", rank should be in the interval [0, " +
                  std::to_string(options_.num_replicas - 1) + "]");
    }
    reset(std::nullopt);
  }

  /// A sampler for `strategy`'s rank and world size (rt.strategy()).
  template <class Strategy>
  requires requires(const Strategy& s) {
    s.rank();
    s.world_size();
  }
  DistributedSampler(std::size_t dataset_size, const Strategy& strategy, bool shuffle = true,
                     std::uint64_t seed = 0, bool drop_last = false)
      : DistributedSampler(dataset_size,
                           {strategy.world_size(), strategy.rank(), shuffle, seed, drop_last}) {}

  /// The epoch the next reset() draws for; the same value on every rank.
  void set_epoch(std::uint64_t epoch) { epoch_ = epoch; }
  std::uint64_t epoch() const { return epoch_; }

  /// Samples per rank and epoch (Python's num_samples).
  std::size_t num_samples() const {
    const auto n = static_cast<std::int64_t>(size_), r = options_.num_replicas;
    if (options_.drop_last && n % r != 0) return static_cast<std::size_t>(n / r);
    return static_cast<std::size_t>((n + r - 1) / r);
  }

  /// This rank's indices for the current epoch, in order.
  const std::vector<std::size_t>& indices() const { return indices_; }

  /// Draws the current epoch's indices (and takes a new dataset size, if given).
  void reset(std::optional<std::size_t> new_size = std::nullopt) override {
    if (resumed_epoch_ && *resumed_epoch_ == epoch_ && (!new_size || *new_size == size_)) {
      resumed_epoch_.reset();  // the loaded position stands, once
      return;
    }
    resumed_epoch_.reset();
    if (new_size) size_ = *new_size;
    position_ = 0;
    const auto n = static_cast<std::int64_t>(size_);
    const auto replicas = options_.num_replicas;
    const auto total = static_cast<std::int64_t>(num_samples()) * replicas;
    std::vector<std::int64_t> all(static_cast<std::size_t>(n));
    if (options_.shuffle && n > 0) {
      at::Generator g = at::detail::createCPUGenerator();
      {
        std::lock_guard<std::mutex> lock(g.mutex());
        g.set_current_seed(options_.seed + epoch_);
      }
      auto perm = torch::randperm(n, g, torch::kLong);
      const auto* p = perm.data_ptr<std::int64_t>();
      std::copy(p, p + n, all.begin());
    } else {
      for (std::int64_t i = 0; i < n; ++i) all[static_cast<std::size_t>(i)] = i;
    }
    indices_.clear();
    indices_.reserve(static_cast<std::size_t>(total / replicas));
    // Padding repeats the head: element i of the padded list is all[i % n].
    for (std::int64_t i = options_.rank; i < total; i += replicas) {
      indices_.push_back(static_cast<std::size_t>(all[static_cast<std::size_t>(i % n)]));
    }
  }

  /// The next up to `batch_size` indices of this rank; nullopt at the end of the epoch.
  std::optional<std::vector<std::size_t>> next(std::size_t batch_size) override {
    if (position_ >= indices_.size()) return std::nullopt;
    const auto end = std::min(indices_.size(), position_ + batch_size);
    std::vector<std::size_t> batch(indices_.begin() + static_cast<std::ptrdiff_t>(position_),
                                   indices_.begin() + static_cast<std::ptrdiff_t>(end));
    position_ = end;
    return batch;
  }

  /// {"epoch": int, "position": int}: the epoch and how many of its indices were handed out
  /// (what rt.save writes for {"sampler", sampler}).
  StateDict state_dict() const {
    return {{"epoch", c10::IValue(static_cast<std::int64_t>(epoch_))},
            {"position", c10::IValue(static_cast<std::int64_t>(position_))}};
  }

  /// Restores state_dict(): redraws that epoch's indices, then resumes at the position.
  /// Throws loom::Error on a missing or unknown key, or a negative value.
  void load_state_dict(const StateDict& state) {
    state::Reader r("loom::data::DistributedSampler::load_state_dict", state);
    auto count = [&](const char* key) {
      const std::int64_t n = r.integer(key);
      if (n < 0) r.fail(key, "expected a non-negative int, got " + std::to_string(n));
      return n;
    };
    const std::int64_t epoch = count("epoch");
    const std::int64_t position = count("position");
    r.finish();
    restore(epoch, position);
  }

  /// Saves the epoch and the position within it.
  void save(torch::serialize::OutputArchive& archive) const override {
    archive.write("epoch", torch::tensor(static_cast<std::int64_t>(epoch_)), /*is_buffer=*/true);
    archive.write("position", torch::tensor(static_cast<std::int64_t>(position_)),
                  /*is_buffer=*/true);
  }

  /// Restores what save() wrote, as load_state_dict does.
  void load(torch::serialize::InputArchive& archive) override {
    torch::Tensor epoch, position;
    archive.read("epoch", epoch, /*is_buffer=*/true);
    archive.read("position", position, /*is_buffer=*/true);
    restore(epoch.item<std::int64_t>(), position.item<std::int64_t>());
  }

 private:
  // Redraws `epoch`'s indices and resumes at `position`; the next reset() of that epoch
  // keeps it.
  void restore(std::int64_t epoch, std::int64_t position) {
    if (epoch < 0 || position < 0) {
      throw Error("loom::data::DistributedSampler::load: a saved epoch or position is negative");
    }
    epoch_ = static_cast<std::uint64_t>(epoch);
    resumed_epoch_.reset();
    reset(std::nullopt);
    position_ = std::min(indices_.size(), static_cast<std::size_t>(position));
    resumed_epoch_ = epoch_;
  }

  std::size_t size_;
  DistributedSamplerOptions options_;
  std::uint64_t epoch_ = 0;
  std::vector<std::size_t> indices_;
  std::size_t position_ = 0;
  std::optional<std::uint64_t> resumed_epoch_;  // set by restore() until the next reset()
};

/// A LibTorch sampler that forwards to `sampler`, which must outlive it: a data loader owns
/// (a copy of) the sampler it is given, so
///   make_data_loader(std::move(dataset), loom::SamplerRef(sampler), options)
/// keeps `sampler` itself, the object a loom::State names, the one the loader draws from.
template <class S>
class SamplerRef : public torch::data::samplers::Sampler<typename S::BatchRequestType> {
 public:
  using BatchRequestType = typename S::BatchRequestType;
  explicit SamplerRef(S& sampler) : sampler_(&sampler) {}
  void reset(std::optional<std::size_t> new_size = std::nullopt) override {
    sampler_->reset(new_size);
  }
  std::optional<BatchRequestType> next(std::size_t batch_size) override {
    return sampler_->next(batch_size);
  }
  void save(torch::serialize::OutputArchive& archive) const override { sampler_->save(archive); }
  void load(torch::serialize::InputArchive& archive) override { sampler_->load(archive); }

 private:
  S* sampler_;
};

}  // namespace loom::data

namespace loom {
using data::DistributedSampler;
using data::DistributedSamplerOptions;
using data::SamplerRef;
}  // namespace loom
