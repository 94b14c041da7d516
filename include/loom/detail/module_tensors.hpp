#pragma once
// Every defined parameter and buffer of a module under its state_dict name, in Python's order:
// what state/module.hpp saves and loads and what optim::EMA averages.
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

namespace loom::detail {

/// Every defined parameter and buffer of `module` under its state_dict name, in Python's
/// order (each module's own parameters, then its own buffers, then its children's, depth first).
inline std::vector<std::pair<std::string, at::Tensor>> module_tensors(
    const torch::nn::Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  auto name = [](const std::string& prefix, const std::string& key) {
    return prefix.empty() ? key : prefix + "." + key;
  };
  for (const auto& item : module.named_modules()) {
    const auto& m = item.value();
    for (const auto& p : m->named_parameters(/*recurse=*/false)) {
      if (p.value().defined()) out.emplace_back(name(item.key(), p.key()), p.value());
    }
    for (const auto& b : m->named_buffers(/*recurse=*/false)) {
      if (b.value().defined()) out.emplace_back(name(item.key(), b.key()), b.value());
    }
  }
  return out;
}

}  // namespace loom::detail
