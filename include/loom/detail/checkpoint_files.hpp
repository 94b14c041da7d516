#pragma once
// What Runtime::save and Runtime::load hand their work to: checkpoint_files<State>, defined by
// the opt-in header state/checkpoint.hpp. Keeping it out of runtime.hpp keeps the file format
// (pickle, zip container, CRC threads) out of every translation unit that trains.
#include <loom/detail/meta.hpp>
#include <loom/state/load_options.hpp>

namespace loom {
class StateEntry;  // complete in <loom/state/checkpoint.hpp>, which rt.save and rt.load need
}  // namespace loom

namespace loom::detail {

/// Defined for S = loom::State by state/checkpoint.hpp; reached without it, this says so.
template <class S>
struct checkpoint_files {
  static_assert(always_false<S>,
                "loom::Runtime::save and load need #include <loom/state/checkpoint.hpp> (or "
                "<loom/loom.hpp>): it holds the checkpoint file format, which runtime.hpp leaves "
                "out (docs/checkpoints.md)");
};

}  // namespace loom::detail
