#pragma once
// A module's state as Python's `module.state_dict()`: names to tensors, in Python's order
// (each module's own parameters, then its own buffers, then its children's, depth first), and
// the load back in place, with Python's strict checks and precision casts.
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>

#include <loom/checkpoint/mapped.hpp>
#include <loom/detail/module_tensors.hpp>
#include <loom/error.hpp>
#include <loom/state/values.hpp>

namespace loom::state {

using detail::module_tensors;  // names to tensors in Python's order (detail/module_tensors.hpp)

/// `module.state_dict()`: names to detached tensors (no copies), Python's order.
inline Dict module_state(const torch::nn::Module& module) {
  Dict d = new_dict();
  for (auto& [name, t] : module_tensors(module)) d.insert(name, t.detach());
  return d;
}

/// Copies the tensors of `state` (a module_state, or Python's `state_dict()`) into `module`'s
/// parameters and buffers, in place: onto their device, cast to their dtype when both are
/// floating point (a fp32 checkpoint loads into a bf16 module, as convert_module would cast
/// it). Throws loom::Error naming the keys at fault, one line per kind (at most five keys each,
/// then a count): a shape mismatch, a floating/integer mismatch, and (when `strict`) missing
/// and unexpected keys, as Python's load_state_dict(strict=True). Nothing is copied when anything
/// is wrong. `path` names the state in errors ("model").
inline void load_module_state(torch::nn::Module& module, const c10::IValue& state,
                              std::string_view path, bool strict = true) {
  const Dict d = as_dict(state, path);
  const auto own = module_tensors(module);
  std::vector<std::string> missing, unexpected, wrong;
  checkpoint::LoadPlan plan;  // run once every key is checked
  for (const auto& [name, dst] : own) {
    auto it = d.find(c10::IValue(name));
    if (it == d.end()) {
      missing.push_back(name);
      continue;
    }
    if (!it->value().isTensor()) {
      wrong.push_back("'" + name + "' is a " + it->value().tagKind() + ", not a tensor");
      continue;
    }
    at::Tensor src = it->value().toTensor();
    if (src.sizes() != dst.sizes()) {
      wrong.push_back("'" + name + "' has shape " + shape_string(src.sizes()) +
                      " in the checkpoint and " + shape_string(dst.sizes()) + " in the module");
      continue;
    }
    const bool both_floating =
        at::isFloatingType(src.scalar_type()) && at::isFloatingType(dst.scalar_type());
    if (src.scalar_type() != dst.scalar_type() && !both_floating) {
      wrong.push_back("'" + name + "' is " + std::string(c10::toString(src.scalar_type())) +
                      " in the checkpoint and " + c10::toString(dst.scalar_type()) +
                      " in the module");
      continue;
    }
    plan.copy(dst, std::move(src));
  }
  std::unordered_set<std::string> names;
  for (const auto& o : own) names.insert(o.first);
  for (const auto& e : d) {
    if (!e.key().isString()) {
      unexpected.push_back("(a " + e.key().tagKind() + " key)");
      continue;
    }
    if (!names.count(e.key().toStringRef())) unexpected.push_back(e.key().toStringRef());
  }
  // One line per kind of fault, at most `shown` keys each, then how many more: a large
  // model's mismatch stays readable.
  constexpr std::size_t shown = 5;
  std::string why;
  auto list = [&](const char* what, const std::vector<std::string>& keys) {
    if (keys.empty()) return;
    why += std::string("\n  ") + what + " (" + std::to_string(keys.size()) + "):";
    for (std::size_t i = 0; i < keys.size() && i < shown; ++i) why += (i ? ", " : " ") + keys[i];
    if (keys.size() > shown) why += ", ... and " + std::to_string(keys.size() - shown) + " more";
  };
  list("mismatched", wrong);
  if (strict) {
    list("missing key(s)", missing);
    list("unexpected key(s)", unexpected);
  }
  if (!why.empty()) {
    fail(path, "does not fit the module:" + why +
                   (strict && (!missing.empty() || !unexpected.empty())
                        ? "\n  (strict = false loads the keys that match)"
                        : ""));
  }
  plan.run();
}

}  // namespace loom::state
