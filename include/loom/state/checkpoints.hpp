#pragma once
// loom::Checkpoints: a run's checkpoints in one directory. save(rt, step, state) writes
// DIR/step-<N>.pt through rt.save (atomic), keeps the last K (and every M-th), then points
// DIR/latest at it; resume(rt, state) loads the newest checkpoint that reads back whole and
// returns its step. Every file is a torch.save file: Python lists and opens them with
// torch.load. Opt-in: #include <loom/state/checkpoints.hpp> (with state/checkpoint.hpp,
// which loom.hpp includes, for the file format). With {.async = true} a save snapshots the
// state and writes it in a background thread (checkpoint/async.hpp).
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <c10/util/Exception.h>

#include <loom/checkpoint/async.hpp>
#include <loom/checkpoint/checkpoint_io.hpp>
#include <loom/checkpoint/shards.hpp>
#include <loom/detail/agree_on_failure.hpp>
#include <loom/detail/message_of.hpp>
#include <loom/error.hpp>
#include <loom/state/checkpoint.hpp>
#include <loom/state/load_options.hpp>

namespace loom::state {

/// What a Checkpoints directory keeps after each save.
struct CheckpointsOptions {
  /// The newest this many checkpoints (at least 1).
  std::size_t keep_last = 3;
  /// Also every checkpoint whose step is a multiple of this (0: none), Composer's
  /// save_interval history, Lightning's every_n_train_steps with save_top_k=-1.
  std::int64_t keep_every = 0;
};

/// Checkpoints::save's settings.
struct CheckpointSaveOptions {
  /// fsync the file and the directory (checkpoint::SaveOptions::sync).
  bool sync = true;
  /// Return once the state is copied (device tensors to pinned host memory, asynchronously),
  /// and write the copy in a background thread while training goes on (torch.distributed.
  /// checkpoint's async_save). The collective part (every rank's generator states gathered)
  /// stays in the call. The next save, wait(rt) or resume(rt) waits for the write and throws
  /// its error on every rank; DIR/latest and the pruning follow the write.
  bool async = false;
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
/// Files: DIR/step-N.pt (N without padding), DIR/latest (one line, "step-N.pt"), and under
/// loom::Zero's sharded checkpoints each rank's DIR/step-N.TAG.shard-R-of-W.pt. Under
/// FsdpCheckpoint::Dcp, DIR/step-N.pt is a DCP directory (checkpoint/dcp.hpp). Under a
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

