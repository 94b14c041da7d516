#pragma once
// The runtime's entry in a checkpoint ({"runtime", rt} in a loom::State): its layout and its
// parser, beside the module's (state/module.hpp) and the optimizer's (state/optimizer.hpp).
//
//   {"precision": "16-mixed",
//    "device": [each rank's device state: {"torch": CPU RNG, "torch.cuda": CUDA RNG}],
//    "precision_state": {the GradScaler's five keys under 16-mixed, fp8-mixed's scales, else
//                        empty},
//    "strategy": {the strategy's state}}
#include <concepts>
#include <cstddef>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include <loom/state/state_dict.hpp>
#include <loom/state/values.hpp>

namespace loom::state {

namespace detail {

/// A loom::Runtime: the three policies and the precision's name.
template <class R>
concept runtime_like = requires(R& rt) {
  typename R::device_policy;
  typename R::precision_policy;
  typename R::strategy_policy;
  rt.device();
  rt.precision();
  rt.strategy();
  R::precision_name();
};

inline Dict to_dict(const StateDict& s) {
  Dict d = new_dict();
  for (const auto& [k, v] : s) d.insert(k, v);
  return d;
}

inline StateDict from_dict(const c10::IValue& v, const std::string& path) {
  StateDict out;
  for (const auto& e : as_dict(v, path)) {
    if (!e.key().isString())
      fail(path, "expected a dict of str keys, got " + kind_of(e.key()) + " key");
    out.emplace(e.key().toStringRef(), e.value());
  }
  return out;
}

/// Each rank's device state, in rank order (one process: its own). Every tensor goes through
/// the strategy's all_gather on the device (NCCL gathers CUDA tensors only); values that are
/// not tensors are the same on every rank.
template <class R>
c10::impl::GenericList gather_device_states(R& rt) {
  c10::impl::GenericList out(c10::AnyType::get());
  const StateDict mine = rt.device().state_dict();
  const int world = rt.strategy().world_size();
  if (world <= 1) {
    out.push_back(to_dict(mine));
    return out;
  }
  std::vector<StateDict> all(static_cast<std::size_t>(world));
  for (const auto& [key, value] : mine) {
    if (!value.isTensor()) {
      for (auto& s : all) s.emplace(key, value);
      continue;
    }
    const std::vector<at::Tensor> parts =
        rt.strategy().all_gather(rt.device().tensor_to_device(value.toTensor()));
    for (int r = 0; r < world; ++r) {
      all[static_cast<std::size_t>(r)].emplace(key, parts[static_cast<std::size_t>(r)].cpu());
    }
  }
  for (auto& s : all) out.push_back(to_dict(s));
  return out;
}

}  // namespace detail

/// The runtime's entry (see the top of this file). Under Ddp every rank must call it: the
/// device states are gathered from all ranks.
template <class R>
Dict runtime_state(R& rt) {
  Dict d = new_dict();
  d.insert("precision", std::string(R::precision_name()));
  d.insert("device", detail::gather_device_states(rt));
  d.insert("precision_state", detail::to_dict(rt.precision().state_dict()));
  d.insert("strategy", detail::to_dict(rt.strategy().state_dict()));
  return d;
}

/// Restores runtime_state's value into `rt`: this rank's device state, the precision's state
/// and the strategy's. Precision-specific state (the GradScaler, fp8 scales) needs the
/// precision it was saved under: otherwise (or when it is missing) loom::Error when `strict`,
/// else a warning naming it and the state is dropped. A file from another world size: the same.
template <class R>
void load_runtime_state(R& rt, const c10::IValue& value, bool strict) {
  const std::string path = "runtime";
  const std::string name(R::precision_name());
  const Dict d = as_dict(value, path);
  const std::string saved =
      string_of(at(d, "precision", path), load_owner, join(path, "precision"));
  auto problem = [&](const std::string& where, const std::string& what) {
    if (strict) fail(where, what + " (or load with strict = false to skip it)");
    TORCH_WARN("loom::load: key \"", where, "\": ", what, "; not restored (strict=false)");
  };
  // Device: this rank's entry.
  if (has(d, "device")) {
    const auto ranks = as_sequence(at(d, "device", path), path + ".device");
    const auto world = static_cast<std::size_t>(rt.strategy().world_size());
    if (ranks.size() != world) {
      problem(path + ".device", "the checkpoint holds the device states of " +
                                    std::to_string(ranks.size()) + " rank(s), this run has " +
                                    std::to_string(world));
    } else {
      const auto rank = static_cast<std::size_t>(rt.strategy().rank());
      rt.device().load_state_dict(detail::from_dict(ranks[rank], path + ".device"));
    }
  }
  // Precision: only under the same precision.
  const StateDict mine = rt.precision().state_dict();
  const StateDict theirs =
      has(d, "precision_state")
          ? detail::from_dict(at(d, "precision_state", path), path + ".precision_state")
          : StateDict{};
  if (saved == name) {
    rt.precision().load_state_dict(theirs);
  } else if (!theirs.empty()) {
    problem(path + ".precision_state",
            "holds the state of precision \"" + saved + "\" (" + theirs.begin()->first +
                ", ...), which this runtime's \"" + name +
                "\" cannot use; model and optimizer states load under any precision, "
                "precision-specific state only under its own");
  } else if (!mine.empty()) {
    problem(path + ".precision_state", "the checkpoint was saved under precision \"" + saved +
                                           "\", which has no state; this runtime's \"" + name +
                                           "\" needs its own (" + mine.begin()->first + ", ...)");
  }
  if (has(d, "strategy")) {
    rt.strategy().load_state_dict(detail::from_dict(at(d, "strategy", path), path + ".strategy"));
  }
}

}  // namespace loom::state
