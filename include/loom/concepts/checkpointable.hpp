#pragma once
#include <loom/detail/checkpointable_rows.hpp>

namespace loom {

/// What every policy family shares: state to save and restore, and a last call at the end.
///
///   t: T&  ct: const T&  sd: const StateDict&
///
///   expression            returns     the Defaults bases do
///   ct.state_dict()       StateDict   {}
///   t.load_state_dict(sd) void        non-empty sd: loom::Error naming the first key
///   t.teardown()          void        nothing
///
/// Laws: load_state_dict(state_dict()) restores what state_dict saw; teardown may be called
/// once, after the last step.
/// Models: every shipped device, precision and strategy policy.
/// Page: docs/concepts/checkpointable.md
template <class T>
concept Checkpointable = true LOOM_DETAIL_CHECKPOINTABLE_ROWS(LOOM_DETAIL_ROW_AND, T);

}  // namespace loom
