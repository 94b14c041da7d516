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
};

}  // namespace loom
