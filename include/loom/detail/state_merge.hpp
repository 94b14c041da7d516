#pragma once
// Runtime's state_dict layout: every policy's keys under its prefix, plus "precision", the
// precision's name, which loading checks. One helper for any number of policies.
#include <cstddef>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <loom/state_dict.hpp>
#include <loom/state_reader.hpp>

namespace loom::detail {

/// {"precision": name} and each state's keys under its prefix ("device.", "precision.", ...).
inline StateDict merge_states(std::string_view precision_name,
                              std::initializer_list<std::pair<std::string_view, StateDict>> parts) {
  StateDict out;
  out.emplace("precision", std::string(precision_name));
  for (auto& [prefix, state] : parts) {
    for (auto& [key, value] : state) out.emplace(std::string(prefix) + key, value);
  }
  return out;
}

/// The states merge_states made, one per prefix, in the prefixes' order; throws loom::Error
/// when "precision" is missing or names another precision, or a key has no known prefix.
inline std::vector<StateDict> split_states(const StateDict& state, std::string_view precision_name,
                                           std::initializer_list<std::string_view> prefixes) {
  static constexpr std::string_view owner = "loom::Runtime::load_state_dict";
  auto name = state.find("precision");
  if (name == state.end()) state::fail_missing(owner, "precision");
  const std::string saved = state::string_of(name->second, owner, "precision");
  if (saved != precision_name) {
    state::fail_key(owner, "precision",
                    "the state was saved with precision \"" + saved +
                        "\", but this runtime uses \"" + std::string(precision_name) + "\"");
  }
  std::vector<StateDict> out(prefixes.size());
  std::vector<std::string> unexpected;
  for (auto& [key, value] : state) {
    if (key == "precision") continue;
    bool owned = false;
    std::size_t i = 0;
    for (std::string_view prefix : prefixes) {
      if (!owned && key.starts_with(prefix)) {
        out[i].emplace(key.substr(prefix.size()), value);
        owned = true;
      }
      ++i;
    }
    if (!owned) unexpected.push_back(key);
  }
  if (!unexpected.empty()) state::fail_unexpected(owner, unexpected);
  return out;
}

}  // namespace loom::detail
