#pragma once
// The examples' checkpoint options on a CLI11 app:
//   --checkpoint-dir DIR [--checkpoint-every N] [--keep K] [--async-save]
// What they do is in each example, on loom::Checkpoints (docs/checkpoints.md).
#include <cstddef>
#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

namespace examples {

struct CheckpointFlags {
  std::string dir;  // empty: no checkpoints
  int64_t every = 100;
  std::size_t keep = 3;
  bool async_save = false;

  /// Adds the four options to `app`; `resumes` says when a run resumes from DIR.
  void add_to(CLI::App& app, const std::string& resumes) {
    app.add_option("--checkpoint-dir", dir,
                   "save the training state to DIR/step-N.pt and DIR/final.pt; resume from the "
                   "newest checkpoint there" +
                       resumes);
    app.add_option("--checkpoint-every", every, "steps between checkpoints")
        ->check(CLI::PositiveNumber);
    app.add_option("--keep", keep, "checkpoints kept in DIR (the newest)")
        ->check(CLI::PositiveNumber);
    app.add_flag("--async-save", async_save,
                 "write the periodic checkpoints in a background thread while training goes on");
  }
};

}  // namespace examples
