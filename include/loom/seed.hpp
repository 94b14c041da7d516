#pragma once
// loom::seed_everything: one seed for every generator loom draws from.
#include <cstdint>

#include <ATen/Context.h>

namespace loom {

/// Seeds the CPU generator and every CUDA device's generator (torch.manual_seed: the
/// generators dropout, randperm, torch::rand and loom::DistributedSampler's shuffle-free
/// paths use) with `seed + rank`, and returns that seed. Pass the rank (rt.strategy().rank())
/// for a different stream per process, as dropout under data parallelism wants; leave it 0
/// for the same stream everywhere. DistributedSampler's shuffle takes its own seed, the same
/// on every rank.
inline std::uint64_t seed_everything(std::uint64_t seed, int rank = 0) {
  const std::uint64_t s = seed + static_cast<std::uint64_t>(rank);
  at::manual_seed(s);
  return s;
}

}  // namespace loom
