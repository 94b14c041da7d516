#pragma once
// rt.save and rt.load: a loom::State to a torch.save file and back, through the strategy.
// Opt-in: runtime.hpp declares rt.save / rt.load and leaves the file format out, so a
// translation unit that trains without checkpoints never parses it; this header (or
// <loom/loom.hpp>) brings it in.
//
//   save  rt.strategy().save_checkpoint(path, state, TorchFile)   who writes: dist/
//           the strategy gets the typed entries (each one's kind(): a module, an optimizer...)
//           and saves them, state::save_entries(state) = {name: entry.save()}, or splits them
//           (save_state; Checkpoints' asynchronous saves pass an AsyncFile)
//   load  value = rt.strategy().load_checkpoint(path, state, TorchFile, rt.device().device())
//           (the file mapped: checkpoint/mapped.hpp)
//         entry.load(value[name], options) for each entry; the rest is returned once every
//           record's CRC-32 is checked (DeferredChecks: the large ones as they are copied)
//   errors: reading the file fails with loom::CheckpointUnreadable, applying what it holds
//           with loom::CheckpointMismatch (error.hpp)
#include <filesystem>
#include <string>

#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include <loom/checkpoint/io.hpp>
#include <loom/detail/checkpoint_files.hpp>
#include <loom/error.hpp>
#include <loom/state/entry.hpp>
#include <loom/state/values.hpp>
#include <loom/state_dict.hpp>

namespace loom::state {

/// How a State becomes a file, for rt.save and loom::Checkpoints' asynchronous saves alike: the
/// entries handed to the strategy, which saves them (state::save_entries) and decides which
/// ranks write what through `io` (rt.save: TorchFile; Checkpoints: AsyncFile, which copies now
/// and writes later).
template <class R>
void save_state(R& rt, const std::filesystem::path& path, const State& state,
                const checkpoint::CheckpointIO& io) {
  rt.strategy().save_checkpoint(path, state, io);
}

/// Loads every entry of `state` from `value` (read from `where`) and returns the file's other
/// entries. With options.strict a name missing from the file is a loom::Error, else a warning.
/// `value` may hold tensors of a mapped file (checkpoint/mapped.hpp): only entries that copy
/// them get them as they are; the others, and what is returned, get their own memory.
inline StateDict load_entries(const State& state, const c10::IValue& value,
                              const std::string& where, const LoadOptions& options) {
  const Dict d = as_dict(value, where);
  for (const auto& e : state) {
    auto it = d.find(c10::IValue(e.name()));
    if (it == d.end()) {
      if (options.strict) {
        throw Error("loom::load: '" + e.name() + "' is not in the checkpoint " + where +
                    " (strict=true)");
      }
      TORCH_WARN("loom::load: '", e.name(), "' is not in the checkpoint ", where,
                 "; left as it is (strict=false)");
      continue;
    }
    e.load(e.copies_tensors() ? it->value() : checkpoint::unmapped(it->value()), options);
  }
  StateDict rest;
  for (const auto& item : d) {
    if (!item.key().isString()) continue;
    bool named = false;
    for (const auto& e : state) named = named || e.name() == item.key().toStringRef();
    if (!named) rest.emplace(item.key().toStringRef(), checkpoint::unmapped(item.value()));
  }
  return rest;
}

}  // namespace loom::state

namespace loom::detail {

/// A collective that failed inside `call` (rt.save, rt.load, loom::Checkpoints), said with the
/// likely cause first: a rank that skipped the call (`habit` under `if (rank == 0)`).
inline CollectiveError collective_misuse(const std::string& call, const std::string& habit,
                                         const CollectiveError& e) {
  return CollectiveError("inside " + call +
                         ": every rank must call it (it gathers every rank's generator states "
                         "and agrees on the file); a rank that skipped it (`if (rank == 0) " +
                         habit +
                         "`, Python's habit) leaves the others waiting in its collectives until "
                         "the timeout. " +
                         e.what());
}

/// What Runtime::save and Runtime::load call (detail/checkpoint_files.hpp).
template <>
struct checkpoint_files<State> {
  template <class R>
  static void save(R& rt, const std::filesystem::path& path, const State& state,
                   checkpoint::SaveOptions options) {
    try {
      state::save_state(rt, path, state, checkpoint::TorchFile(options));
    } catch (const CollectiveError& e) {
      throw collective_misuse("loom::save(" + path.string() + ")",
                              "rt.save(...)` or `ckpt.save(...)", e);
    }
  }

  template <class R>
  static StateDict load(R& rt, const std::filesystem::path& path, const State& state,
                        const LoadOptions& options) {
    // Mapped: the model's and optimizer's tensors are copied from the file's pages into the
    // memory they already hold (no fresh memory to touch), the large records' CRC-32s checked
    // as they are copied (each byte read once); nothing mapped outlives the load but the pages
    // a module built under EmptyInit keeps when asked (LoadOptions::keep_mapped).
    checkpoint::DeferredChecks checks(
        "; found while loading it: what was loaded may hold part of it (load another "
        "checkpoint)");
    // (rt.load sets keep_mapped only for a module built under EmptyInit, holding nothing yet)
    const checkpoint::KeepMapped pages(options.keep_mapped);
    const checkpoint::TorchFile file({}, {.map = true});
    // Reading the file: every loom::Error is the file's (CheckpointUnreadable); then applying
    // it: every loom::Error but a large record's CRC found while copying is the run's
    // (CheckpointMismatch). A collective that failed is neither: a CollectiveError saying
    // where it failed; errors of other types pass as they are.
    c10::IValue value;
    try {
      value = rt.strategy().load_checkpoint(path, state, file, rt.device().device());
    } catch (const CollectiveError& e) {
      throw collective_misuse("loom::load(" + path.string() + ")", "rt.load(...)", e);
    } catch (const CheckpointUnreadable&) {
      throw;
    } catch (const CheckpointMismatch&) {
      throw;
    } catch (const Error& e) {
      throw CheckpointUnreadable(e.what());
    }
    StateDict rest;
    try {
      rest = state::load_entries(state, value, path.string(), options);
    } catch (const CollectiveError& e) {
      throw collective_misuse("loom::load(" + path.string() + ")", "rt.load(...)", e);
    } catch (const CheckpointUnreadable&) {
      throw;
    } catch (const CheckpointMismatch&) {
      throw;
    } catch (const Error& e) {
      throw CheckpointMismatch("loom::load: " + path.string() +
                               " does not fit this run: " + e.what());
    }
    checks.finish();
    return rest;
  }
};

}  // namespace loom::detail
