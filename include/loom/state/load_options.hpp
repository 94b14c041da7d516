#pragma once
// How rt.load applies a checkpoint to the run: LoadOptions (runtime.hpp's rt.load, and
// loom::Checkpoints::resume's ResumeOptions, pass it down to every entry of a loom::State).

namespace loom {

/// rt.load's settings.
struct LoadOptions {
  /// A name of the state missing from the file, and in a module a missing or unexpected key,
  /// is a loom::CheckpointMismatch; false warns and leaves what is missing as it is (Python's
  /// load_state_dict(strict=False)). A mismatched shape is an error either way.
  bool strict = true;
  /// Accept a file written by another number of ranks ({"runtime", rt}'s per-rank device
  /// states): ranks below the saved world size restore the saved rank's generator states,
  /// the others keep theirs (what the program seeded), and a warning says which. Without it a
  /// world size change is a loom::CheckpointMismatch. Model, optimizer (loom::Zero's
  /// consolidated or sharded) and other entries load at any world size either way.
  bool world_size_may_change = false;
  /// A module built under loom::EmptyInit (its memory holds no values yet) and loaded on the
  /// CPU keeps the file's pages as its parameters' and buffers' memory instead of copying them
  /// (checkpoint::KeepMapped; Python's torch.load(mmap=True) +
  /// load_state_dict(assign=True)): the load touches no fresh memory and takes a fraction of
  /// the copy's time, but the first write to each page (the first optimizer step) copies that
  /// page, which costs more than the copy would have (docs/memory.md): for a model read more
  /// than written (inference, a frozen backbone). The file stays mapped, its disk space held
  /// while the run lasts even when it is deleted; a program that rewrites it in place (not
  /// loom's saves, which rename a new file over it) breaks the run. Under loom::Fsdp (which
  /// reads each rank's rows into its pieces) and for a module built normally it changes
  /// nothing: they are copied into.
  bool keep_mapped = false;
};

}  // namespace loom
