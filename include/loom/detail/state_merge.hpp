#pragma once
// Runtime's state_dict layout: every policy's keys under its prefix, plus "precision", the
// precision's name, which loading checks. One helper for any number of policies.
#include <cstddef>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <loom/error.hpp>
#include <loom/state_dict.hpp>

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
  auto name = state.find("precision");
  if (name == state.end() || !name->second.isString()) {
    throw Error(
        "loom::Runtime::load_state_dict: the state has no \"precision\" entry; it was "
        "not saved by loom::Runtime::state_dict()");
  }
  if (name->second.toStringRef() != precision_name) {
    throw Error("loom::Runtime::load_state_dict: the state was saved with precision \"" +
                name->second.toStringRef() + "\", but this runtime uses \"" +
                std::string(precision_name) + "\"");
  }
  std::vector<StateDict> out(prefixes.size());
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
    if (!owned) throw Error("loom::Runtime::load_state_dict: unexpected key \"" + key + "\"");
  }
  return out;
}

}  // namespace loom::detail
