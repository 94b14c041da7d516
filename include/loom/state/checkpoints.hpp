#pragma once
// loom::Checkpoints: a run's checkpoints in one directory. save(rt, step, state) writes
// DIR/step-<N>.pt through rt.save (atomic), keeps the last K (and every M-th), then points
// DIR/latest at it; resume(rt, state) loads the newest checkpoint that reads back whole and
// returns its step. Every file is a torch.save file: Python lists and opens them with
// torch.load. Opt-in: #include <loom/state/checkpoints.hpp> (with state/checkpoint.hpp,
// which loom.hpp includes, for the file format).
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <c10/util/Exception.h>

#include <loom/checkpoint/checkpoint_io.hpp>
#include <loom/error.hpp>
#include <loom/state/checkpoint.hpp>

namespace loom {

/// What a Checkpoints directory keeps after each save.
struct CheckpointsOptions {
  /// The newest this many checkpoints (at least 1).
  std::size_t keep_last = 3;
  /// Also every checkpoint whose step is a multiple of this (0: none), Composer's
  /// save_interval history, Lightning's every_n_train_steps with save_top_k=-1.
  std::int64_t keep_every = 0;
};

/// A run's checkpoints in one directory (Composer's CheckpointSaver and autoresume,
/// Lightning's ModelCheckpoint(save_last=True) and ckpt_path="last").
///
///   loom::Checkpoints ckpt("runs/a", {.keep_last = 2});
///   loom::State state{{"model", model}, {"optimizer", opt}, {"runtime", rt}};
///   std::int64_t step = ckpt.resume(rt, state).value_or(0);  // 0: a fresh run
///   for (; step < steps; ++step) {
///     train_step();
///     if ((step + 1) % 100 == 0) ckpt.save(rt, step + 1, state);
///   }
///
/// Files: DIR/step-N.pt (N without padding), DIR/latest (one line, "step-N.pt"). Under a
/// distributed strategy every rank calls save and resume; rank 0 writes, prunes and moves
/// `latest` after every rank knows the checkpoint is written.
class Checkpoints {
 public:
  explicit Checkpoints(std::filesystem::path dir, CheckpointsOptions options = {})
      : dir_(std::move(dir)), options_(options) {
    if (options_.keep_last == 0) {
      throw Error("loom::Checkpoints: keep_last must be at least 1 (the newest is always kept)");
    }
    if (options_.keep_every < 0) throw Error("loom::Checkpoints: keep_every must be >= 0");
  }

  const std::filesystem::path& dir() const { return dir_; }
  /// The file of `step`'s checkpoint.
  std::filesystem::path path(std::int64_t step) const {
    return dir_ / ("step-" + std::to_string(step) + ".pt");
  }

  /// The steps with a checkpoint file in the directory, oldest first (files that do not
  /// match step-N.pt, such as a killed save's temporary file, are ignored).
  std::vector<std::int64_t> steps() const {
    std::vector<std::int64_t> found;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir_, ec)) {
      if (auto step = step_of(e.path().filename().string())) found.push_back(*step);
    }
    std::sort(found.begin(), found.end());
    return found;
  }

  /// The step DIR/latest names, if it names one.
  std::optional<std::int64_t> latest() const {
    std::ifstream in(dir_ / "latest");
    std::string name;
    if (!(in >> name)) return std::nullopt;
    return step_of(name);
  }

  /// Saves `state` as step `step` (rt.save: atomic, `options` as there), then drops what
  /// CheckpointsOptions does not keep and points DIR/latest at it. Every rank calls it.
  template <class Runtime>
  void save(Runtime& rt, std::int64_t step, const State& state,
            checkpoint::SaveOptions options = {}) {
    if (step < 0) throw Error("loom::Checkpoints::save: the step must be >= 0");
    if (rt.strategy().is_global_zero()) std::filesystem::create_directories(dir_);
    rt.save(path(step), state, options);  // every rank returns once the file is written
    if (!rt.strategy().is_global_zero()) return;
    write_latest(step);
    prune(step);
  }

  /// Restores `state` from the newest checkpoint that loads whole and returns its step, or
  /// nothing when the directory holds none (a fresh run). A newest file that does not load
  /// (truncated, corrupted, another model) is skipped with a warning naming it and the
  /// reason, falling back to the one before; when none loads, the last reason is a
  /// loom::Error. Every rank calls it (each reads the file).
  template <class Runtime>
  std::optional<std::int64_t> resume(Runtime& rt, const State& state) {
    auto candidates = steps();
    if (auto named = latest();
        named && std::find(candidates.begin(), candidates.end(), *named) == candidates.end()) {
      TORCH_WARN("loom::Checkpoints: ", (dir_ / "latest").string(), " names step ", *named,
                 ", whose file is missing; resuming from the newest file there is");
    }
    std::string last_error;
    for (auto it = candidates.rbegin(); it != candidates.rend(); ++it) {
      try {
        rt.load(path(*it), state);
        return *it;
      } catch (const Error& e) {
        last_error = e.what();
        TORCH_WARN("loom::Checkpoints: skipping ", path(*it).string(), ", which does not load (",
                   e.what(), "); trying the one before");
      }
    }
    if (!candidates.empty()) {
      throw Error("loom::Checkpoints: no checkpoint in " + dir_.string() +
                  " loads; the oldest failed with: " + last_error);
    }
    return std::nullopt;
  }

 private:
  static std::optional<std::int64_t> step_of(std::string_view name) {
    constexpr std::string_view head = "step-", tail = ".pt";
    if (name.size() <= head.size() + tail.size() || name.substr(0, head.size()) != head ||
        name.substr(name.size() - tail.size()) != tail) {
      return std::nullopt;
    }
    const auto digits = name.substr(head.size(), name.size() - head.size() - tail.size());
    std::int64_t step = 0;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
    if (ec != std::errc() || end != digits.data() + digits.size() || step < 0) return std::nullopt;
    return step;
  }

  /// DIR/latest replaced atomically: written beside, then renamed over (not synced: the
  /// checkpoint it names was, and resume finds the newest file without it).
  void write_latest(std::int64_t step) const {
    const auto tmp = dir_ / ".latest.tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << path(step).filename().string() << "\n";
      out.flush();
      if (!out) throw Error("loom::Checkpoints: cannot write " + tmp.string());
    }
    std::error_code ec;
    std::filesystem::rename(tmp, dir_ / "latest", ec);
    if (ec) {
      throw Error("loom::Checkpoints: cannot move " + tmp.string() + " to " +
                  (dir_ / "latest").string() + ": " + ec.message());
    }
  }

  /// Removes the checkpoints CheckpointsOptions does not keep (never `newest`).
  void prune(std::int64_t newest) const {
    auto all = steps();
    const std::size_t n = all.size();
    for (std::size_t i = 0; i < n; ++i) {
      const std::int64_t s = all[i];
      const bool recent = i + options_.keep_last >= n;
      const bool milestone = options_.keep_every > 0 && s % options_.keep_every == 0;
      if (recent || milestone || s == newest) continue;
      std::error_code ec;
      std::filesystem::remove(path(s), ec);
    }
  }

  std::filesystem::path dir_;
  CheckpointsOptions options_;
};

}  // namespace loom
