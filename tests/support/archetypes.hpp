#pragma once
// Minimal policies written without the Defaults bases: PrecisionArchetype<-1> and
// DeviceArchetype<-1> provide exactly the concept's rows; PrecisionArchetype<k> (k >= 0)
// lacks row k, so each requirement is shown to be necessary. The row enums are generated from
// the same lists as the concepts (detail/*_rows.hpp): a row added there and not here makes
// the <-1> archetypes fail their concept, so the two cannot drift apart.
#include <filesystem>
#include <ranges>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <loom/checkpoint/checkpoint_io.hpp>
#include <loom/concepts/checkpointable.hpp>
#include <loom/concepts/device_policy.hpp>
#include <loom/concepts/precision_policy.hpp>
#include <loom/concepts/strategy.hpp>
#include <loom/guards.hpp>
#include <loom/state_dict.hpp>

namespace loom::testing {

#define LOOM_TESTING_ROW_ENUM(prefix, row, text) prefix##row,
/// The PrecisionPolicy rows, Checkpointable's last: p_<row concept>.
enum PrecisionRow {
  LOOM_DETAIL_PRECISION_ROWS(LOOM_TESTING_ROW_ENUM, p_)
      LOOM_DETAIL_CHECKPOINTABLE_ROWS(LOOM_TESTING_ROW_ENUM, p_) p_rows
};
/// The DevicePolicy rows, Checkpointable's last: d_<row concept>.
enum DeviceRow {
  LOOM_DETAIL_DEVICE_ROWS(LOOM_TESTING_ROW_ENUM, d_)
      LOOM_DETAIL_CHECKPOINTABLE_ROWS(LOOM_TESTING_ROW_ENUM, d_) d_rows
};
/// The StrategyPolicy rows, Checkpointable's last: s_<row concept>.
enum StrategyRow {
  LOOM_DETAIL_STRATEGY_ROWS(LOOM_TESTING_ROW_ENUM, s_)
      LOOM_DETAIL_CHECKPOINTABLE_ROWS(LOOM_TESTING_ROW_ENUM, s_) s_rows
};
#undef LOOM_TESTING_ROW_ENUM

/// Lacks nothing for Missing < 0, else the row whose enumerator is Missing. The move row
/// (p_movable) is not switched off: a constrained move constructor is not portable to Clang 14.
template <int Missing>
struct PrecisionArchetype {
  static constexpr std::string_view precision() requires(Missing != p_precision_has_name) {
    return "arch";
  }
  void bind_device(c10::Device) requires(Missing != p_precision_has_bind_device) {}
  NullGuard forward_context(c10::DeviceType) requires(Missing != p_precision_has_forward_context) {
    return {};
  }
  NullGuard tensor_init_context() requires(Missing != p_precision_has_tensor_init_context) {
    return {};
  }
  NullGuard module_init_context() requires(Missing != p_precision_has_module_init_context) {
    return {};
  }
  void convert_module(torch::nn::Module&) requires(Missing != p_precision_has_convert_module) {}
  at::Tensor convert_input(const at::Tensor& t) requires(Missing != p_precision_has_convert_input) {
    return t;
  }
  at::Tensor convert_output(const at::Tensor& t) requires(Missing !=
                                                          p_precision_has_convert_output) {
    return t;
  }
  at::Tensor pre_backward(const at::Tensor& t,
                          torch::nn::Module&) requires(Missing != p_precision_has_pre_backward) {
    return t;
  }
  void backward(const at::Tensor& t,
                torch::nn::Module&) requires(Missing != p_precision_has_backward) {
    t.backward();
  }
  at::Tensor post_backward(const at::Tensor& t,
                           torch::nn::Module&) requires(Missing != p_precision_has_post_backward) {
    return t;
  }
  at::Tensor max_reduced_before_step() requires(Missing !=
                                                p_precision_has_max_reduced_before_step) {
    return {};
  }
  bool optimizer_step(torch::optim::Optimizer&) requires(Missing !=
                                                         p_precision_has_optimizer_step) {
    return true;
  }
  std::vector<StepResult> optimizer_steps(Optimizers os) requires(Missing !=
                                                                  p_precision_has_optimizer_steps) {
    return std::vector<StepResult>(os.size());
  }
  std::vector<at::Tensor> main_params(torch::optim::Optimizer&) requires(
      Missing != p_precision_has_main_params) {
    return {};
  }
  void unscale_gradients(torch::optim::Optimizer&) requires(Missing !=
                                                            p_precision_has_unscale_gradients) {}
  GradNorm clip_gradients(torch::optim::Optimizer&, double, precision::ClipAlgorithm,
                          double) requires(Missing != p_precision_has_clip_gradients) {
    return GradNorm(0.0);
  }
  double loss_scale() const requires(Missing != p_precision_has_loss_scale) { return 1.0; }
  StateDict state_dict() const requires(Missing != p_has_state_dict) { return {}; }
  void load_state_dict(const StateDict&) requires(Missing != p_has_load_state_dict) {}
  void teardown() requires(Missing != p_has_teardown) {}
};

/// Lacks nothing for Missing < 0, else the row whose enumerator is Missing (not d_movable).
template <int Missing>
struct DeviceArchetype {
  static constexpr c10::DeviceType device_type() requires(Missing != d_device_has_device_type) {
    return c10::kCPU;
  }
  static constexpr std::string_view name() requires(Missing != d_device_has_name) { return "arch"; }
  static constexpr std::string_view ddp_backend() requires(Missing != d_device_has_ddp_backend) {
    return "gloo";
  }
  c10::Device device() const requires(Missing != d_device_has_device) {
    return c10::Device(c10::kCPU);
  }
  void prepare() requires(Missing != d_device_has_prepare) {}
  void module_to_device(torch::nn::Module&) requires(Missing != d_device_has_module_to_device) {}
  at::Tensor tensor_to_device(const at::Tensor& t) const
      requires(Missing != d_device_has_tensor_to_device) {
    return t;
  }
  torch::optim::Optimizer& optimizer_to_device(torch::optim::Optimizer& o) requires(
      Missing != d_device_has_optimizer_to_device) {
    return o;
  }
  template <class Source, class Fn>
  std::vector<at::Tensor> dataloader_to_device(Source&,
                                               Fn) requires(Missing !=
                                                            d_device_has_dataloader_to_device) {
    return {};
  }
  template <class P>
  auto precision_context(P& p) const requires(Missing != d_device_has_precision_context) {
    return p.forward_context(c10::kCPU);
  }
  StateDict state_dict() const requires(Missing != d_has_state_dict) { return {}; }
  void load_state_dict(const StateDict&) requires(Missing != d_has_load_state_dict) {}
  void teardown() requires(Missing != d_has_teardown) {}
};

/// Lacks nothing for Missing < 0, else the row whose enumerator is Missing (not s_movable).
template <int Missing>
struct StrategyArchetype {
  static constexpr std::string_view strategy() requires(Missing != s_strategy_has_name) {
    return "arch";
  }
  void setup(torch::nn::Module&, c10::Device,
             std::string_view) requires(Missing != s_strategy_has_setup) {}
  void pre_forward() requires(Missing != s_strategy_has_pre_forward) {}
  template <class Step>
  void backward(const at::Tensor&, Step&& step) requires(Missing != s_strategy_has_backward) {
    step();
  }
  NullGuard no_sync() requires(Missing != s_strategy_has_no_sync) { return {}; }
  int rank() const requires(Missing != s_strategy_has_rank) { return 0; }
  int world_size() const requires(Missing != s_strategy_has_world_size) { return 1; }
  int local_rank() const requires(Missing != s_strategy_has_local_rank) { return 0; }
  int node_rank() const requires(Missing != s_strategy_has_node_rank) { return 0; }
  bool is_global_zero() const requires(Missing != s_strategy_has_is_global_zero) { return true; }
  void barrier() requires(Missing != s_strategy_has_barrier) {}
  void barrier(std::string_view) requires(Missing != s_strategy_has_named_barrier) {}
  void all_reduce(at::Tensor&, dist::ReduceOp) requires(Missing != s_strategy_has_all_reduce) {}
  void broadcast(at::Tensor&, int) requires(Missing != s_strategy_has_broadcast) {}
  std::vector<at::Tensor> all_gather(const at::Tensor& t) requires(Missing !=
                                                                   s_strategy_has_all_gather) {
    return {t};
  }
  std::string broadcast_object(const std::string& v,
                               int) requires(Missing != s_strategy_has_broadcast_object) {
    return v;
  }
  StateDict broadcast_object(const StateDict& v,
                             int) requires(Missing != s_strategy_has_broadcast_object) {
    return v;
  }
  void agree(const std::string&, const std::string&) requires(Missing != s_strategy_has_agree) {}
  template <class Unscale, class Step>
  auto optimizer_step(Optimizers, Unscale&&,
                      Step&& step) requires(Missing != s_strategy_has_optimizer_step) {
    return step();
  }
  template <class Clip>
  GradNorm clip_gradients(torch::optim::Optimizer&, double max_norm, double,
                          Clip&& clip) requires(Missing != s_strategy_has_clip_gradients) {
    return clip(max_norm);
  }
  void save_checkpoint(
      const std::filesystem::path& p, const State& state,
      const checkpoint::CheckpointIO& io) requires(Missing != s_strategy_has_save_checkpoint) {
    io.save(p, c10::IValue(state::save_entries(state)));
  }
  c10::IValue load_checkpoint(const std::filesystem::path& p, const State&,
                              const checkpoint::CheckpointIO& io,
                              c10::Device d) requires(Missing != s_strategy_has_load_checkpoint) {
    return io.load(p, d);
  }
  StateDict state_dict() const requires(Missing != s_has_state_dict) { return {}; }
  void load_state_dict(const StateDict&) requires(Missing != s_has_load_state_dict) {}
  void teardown() requires(Missing != s_has_teardown) {}
};

}  // namespace loom::testing
