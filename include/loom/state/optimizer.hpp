#pragma once
// An optimizer's state in Python's `optimizer.state_dict()` layout, both ways, for every
// optimizer of loom's optimizer table with a Python layout (optim/optimizer_table.hpp): SGD,
// Adam and AdamW, LibTorch's (torch::optim) and loom's fused ones (loom::optim), and those a
// user entered with register_optimizer<O>(). This file holds the frame (parameter ids, groups,
// checks, the casts to each parameter); each optimizer's keys are its optimizer_traits'.
//
//   {"state": {0: {"momentum_buffer": T}, ...} | {0: {"step": f32, "exp_avg": T, ...}, ...},
//    "param_groups": [{"lr": .., <every key Python writes>, "params": [0, 1, ...]}, ...]}
//
// Parameter ids count up across the groups in group order, as Python numbers them; `betas`
// is a tuple; `step` is a float32 0-dim tensor (on the CPU for LibTorch's optimizers, Python's
// non-fused layout; on the parameter's device for loom's, Python's fused layout). Every group
// key Python writes is written, with `fused` True for loom's optimizers, so that Python's
// load_state_dict (which replaces a group's options wholesale) continues with the same kernel.
// A parameter whose state is empty (SGD without momentum) has no entry under "state".
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Type.h>
#include <torch/optim/optimizer.h>

#include <loom/checkpoint/mapped.hpp>
#include <loom/error.hpp>
#include <loom/optim/optimizer_table.hpp>
#include <loom/optim/optimizer_traits.hpp>
#include <loom/state/values.hpp>

