// state::save_entries (state_dict.hpp): a State's entries saved into one value.
#include <loom/state_dict.hpp>

#include <loom/error.hpp>
#include <loom/state/entry.hpp>
#include <loom/state/values.hpp>

namespace loom::state {

Dict save_entries(const State& state) {
  Dict d = new_dict();
  for (const auto& e : state) {
    if (has(d, e.name())) throw Error("loom::save: the state names '" + e.name() + "' twice");
    d.insert(e.name(), e.save());
  }
  return d;
}

}  // namespace loom::state
