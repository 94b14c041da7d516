#pragma once
#include <stdexcept>
#include <string>

namespace loom {

/// The exception loom throws for bad input or misuse; its message starts with "loom".
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A checkpoint file that cannot be read whole: missing, truncated, not a zip, a record whose
/// CRC-32 does not match, a pickle loom cannot decode, a shard file missing. rt.load throws it
/// for every failure of reading the file; loom::Checkpoints::resume moves such a file aside
/// and falls back to the checkpoint before it.
class CheckpointUnreadable : public Error {
 public:
  using Error::Error;
};

/// A checkpoint file that reads whole but does not fit this run: another precision's state,
/// another world size, other model shapes, another optimizer, keys missing or left over.
/// rt.load throws it for every failure of applying what it read; loom::Checkpoints::resume
/// passes it on and changes nothing in the directory (an older checkpoint that happens to fit
/// is not a reason to train over the newer ones).
class CheckpointMismatch : public Error {
 public:
  using Error::Error;
};

/// A collective that failed: a rank died or hung past the timeout, the network broke, or the
/// ranks called different collectives (one rank saved a checkpoint, the others trained on).
/// Every later collective of the group fails with it too. rt.load and loom::Checkpoints pass
/// it on as it is: it says nothing about the file.
class CollectiveError : public Error {
 public:
  using Error::Error;
};

}  // namespace loom