namespace loom::state {

namespace detail {

/// The table's row for `opt`, with Python's layout; a loom::Error naming `path` otherwise.
inline const optim::OptimizerInfo& checkpointable(const torch::optim::Optimizer& opt,
                                                  std::string_view path) {
  const auto* info = optim::find_optimizer(opt);
  if (info != nullptr && info->python_layout) return *info;
  throw Error("loom: '" + std::string(path) +
              "' is an optimizer loom cannot checkpoint in Python's layout (" +
              c10::demangle(typeid(opt).name()) +
              (info == nullptr ? "" : ": its row of loom's optimizer table has no Python layout") +
              "); loom saves and loads LibTorch's and loom::optim's SGD, Adam and AdamW, and "
              "every optimizer entered with loom::optim::register_optimizer<O>() (docs/optim.md, "
              "\"Your own optimizer\")");
}

/// A state tensor of the checkpoint for parameter `p`: on p's device, in p's dtype when both
/// are floating point (Python's rule for every state but `step`), laid out like p. With
/// `adopt` (a state just read from a file) a tensor that already is all that and that the
/// plan may adopt (checkpoint::LoadPlan::may_adopt: its storage's only user, not a view of a
/// mapped file) is kept, as Python keeps it. Else `into`, the optimizer's own tensor for this
/// state, is reused where it is all that: the copy into it goes into `plan` (run after every
/// check) and `into` is returned, so a load writes into memory the optimizer already holds.
/// Anything else is copied into a new tensor at once (not through the plan: streaming stores
/// into pages never touched cost twice the memory traffic), so no state tensor ever aliases
/// another's or one still in use elsewhere.
inline at::Tensor like_param(const at::Tensor& t, const at::Tensor& p, std::string_view path,
                             bool adopt, const at::Tensor& into = {},
                             checkpoint::LoadPlan* plan = nullptr) {
  if (t.sizes() != p.sizes()) {
    fail(path,
         "has shape " + shape_string(t.sizes()) + ", its parameter " + shape_string(p.sizes()));
  }
  const auto dtype = at::isFloatingType(t.scalar_type()) && at::isFloatingType(p.scalar_type())
                         ? p.scalar_type()
                         : t.scalar_type();
  auto fits = [&](const at::Tensor& x) {
    return x.sizes() == p.sizes() && x.device() == p.device() && x.scalar_type() == dtype &&
           x.strides() == p.strides() && !x.requires_grad();
  };
  if (adopt && fits(t) && checkpoint::LoadPlan::may_adopt(t)) return t;
  if (plan != nullptr && into.defined() && fits(into)) {
    plan->copy(into, t);
    return into;
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

/// optim::PythonReader over one dict of a checkpoint, with state/values.hpp's errors.
class DictReader final : public optim::PythonReader {
 public:
  /// `reuse`: the optimizer's current state of `param` (its tensors, by key, as save_state
  /// gives them) and the plan the copies into them go to; see like_param.
  DictReader(Dict d, std::string path, at::Tensor param = {}, bool adopt = false,
             std::optional<Dict> reuse = std::nullopt, checkpoint::LoadPlan* plan = nullptr)
      : d_(std::move(d)),
        path_(std::move(path)),
        param_(std::move(param)),
        adopt_(adopt),
        reuse_(std::move(reuse)),
        plan_(plan) {}

  bool has(std::string_view key) const override {
    auto it = d_.find(c10::IValue(std::string(key)));
    return it != d_.end() && !it->value().isNone();
  }
  double number(std::string_view key) const override {
    return step_value(at(d_, key, path_), join(path_, key));
  }
  bool boolean(std::string_view key) const override {
    return as_bool(at(d_, key, path_), join(path_, key));
  }
  std::vector<double> numbers(std::string_view key) const override {
    std::vector<double> out;
    for (const auto& v : as_sequence(at(d_, key, path_), join(path_, key))) {
      out.push_back(as_double(v, join(path_, key)));
    }
    return out;
  }
  at::Tensor tensor(std::string_view key) const override {
    at::Tensor into;
    if (reuse_) {
      auto it = reuse_->find(c10::IValue(std::string(key)));
      if (it != reuse_->end() && it->value().isTensor()) into = it->value().toTensor();
    }
    return like_param(as_tensor(at(d_, key, path_), join(path_, key)), param_, join(path_, key),
                      adopt_, into, plan_);
  }
  const at::Tensor& param() const override { return param_; }
  [[noreturn]] void fail(std::string_view key, std::string_view what) const override {
    state::fail(key.empty() ? path_ : join(path_, key), what);
  }

 private:
  Dict d_;
  std::string path_;
  at::Tensor param_;
  bool adopt_;
  std::optional<Dict> reuse_;
  checkpoint::LoadPlan* plan_;
};

inline Dict save(const torch::optim::Optimizer& opt, const optim::OptimizerInfo& info) {
  Dict state(c10::IntType::get(), c10::AnyType::get());
  c10::impl::GenericList groups(c10::AnyType::get());
  int64_t id = 0;
  for (const auto& group : opt.param_groups()) {
    std::vector<int64_t> ids;
    for (const auto& p : group.params()) {
      auto it = opt.state().find(p.unsafeGetTensorImpl());
      if (it != opt.state().end() && it->second) {
        Dict d = new_dict();
        info.save_state(*it->second, d);
        if (d.size() > 0) state.insert(id, d);
      }
      ids.push_back(id++);
    }
    Dict g = new_dict();
    info.save_options(group.options(), g);
    g.insert("params", c10::List<int64_t>(ids));
    groups.push_back(g);
  }
  Dict out = new_dict();
  out.insert("state", state);
  out.insert("param_groups", groups);
  return out;
}

inline void load(torch::optim::Optimizer& opt, const optim::OptimizerInfo& info,
                 const c10::IValue& value, const std::string& path, bool adopt) {
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
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> options;
  std::vector<std::pair<at::TensorImpl*, std::unique_ptr<torch::optim::OptimizerParamState>>>
      states;
  struct Owner {
    at::Tensor param;
    std::size_t group;
  };
  std::unordered_map<int64_t, Owner> by_id;
  checkpoint::LoadPlan plan;  // into state tensors the optimizer has: run after every check
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const std::string gpath = join(join(path, "param_groups"), std::to_string(i));
    const Dict g = as_dict(groups[i], gpath);
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
    options.push_back(info.load_options(own[i].options(), DictReader(g, gpath)));
  }
  for (const auto& e : state) {
    const int64_t id = as_int(e.key(), join(path, "state"));
    const std::string spath = join(join(path, "state"), std::to_string(id));
    const auto owner = by_id.find(id);
    if (owner == by_id.end()) {
      fail(spath, "no parameter of the checkpoint's param_groups has this id");
    }
    const at::Tensor& param = owner->second.param;
    // The state this parameter has now: its tensors are reused where they fit (loaded into in
    // place), so a resume over a trained optimizer allocates nothing.
    std::optional<Dict> current;
    if (auto it = opt.state().find(param.unsafeGetTensorImpl());
        it != opt.state().end() && it->second) {
      current = new_dict();
      info.save_state(*it->second, *current);
    }
    states.emplace_back(param.unsafeGetTensorImpl(),
                        info.load_state(DictReader(as_dict(e.value(), spath), spath, param, adopt,
                                                   std::move(current), &plan),
                                        *options[owner->second.group]));
  }
  plan.run();
  for (std::size_t i = 0; i < own.size(); ++i) own[i].set_options(std::move(options[i]));
  opt.state().clear();
  for (auto& [key, s] : states) opt.state()[key] = std::move(s);
}

}  // namespace detail

/// `optimizer.state_dict()` as Python writes it (see the top of this file).
inline Dict optimizer_state(const torch::optim::Optimizer& optimizer,
                            std::string_view path = "optimizer") {
  return detail::save(optimizer, detail::checkpointable(optimizer, path));
}

/// Loads an optimizer_state(), or Python's optimizer.state_dict() (SGD, Adam, AdamW, fused
/// or not, or a registered optimizer's), into `optimizer`: every group's options are replaced by
/// the checkpoint's (as Python's load_state_dict does), each parameter's state is cast to its
/// parameter's dtype and device. Throws loom::Error naming the key at fault (another optimizer's
/// state, a group or parameter count that differs, a missing key, a shape mismatch, maximize=True
/// for a LibTorch optimizer, a parameter id named twice); then the optimizer is unchanged. `adopt`:
/// `state` was just read from a file and nothing else uses its tensors (what rt.load passes), so
/// those already in place are kept rather than copied; with the default the optimizer's state
/// tensors are always its own copies.
inline void load_optimizer_state(torch::optim::Optimizer& optimizer, const c10::IValue& state,
                                 const std::string& path = "optimizer", bool adopt = false) {
  detail::load(optimizer, detail::checkpointable(optimizer, path), state, path, adopt);
}

}  // namespace loom::state
