#pragma once
#include <string>
#include <string_view>

#include <loom/error.hpp>
#include <loom/state_dict.hpp>

namespace loom::detail {

/// Throws loom::Error unless `state` is empty: the policy `name` of `family` ("device",
/// "precision", "strategy") keeps no state. Every Defaults base's load_state_dict.
inline void refuse_state(std::string_view name, std::string_view family, const StateDict& state) {
  if (!state.empty()) {
    throw Error("loom: the " + std::string(name) + " " + std::string(family) +
                " has no state, but the state dict holds the key '" + state.begin()->first + "'");
  }
}

}  // namespace loom::detail
