// Optimizer entries cut into per-rank states and merged back (optimizer_shards.hpp).
#include "optimizer_shards.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Dict.h>

#include <loom/state/entry.hpp>

namespace loom::state {

Dict optimizer_states(const State& state, const Dict& top) {
  Dict out(c10::StringType::get(), c10::AnyType::get());
  for (const auto& e : state) {
    if (e.kind() != EntryKind::Optimizer) continue;
    if (auto states = optimizer_state_of(top, e.name())) out.insert(e.name(), *states);
  }
  return out;
}

Dict with_optimizer_states(const Dict& top, const std::vector<c10::IValue>& parts) {
  std::map<std::string, std::map<std::int64_t, c10::IValue>> merged;
  for (const auto& part : parts) {
    for (const auto& entry : part.toGenericDict()) {
      auto& states = merged[entry.key().toStringRef()];
      for (const auto& e : entry.value().toGenericDict()) {
        states.insert_or_assign(e.key().toInt(), e.value());
      }
    }
  }
  auto whole = top.copy();
  for (auto& [name, states] : merged) {
    auto entry = top.at(name).toGenericDict().copy();
    c10::impl::GenericDict state(c10::IntType::get(), c10::AnyType::get());
    for (auto& [id, v] : states) state.insert(id, v);
    entry.insert_or_assign("state", state);
    whole.insert_or_assign(name, entry);
  }
  return whole;
}

std::optional<Dict> optimizer_state_of(const Dict& top, const std::string& name) {
  if (!top.contains(name) || !top.at(name).isGenericDict()) return std::nullopt;
  const auto entry = top.at(name).toGenericDict();
  if (!entry.contains("state") || !entry.at("state").isGenericDict()) return std::nullopt;
  return entry.at("state").toGenericDict();
}

}  // namespace loom::state
