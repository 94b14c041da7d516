#pragma once
// An optimizer's state in Python's `optimizer.state_dict()` layout, both ways, for SGD, Adam
// and AdamW: LibTorch's (torch::optim) and loom's fused ones (loom::optim).
//
//   {"state": {0: {"momentum_buffer": T}, ...} | {0: {"step": f32, "exp_avg": T, ...}, ...},
//    "param_groups": [{"lr": .., <every key Python writes>, "params": [0, 1, ...]}, ...]}
//
// Parameter ids count up across the groups in group order, as Python numbers them; `betas`
// is a tuple; `step` is a float32 0-dim tensor (on the CPU for LibTorch's optimizers, Python's
// non-fused layout; on the parameter's device for loom's, Python's fused layout). Every group
// key Python writes is written, with `fused` True for loom's optimizers, so that Python's
// load_state_dict (which replaces a group's options wholesale) continues with the same kernel.
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <typeinfo>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>

#include <loom/error.hpp>
#include <loom/optim/adam.hpp>
#include <loom/optim/sgd.hpp>
#include <loom/state/values.hpp>

namespace loom::state {

namespace detail {

enum class Family { Sgd, Adam };

/// What differs between the six optimizers: the options and per-parameter state types, and
/// how Python sees them.
template <class Options, class ParamState, Family F, bool Loom, bool Decoupled = false>
struct OptimizerKind {
  using options = Options;
  using param_state = ParamState;
  static constexpr Family family = F;
  static constexpr bool loom = Loom;  // fused kernels, f32 tensor step, has maximize
  static constexpr bool decoupled = Decoupled;
};

using TorchSgd =
    OptimizerKind<torch::optim::SGDOptions, torch::optim::SGDParamState, Family::Sgd, false>;
using TorchAdam =
    OptimizerKind<torch::optim::AdamOptions, torch::optim::AdamParamState, Family::Adam, false>;
using TorchAdamW = OptimizerKind<torch::optim::AdamWOptions, torch::optim::AdamWParamState,
                                 Family::Adam, false, true>;
using LoomSgd = OptimizerKind<optim::SGDOptions, optim::SGDParamState, Family::Sgd, true>;
using LoomAdam = OptimizerKind<optim::AdamOptions, optim::AdamParamState, Family::Adam, true>;
using LoomAdamW =
    OptimizerKind<optim::AdamWOptions, optim::AdamParamState, Family::Adam, true, true>;

/// Calls fn(Kind{}) for the optimizer's kind; throws loom::Error for any other optimizer.
template <class Fn>
decltype(auto) visit_optimizer(const torch::optim::Optimizer& opt, std::string_view path, Fn&& fn) {
  const auto* p = &opt;
  if (dynamic_cast<const optim::SGD*>(p)) return fn(LoomSgd{});
  if (dynamic_cast<const optim::Adam*>(p)) return fn(LoomAdam{});
  if (dynamic_cast<const optim::AdamW*>(p)) return fn(LoomAdamW{});
  if (dynamic_cast<const torch::optim::SGD*>(p)) return fn(TorchSgd{});
  if (dynamic_cast<const torch::optim::AdamW*>(p)) return fn(TorchAdamW{});
  if (dynamic_cast<const torch::optim::Adam*>(p)) return fn(TorchAdam{});
  throw Error("loom: '" + std::string(path) +
              "' is an optimizer loom cannot checkpoint in Python's layout (" + typeid(opt).name() +
              "); loom saves and loads SGD, Adam and AdamW, LibTorch's and loom::optim's");
}

inline c10::IValue none() { return c10::IValue(); }

template <class K>
Dict group_dict(const typename K::options& o, std::vector<int64_t> ids) {
  Dict g = new_dict();
  bool maximize = false;
  if constexpr (K::loom) maximize = o.maximize();
  g.insert("lr", o.lr());
  if constexpr (K::family == Family::Sgd) {
    g.insert("momentum", o.momentum());
    g.insert("dampening", o.dampening());
    g.insert("weight_decay", o.weight_decay());
    g.insert("nesterov", o.nesterov());
    g.insert("maximize", maximize);
    g.insert("foreach", none());
    g.insert("differentiable", false);
    g.insert("fused", K::loom ? c10::IValue(true) : none());
  } else {
    const auto [b1, b2] = o.betas();
    g.insert("betas", c10::ivalue::Tuple::create({c10::IValue(b1), c10::IValue(b2)}));
    g.insert("eps", o.eps());
    g.insert("weight_decay", o.weight_decay());
    g.insert("amsgrad", o.amsgrad());
    g.insert("maximize", maximize);
    g.insert("foreach", none());
    g.insert("capturable", false);
    g.insert("differentiable", false);
    g.insert("fused", K::loom ? c10::IValue(true) : none());
    g.insert("decoupled_weight_decay", K::decoupled);
  }
  g.insert("params", c10::List<int64_t>(ids));
  return g;
}

template <class K>
Dict param_dict(const typename K::param_state& s) {
  Dict d = new_dict();
  if constexpr (K::family == Family::Sgd) {
    if (s.momentum_buffer().defined()) d.insert("momentum_buffer", s.momentum_buffer().detach());
  } else {
    if constexpr (K::loom) {
      d.insert("step", s.step().detach());
    } else {
      d.insert("step", at::scalar_tensor(static_cast<double>(s.step()), at::kFloat));
    }
    d.insert("exp_avg", s.exp_avg().detach());
    d.insert("exp_avg_sq", s.exp_avg_sq().detach());
    if (s.max_exp_avg_sq().defined()) d.insert("max_exp_avg_sq", s.max_exp_avg_sq().detach());
  }
  return d;
}

template <class K>
Dict save(const torch::optim::Optimizer& opt) {
  Dict state(c10::IntType::get(), c10::AnyType::get());
  c10::impl::GenericList groups(c10::AnyType::get());
  int64_t id = 0;
  for (const auto& group : opt.param_groups()) {
    std::vector<int64_t> ids;
    for (const auto& p : group.params()) {
      auto it = opt.state().find(p.unsafeGetTensorImpl());
      if (it != opt.state().end()) {
        Dict d = param_dict<K>(static_cast<const typename K::param_state&>(*it->second));
        if (d.size() > 0) state.insert(id, d);
      }
      ids.push_back(id++);
    }
    groups.push_back(
        group_dict<K>(static_cast<const typename K::options&>(group.options()), std::move(ids)));
  }
  Dict out = new_dict();
  out.insert("state", state);
  out.insert("param_groups", groups);
  return out;
}

/// A state tensor of the checkpoint for parameter `p`: on p's device, in p's dtype when both
/// are floating point (Python's rule for every state but `step`), laid out like p. With
/// `adopt` (a state just read from a file) a tensor that already is all that and the only
/// user of its storage is kept, as Python keeps it; anything else is copied, so no state
/// tensor ever aliases another's or one still in use elsewhere.
inline at::Tensor like_param(const at::Tensor& t, const at::Tensor& p, std::string_view path,
                             bool adopt) {
  if (t.sizes() != p.sizes()) {
    fail(path,
         "has shape " + shape_string(t.sizes()) + ", its parameter " + shape_string(p.sizes()));
  }
  const auto dtype = at::isFloatingType(t.scalar_type()) && at::isFloatingType(p.scalar_type())
                         ? p.scalar_type()
                         : t.scalar_type();
  if (adopt && t.device() == p.device() && t.scalar_type() == dtype && t.strides() == p.strides() &&
      t.storage_offset() == 0 && t.storage().use_count() == 1 &&
      t.storage().nbytes() == t.nbytes() && !t.requires_grad()) {
    return t;
  }
  return at::empty_like(p, p.options().dtype(dtype)).copy_(t);
}

inline double step_value(const c10::IValue& v, std::string_view path) {
  if (v.isTensor()) {
    const at::Tensor t = v.toTensor();
    if (t.numel() != 1)
      fail(path, "expected one number, the tensor has " + std::to_string(t.numel()));
    return t.item<double>();
  }
  return as_double(v, path);
}

template <class K>
void load_options(typename K::options& o, const Dict& g, const std::string& path) {
  auto get = [&](const char* key) { return at(g, key, path); };
  auto opt_bool = [&](const char* key, bool fallback) {
    return has(g, key) ? as_bool(at(g, key, path), join(path, key)) : fallback;
  };
  const bool maximize = opt_bool("maximize", false);
  if constexpr (K::loom) {
    o.maximize(maximize);
  } else if (maximize) {
    fail(join(path, "maximize"),
         "is True; LibTorch's optimizers have no maximize (use loom::optim's)");
  }
  o.lr(as_double(get("lr"), join(path, "lr")));
  o.weight_decay(as_double(get("weight_decay"), join(path, "weight_decay")));
  if constexpr (K::family == Family::Sgd) {
    o.momentum(as_double(get("momentum"), join(path, "momentum")));
    o.dampening(has(g, "dampening") ? as_double(get("dampening"), join(path, "dampening")) : 0.0);
    o.nesterov(opt_bool("nesterov", false));
  } else {
    const auto betas = as_sequence(get("betas"), join(path, "betas"));
    if (betas.size() != 2) fail(join(path, "betas"), "expected two numbers");
    o.betas(std::make_tuple(as_double(betas[0], join(path, "betas")),
                            as_double(betas[1], join(path, "betas"))));
    o.eps(as_double(get("eps"), join(path, "eps")));
    o.amsgrad(opt_bool("amsgrad", false));
    if (has(g, "decoupled_weight_decay") &&
        as_bool(get("decoupled_weight_decay"), join(path, "decoupled_weight_decay")) !=
            K::decoupled) {
      fail(join(path, "decoupled_weight_decay"),
           K::decoupled ? "is False: the checkpoint holds Adam's state, the optimizer is AdamW"
                        : "is True: the checkpoint holds AdamW's state, the optimizer is Adam");
    }
  }
}

template <class K>
std::unique_ptr<typename K::param_state> load_param(const Dict& d, const at::Tensor& p,
                                                    bool amsgrad, bool adopt,
                                                    const std::string& path) {
  auto s = std::make_unique<typename K::param_state>();
  auto tensor = [&](const char* key) {
    return like_param(as_tensor(at(d, key, path), join(path, key)), p, join(path, key), adopt);
  };
  if constexpr (K::family == Family::Sgd) {
    if (has(d, "momentum_buffer") && !at(d, "momentum_buffer", path).isNone()) {
      s->momentum_buffer(tensor("momentum_buffer"));
    }
  } else {
    const double step = step_value(at(d, "step", path), join(path, "step"));
    if constexpr (K::loom) {
      s->step(at::full({}, step, p.options().dtype(at::kFloat)));
    } else {
      s->step(static_cast<int64_t>(step));
    }
    s->exp_avg(tensor("exp_avg"));
    s->exp_avg_sq(tensor("exp_avg_sq"));
    if (amsgrad) s->max_exp_avg_sq(tensor("max_exp_avg_sq"));
  }
  return s;
}

template <class K>
void load(torch::optim::Optimizer& opt, const c10::IValue& value, const std::string& path,
          bool adopt) {
  const Dict d = as_dict(value, path);
  const auto groups = as_sequence(at(d, "param_groups", path), join(path, "param_groups"));
  const Dict state = as_dict(at(d, "state", path), join(path, "state"));
  auto& own = opt.param_groups();
  if (groups.size() != own.size()) {
    fail(join(path, "param_groups"), "the checkpoint has " + std::to_string(groups.size()) +
                                         " param groups, the optimizer " +
                                         std::to_string(own.size()));
  }
  // Check and decode everything first: a failure leaves the optimizer as it was.
  std::vector<std::unique_ptr<typename K::options>> options;
  std::vector<std::pair<at::TensorImpl*, std::unique_ptr<typename K::param_state>>> states;
  struct Owner {
    at::Tensor param;
    std::size_t group;
  };
  std::unordered_map<int64_t, Owner> by_id;
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const std::string gpath = join(join(path, "param_groups"), std::to_string(i));
    const Dict g = as_dict(groups[i], gpath);
    if constexpr (K::family == Family::Sgd) {
      if (has(g, "betas")) fail(gpath, "holds Adam's options (betas), the optimizer is SGD");
    } else {
      if (!has(g, "betas")) fail(gpath, "holds SGD's options (no betas), the optimizer is Adam");
    }
    const auto ids = as_sequence(at(g, "params", gpath), join(gpath, "params"));
    if (ids.size() != own[i].params().size()) {
      fail(join(gpath, "params"), "the checkpoint's group has " + std::to_string(ids.size()) +
                                      " parameters, the optimizer's " +
                                      std::to_string(own[i].params().size()));
    }
    for (std::size_t j = 0; j < ids.size(); ++j) {
      const int64_t id = as_int(ids[j], join(gpath, "params"));
      if (!by_id.emplace(id, Owner{own[i].params()[j], i}).second) {
        fail(join(gpath, "params"), "names the parameter id " + std::to_string(id) +
                                        " twice in the checkpoint's param_groups");
      }
    }
    auto o = std::make_unique<typename K::options>(
        static_cast<const typename K::options&>(own[i].options()));
    load_options<K>(*o, g, gpath);
    options.push_back(std::move(o));
  }
  for (const auto& e : state) {
    const int64_t id = as_int(e.key(), join(path, "state"));
    const std::string spath = join(join(path, "state"), std::to_string(id));
    const auto owner = by_id.find(id);
    if (owner == by_id.end()) {
      fail(spath, "no parameter of the checkpoint's param_groups has this id");
    }
    const at::Tensor& param = owner->second.param;
    bool amsgrad = false;
    if constexpr (K::family == Family::Adam) amsgrad = options[owner->second.group]->amsgrad();
    states.emplace_back(param.unsafeGetTensorImpl(),
                        load_param<K>(as_dict(e.value(), spath), param, amsgrad, adopt, spath));
  }
  for (std::size_t i = 0; i < own.size(); ++i) own[i].set_options(std::move(options[i]));
  opt.state().clear();
  for (auto& [key, s] : states) opt.state()[key] = std::move(s);
}

}  // namespace detail