  /// The steps with a checkpoint in the directory, oldest first: a file step-N.pt, or a
  /// directory step-N.pt holding a DCP `.metadata` (files that do not match step-N.pt, such
  /// as a killed save's temporary file, and other directories are ignored).
  std::vector<std::int64_t> steps() const {
    std::vector<std::int64_t> found;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir_, ec)) {
      std::error_code type_ec;
      const bool dcp = e.is_directory(type_ec) &&
                       std::filesystem::is_regular_file(e.path() / ".metadata", type_ec);
      if (!e.is_regular_file(type_ec) && !dcp) continue;  // another directory is no checkpoint
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

  Checkpoints(const Checkpoints&) = delete;
  Checkpoints& operator=(const Checkpoints&) = delete;
  /// Waits for an asynchronous write under way. Its error cannot reach the other ranks from
  /// here: it is a warning; call wait(rt) before the end to have it thrown on every rank.
  ~Checkpoints() {
    if (!pending_) return;
    if (auto error = writer_->wait()) {
      TORCH_WARN("loom::Checkpoints: the background save of ", path(*pending_).string(),
                 " failed: ", loom::detail::message_of(error));
      return;
    }
    try {
      if (pending_writer_) finish(*pending_);
    } catch (const std::exception& e) {
      TORCH_WARN("loom::Checkpoints: ", e.what());
    }
  }

  /// Saves `state` as step `step` (rt.save: atomic), then drops what CheckpointsOptions does
  /// not keep and points DIR/latest at it. Every rank calls it. With {.async = true} it returns
  /// once the state is copied; the file is written in the background (CheckpointSaveOptions).
  template <class Runtime>
  void save(Runtime& rt, std::int64_t step, const State& state,
            CheckpointSaveOptions options = {}) {
    if (step < 0) throw Error("loom::Checkpoints::save: the step must be >= 0");
    // The collectives of this call say where they failed (rt.save says it for its own).
    auto collective = [&](auto&& run) {
      try {
        run();
      } catch (const CollectiveError& e) {
        throw loom::detail::collective_misuse(
            "loom::Checkpoints::save(" + path(step).string() + ")", "ckpt.save(...)", e);
      }
    };
    collective([&] { wait(rt); });  // the last asynchronous write, if any: its error is here
    const bool writer = rt.strategy().is_global_zero();
    if (writer) std::filesystem::create_directories(dir_);
    if (!options.async) {
      rt.save(path(step), state, checkpoint::SaveOptions{.sync = options.sync});
      if (writer) finish(step);  // every rank returned once the file was written
      return;
    }
    if (!writer_) writer_ = std::make_unique<checkpoint::AsyncWriter>();
    writer_->set_options(checkpoint::SaveOptions{.sync = options.sync});
    // rt.save's value, handed to the strategy with an IO that copies it and writes later:
    // the strategy still decides which ranks write (Ddp: rank 0) and agrees on a failed copy.
    collective([&] { state::save_state(rt, path(step), state, checkpoint::AsyncFile(*writer_)); });
    pending_ = step;
    pending_writer_ = writer;
  }

  /// Waits for the asynchronous save under way, if any; every rank calls it. A write that
  /// failed (a full disk, a read-only directory) is a loom::Error on every rank, with the
  /// writing rank's reason; one that succeeded moves DIR/latest and prunes, as save does.
  template <class Runtime>
  void wait(Runtime& rt) {
    if (!pending_) return;
    const std::int64_t step = *pending_;
    pending_.reset();
    std::exception_ptr error = writer_->wait();
    rt.strategy().agree(loom::detail::failure_of(error),
                        "loom::Checkpoints: the background save of " + path(step).string());
    if (pending_writer_) finish(step);
  }

  /// True between an asynchronous save and the wait that follows it.
  bool pending() const { return pending_.has_value(); }

  /// Restores `state` from the newest checkpoint that reads whole and returns its step, or
  /// nothing when the directory holds none (a fresh run). Every rank calls it (each reads the
  /// file). What it does with each kind of failure (docs/checkpoints.md has the table):
  /// - a file that cannot be read whole (loom::CheckpointUnreadable: truncated, corrupted, a
  ///   shard missing) is moved aside to FILE.unreadable, never deleted, with a warning naming
  ///   both and the reason, and the checkpoint before it is tried; when none reads, the last
  ///   reason is a loom::CheckpointUnreadable;
  /// - a file that reads but does not fit this run (loom::CheckpointMismatch: another
  ///   precision's state, another world size, other shapes, keys missing or left over) stops
  ///   the resume with a CheckpointMismatch naming the file, what differs and the remedy:
  ///   nothing in the directory is changed, and no older checkpoint is tried (training on
  ///   from one would overwrite and prune the newer ones).
  /// Before it reads, the writing rank removes what a save killed while writing left behind
  /// (.step-N.pt.tmp.PID files). `options` are rt.load's (state/load_options.hpp): with
  /// {.world_size_may_change = true} a directory another number of ranks wrote resumes (the
  /// generator states as LoadOptions says), else that is a CheckpointMismatch.
  template <class Runtime>
  std::optional<std::int64_t> resume(Runtime& rt, const State& state, LoadOptions options = {}) {
    wait(rt);
    if (rt.strategy().is_global_zero()) remove_leftovers();
    auto candidates = steps();
    if (auto named = latest();
        named && std::find(candidates.begin(), candidates.end(), *named) == candidates.end()) {
      TORCH_WARN("loom::Checkpoints: ", (dir_ / "latest").string(), " names step ", *named,
                 ", whose file is missing; resuming from the newest file there is");
    }
    std::string last_error;
    for (auto it = candidates.rbegin(); it != candidates.rend(); ++it) {
      try {
        rt.load(path(*it), state, options);
        return *it;
      } catch (const CheckpointMismatch& e) {
        throw CheckpointMismatch(
            std::string(e.what()) + ". loom::Checkpoints::resume stopped: nothing in " +
            dir_.string() +
            " was changed and no older checkpoint was tried. Run with the settings this "
            "directory was written with, or give this run a directory of its own (or move " +
            path(*it).filename().string() + " away if it belongs to another run)");
      } catch (const CheckpointUnreadable& e) {
        last_error = e.what();
        const std::string aside = set_aside(rt, *it);
        TORCH_WARN("loom::Checkpoints: ", path(*it).string(), " does not read (", e.what(), "); ",
                   aside, "; trying the checkpoint before it");
      }
    }
    if (!candidates.empty()) {
      throw CheckpointUnreadable("loom::Checkpoints: no checkpoint in " + dir_.string() +
                                 " reads whole (each was moved aside to *.unreadable); the "
                                 "oldest failed with: " +
                                 last_error);
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

  /// Moves `step`'s unreadable file (and its shard files) aside to NAME.unreadable on the
  /// writing rank, after every rank has tried to read it; says where it went.
  template <class Runtime>
  std::string set_aside(Runtime& rt, std::int64_t step) const {
    rt.strategy().barrier();  // every rank is done with the file before it moves
    const auto file = path(step);
    const auto aside = file.string() + ".unreadable";
    if (!rt.strategy().is_global_zero()) return "rank 0 moves it to " + aside;
    std::error_code ec;
    std::filesystem::rename(file, aside, ec);
    if (ec) return "moving it to " + aside + " failed (" + ec.message() + "); it stays";
    for (const auto& [shard, tag] : checkpoint::shard_files(file)) {
      std::filesystem::rename(shard, shard.string() + ".unreadable", ec);
    }
    return "moved it to " + aside;
  }

  /// Removes the temporary files of saves killed while writing (checkpoint/io.hpp writes
  /// .NAME.tmp.PID beside NAME, then renames it): .step-N.pt.tmp.PID and the shard files'
  /// .step-N.TAG.shard-R-of-W.pt.tmp.PID; and a DCP save's staged directory
  /// (.step-N.pt.partial-TAG, checkpoint/dcp.hpp).
  void remove_leftovers() const {
    std::error_code ec;
    std::vector<std::filesystem::path> leftovers;
    for (const auto& e : std::filesystem::directory_iterator(dir_, ec)) {
      const std::string name = e.path().filename().string();
      const auto partial = name.rfind(".partial-");
      if (name.size() > 1 && name[0] == '.' && partial != std::string::npos &&
          step_of(name.substr(1, partial - 1))) {
        leftovers.push_back(e.path());
        continue;
      }
      const auto tmp = name.rfind(".tmp.");
      if (name.size() < 2 || name[0] != '.' || tmp == std::string::npos) continue;
      const std::string target = name.substr(1, tmp - 1);
      const std::string pid = name.substr(tmp + 5);
      if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
      const bool step_file = step_of(target).has_value();
      const bool shard_file = target.rfind("step-", 0) == 0 &&
                              target.find(".shard-") != std::string::npos && target.size() > 3 &&
                              target.substr(target.size() - 3) == ".pt";
      if (step_file || shard_file) leftovers.push_back(e.path());
    }
    for (const auto& f : leftovers) {
      std::filesystem::remove_all(f, ec);
      if (!ec) TORCH_WARN("loom::Checkpoints: removed ", f.string(), ", left by a killed save");
    }
  }

  /// After `step`'s file is written, on the rank that wrote it: `latest`, then pruning.
  void finish(std::int64_t step) const {
    write_latest(step);
    prune(step);
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
      std::filesystem::remove_all(path(s), ec);  // a file, or a DCP directory
      remove_companions(s);
    }
  }

  /// Removes the files a sharded save of `step` wrote beside its main file
  /// (step-N.TAG.shard-R-of-W.pt, checkpoint/shards.hpp).
  void remove_companions(std::int64_t step) const {
    for (const auto& [file, tag] : checkpoint::shard_files(path(step))) {
      std::error_code ec;
      std::filesystem::remove(file, ec);
    }
  }

  std::filesystem::path dir_;
  CheckpointsOptions options_;
  std::unique_ptr<checkpoint::AsyncWriter> writer_;
  std::optional<std::int64_t> pending_;  // the step an asynchronous save is writing
  bool pending_writer_ = false;          // this rank writes it (and then moves `latest`)
};

}  // namespace loom::state

// In loom::, where users write them.
namespace loom {
using state::Checkpoints;
using state::CheckpointSaveOptions;
using state::CheckpointsOptions;
}  // namespace loom
