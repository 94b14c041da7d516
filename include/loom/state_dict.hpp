#pragma once
// The two dict types of loom's state (docs/checkpoints.md, "Which dict a component returns"):
// StateDict, a Checkpointable's flat names-to-values map, and state::Dict, a dict in Python's
// layout (nested, any keys, insertion order); and State, the list of named entries rt.save
// writes.
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

namespace loom {

/// A Checkpointable's state (a policy's, the loss scaler's, a sampler's): names to values
/// (tensors, numbers, strings), ordered by name.
///
/// The values are `c10::IValue`s, so a StateDict can be saved with `torch::pickle_save` once
/// turned into a `c10::Dict`, or written key by key into a `torch::serialize::OutputArchive`.
using StateDict = std::map<std::string, c10::IValue>;

class StateEntry;  // state/entry.hpp

/// Names to the objects rt.save writes and rt.load restores: each a StateEntry, complete in
/// state/entry.hpp (which state/checkpoint.hpp includes).
using State = std::vector<StateEntry>;

namespace state {

/// A state in Python's layout (a module's, an optimizer's, a scheduler's, the runtime's
/// entry): any keys (strings, ints) to any values, nested, in insertion order.
using Dict = c10::impl::GenericDict;

/// An empty Dict.
inline Dict new_dict() { return Dict(c10::AnyType::get(), c10::AnyType::get()); }

/// The value rt.save writes of `state`: {name: entry.save()} for every entry, in order; a name
/// given twice is a loom::Error. Every rank calls it (the runtime's entry gathers every rank's
/// generator states): a strategy's save_checkpoint does, then writes it or splits it by the
/// entries' kinds. Compiled: src/state/entries.cpp.
Dict save_entries(const State& state);

}  // namespace state

}  // namespace loom
