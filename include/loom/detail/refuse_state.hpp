#pragma once
#include <string>
#include <string_view>
#include <vector>

#include <loom/state_dict.hpp>
#include <loom/state_reader.hpp>

namespace loom::detail {

/// Throws loom::Error unless `state` is empty: the policy `name` of `family` ("device",
/// "precision", "strategy") keeps no state. Every Defaults base's load_state_dict:
/// `loom: the cpu device has no state: unexpected key(s) "rng"`.
inline void refuse_state(std::string_view name, std::string_view family, const StateDict& state) {
  if (state.empty()) return;
  std::vector<std::string> keys;
  for (const auto& entry : state) keys.push_back(entry.first);
  state::fail_unexpected(
      "loom: the " + std::string(name) + " " + std::string(family) + " has no state", keys);
}

}  // namespace loom::detail