/// `optimizer.state_dict()` as Python writes it (see the top of this file).
inline Dict optimizer_state(const torch::optim::Optimizer& optimizer,
                            std::string_view path = "optimizer") {
  return detail::visit_optimizer(
      optimizer, path, [&](auto kind) { return detail::save<decltype(kind)>(optimizer); });
}

/// Loads an optimizer_state(), or Python's optimizer.state_dict() (SGD, Adam, AdamW, fused
/// or not), into `optimizer`: every group's options are replaced by the checkpoint's (as
/// Python's load_state_dict does), each parameter's state is cast to its parameter's dtype
/// and device. Throws loom::Error naming the key at fault (another optimizer's state, a group
/// or parameter count that differs, a missing key, a shape mismatch, maximize=True for a
/// LibTorch optimizer, a parameter id named twice); then the optimizer is unchanged.
/// `adopt`: `state` was just read from a file and nothing else uses its tensors (what rt.load
/// passes), so those already in place are kept rather than copied; with the default the
/// optimizer's state tensors are always its own copies.
inline void load_optimizer_state(torch::optim::Optimizer& optimizer, const c10::IValue& state,
                                 const std::string& path = "optimizer", bool adopt = false) {
  detail::visit_optimizer(optimizer, path, [&](auto kind) {
    detail::load<decltype(kind)>(optimizer, state, path, adopt);
  });
}

}  // namespace loom::state
