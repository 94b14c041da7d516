#pragma once
// An optimizer entry's per-parameter states cut out of a checkpoint's value and merged back
// in: what a sharding strategy writes per rank (loom::Zero's consolidated and sharded saves)
// and what a sharded checkpoint's files hold (checkpoint::merge_shards). Python's layout of
// an optimizer entry, {"state": {id: {...}}, "param_groups": [...]} (state/optimizer.hpp), is
// read here and in state/ only. Internal to the loom libraries.
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/ivalue.h>

#include <loom/state_dict.hpp>

namespace loom::state {

/// Of `top` (state::save_entries(state)): each optimizer entry's "state" (its per-parameter
/// states, by parameter id), by entry name; the optimizer entries are those of kind
/// EntryKind::Optimizer. Empty when `state` has no optimizer entry.
Dict optimizer_states(const State& state, const Dict& top);

/// A copy of `top` whose optimizer entries hold the states of every part of `parts` (each an
/// optimizer_states() dict, a rank's), merged by parameter id in ascending order (a later
/// part's state of the same id wins).
Dict with_optimizer_states(const Dict& top, const std::vector<c10::IValue>& parts);

/// The "state" dict of `top`'s entry `name` (shared, not copied: inserting into it changes
/// `top`), when that entry is a dict holding one; else nothing.
std::optional<Dict> optimizer_state_of(const Dict& top, const std::string& name);

}  // namespace loom::state
