#pragma once
#include <map>
#include <string>

#include <ATen/core/ivalue.h>

namespace loom {

/// A policy's checkpointable state: names to values (tensors, numbers, strings), ordered by name.
///
/// The values are `c10::IValue`s, so a StateDict can be saved with `torch::pickle_save` once
/// turned into a `c10::Dict`, or written key by key into a `torch::serialize::OutputArchive`.
using StateDict = std::map<std::string, c10::IValue>;

}  // namespace loom
