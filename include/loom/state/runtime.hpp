#pragma once
// The runtime's entry in a checkpoint ({"runtime", rt} in a loom::State): its layout and its
// parser, beside the module's (state/module.hpp) and the optimizer's (state/optimizer.hpp).
//
//   {"precision": "16-mixed",
//    "device": [each rank's device state: {"torch": CPU RNG, "torch.cuda": CUDA RNG}],
//    "precision_state": {the GradScaler's five keys under 16-mixed, fp8-mixed's scales, else
//                        empty},
//    "strategy": {the strategy's state (Ddp's and Zero stage 1's: the reducer's buckets)},
//    "strategy_name": "ddp" (the strategy that saved it: another one ignores its state),
//    "loggers": [each logger of rt.loggers(): {"version": its version_N (-1: none),
//                "step": the last step it logged (-1: none)}]}
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include <loom/state/load_options.hpp>
#include <loom/state/values.hpp>
#include <loom/state_dict.hpp>

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
  d.insert("strategy_name", std::string(rt.strategy().strategy()));
  c10::impl::GenericList loggers(c10::AnyType::get());
  for (const auto& logger : rt.loggers().all()) {
    Dict l = new_dict();
    l.insert("version", logger->version_in_use());
    l.insert("step", logger->last_step());
    loggers.push_back(l);
  }
  d.insert("loggers", loggers);
  return d;
}

/// Restores runtime_state's value into `rt`: this rank's device state, the precision's state
/// and the strategy's. Precision-specific state (the GradScaler, fp8 scales) needs the
/// precision it was saved under: otherwise (or when it is missing) loom::Error when
/// options.strict, else a warning naming it and the state is dropped. A file from another
/// world size: the same, unless options.world_size_may_change: then ranks below the
/// saved world size take the saved rank's device state and the others keep their own, with a
/// warning (Composer's rule for RNG states).
template <class R>
void load_runtime_state(R& rt, const c10::IValue& value, const LoadOptions& options) {
  const bool strict = options.strict;
  const std::string path = "runtime";
  const std::string name(R::precision_name());
  const Dict d = as_dict(value, path);
  const std::string saved =
      string_of(at(d, "precision", path), load_owner, join(path, "precision"));
  auto problem = [&](const std::string& where, const std::string& what) {
    if (strict) {
      fail(where, what +
                      " (or load with LoadOptions::strict = false to skip it: "
                      "rt.load(path, state, {.strict = false}))");
    }
    TORCH_WARN("loom::load: key \"", where, "\": ", what, "; not restored (strict=false)");
  };
  // Device: this rank's entry.
  if (has(d, "device")) {
    const auto ranks = as_sequence(at(d, "device", path), path + ".device");
    const auto world = static_cast<std::size_t>(rt.strategy().world_size());
    const auto rank = static_cast<std::size_t>(rt.strategy().rank());
    if (ranks.size() == world) {
      rt.device().load_state_dict(detail::from_dict(ranks[rank], path + ".device"));
    } else if (options.world_size_may_change) {
      if (rank < ranks.size()) {
        rt.device().load_state_dict(detail::from_dict(ranks[rank], path + ".device"));
      }
      if (rank == 0) {
        TORCH_WARN("loom::load: the checkpoint was written by ", ranks.size(),
                   " rank(s), this run has ", world, " (LoadOptions::world_size_may_change): ",
                   world > ranks.size()
                       ? "ranks " + std::to_string(ranks.size()) + ".." +
                             std::to_string(world - 1) +
                             " keep the generator states this program seeded, the others "
                             "restore the saved ones"
                       : "ranks 0.." + std::to_string(world - 1) +
                             " restore the saved ranks' generator states; those of saved ranks " +
                             std::to_string(world) + ".." + std::to_string(ranks.size() - 1) +
                             " are dropped");
      }
    } else {
      const std::string what = "the checkpoint holds the device states of " +
                               std::to_string(ranks.size()) + " rank(s), this run has " +
                               std::to_string(world);
      if (strict) {
        fail(path + ".device",
             what +
                 " (to resume on another number of ranks: loom::Checkpoints::resume(rt, state, "
                 "{.world_size_may_change = true}), or rt.load(path, state, "
                 "{.world_size_may_change = true}))");
      }
      TORCH_WARN("loom::load: key \"", path, ".device\": ", what, "; not restored (strict=false)");
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
  // The strategy's state is the saving strategy's own (a reduction layout): another strategy
  // (a Ddp run resumed in one process, say) starts without it. Files from before the name
  // was saved hold an empty state.
  const bool same_strategy = !has(d, "strategy_name") ||
                             string_of(at(d, "strategy_name", path), load_owner,
                                       join(path, "strategy_name")) == rt.strategy().strategy();
  if (same_strategy && has(d, "strategy")) {
    rt.strategy().load_state_dict(detail::from_dict(at(d, "strategy", path), path + ".strategy"));
  }
  // Loggers: the i-th logger of this runtime writes on where the saved run's i-th wrote.
  if (has(d, "loggers")) {
    const auto recorded = as_sequence(at(d, "loggers", path), path + ".loggers");
    const auto& mine_now = rt.loggers().all();
    for (std::size_t i = 0; i < recorded.size() && i < mine_now.size(); ++i) {
      const std::string where = path + ".loggers." + std::to_string(i);
      const Dict l = as_dict(recorded[i], where);
      const int64_t version = as_int(at(l, "version", where), join(where, "version"));
      if (version >= 0)
        mine_now[i]->continue_version(version, as_int(at(l, "step", where), join(where, "step")));
    }
  }
}

}  // namespace loom::state
