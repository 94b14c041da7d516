// loom::cuda::GraphedStep (cuda/graphed_step.hpp): the capture, the replays and the CPU's eager
// steps.
#include <loom/cuda/graphed_step.hpp>

#include <exception>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/record_function.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <loom/detail/message_of.hpp>
#include <loom/error.hpp>

namespace loom::cuda {

namespace {

[[noreturn]] void fail(const std::string& what) { throw Error("loom::cuda::GraphedStep: " + what); }

std::string shape_of(const at::Tensor& t) { return c10::str(t.sizes(), " ", t.scalar_type()); }

/// The ATen ops in flight on this thread while alive; when an exception unwinds through them,
/// the stack as it was when it was thrown (the innermost op last).
class OpsInFlight {
 public:
  OpsInFlight() {
    stack() = {};
    failed() = {};
    handle_ = at::addThreadLocalCallback(
        at::RecordFunctionCallback(
            [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
              stack().emplace_back(fn.name());
              return nullptr;
            },
            [](const at::RecordFunction&, at::ObserverContext*) {
              if (std::uncaught_exceptions() > 0 && failed().empty()) failed() = stack();
              if (!stack().empty()) stack().pop_back();
            })
            .scopes({at::RecordScope::FUNCTION}));
  }
  ~OpsInFlight() { at::removeCallback(handle_); }
  OpsInFlight(const OpsInFlight&) = delete;
  OpsInFlight& operator=(const OpsInFlight&) = delete;

  /// "aten::item (in aten::foo)", or "" when no op was in flight.
  static std::string describe() {
    const auto& ops = failed().empty() ? stack() : failed();
    if (ops.empty()) return "";
    std::string s = ops.back();
    if (ops.size() > 1) s += " (in " + ops.front() + ")";
    return s;
  }

 private:
  static std::vector<std::string>& stack() {
    thread_local std::vector<std::string> s;
    return s;
  }
  static std::vector<std::string>& failed() {
    thread_local std::vector<std::string> s;
    return s;
  }
  at::CallbackHandle handle_;
};

/// Autocast's cache of weight casts off while alive (Python's advice for capture: a cast
/// cached outside the graph would be read inside it).
class NoAutocastCache {
 public:
  NoAutocastCache() : was_(at::autocast::is_autocast_cache_enabled()) {
    at::autocast::set_autocast_cache_enabled(false);
  }
  ~NoAutocastCache() { at::autocast::set_autocast_cache_enabled(was_); }
  NoAutocastCache(const NoAutocastCache&) = delete;
  NoAutocastCache& operator=(const NoAutocastCache&) = delete;

 private:
  bool was_;
};

}  // namespace

struct GraphedStep::Impl {
  std::vector<at::Tensor> inputs;
  std::vector<optim::FusedOptimizer*> optimizers;
  Step step;
  GraphedStepOptions options;
  c10::Device device{c10::kCPU};
  std::int64_t steps = 0;
  at::Tensor output;
  std::unique_ptr<at::cuda::CUDAGraph> graph;

  void zero_grads() {
    for (auto* o : optimizers) o->zero_grad(/*set_to_none=*/true);
  }

  void eager() {
    zero_grads();
    output = step(inputs);
  }

  // A step on a side stream that waits for the current one (the batch's copy), which then
  // waits for it: Python's warm-up and capture streams.
  template <class F>
  void on_side_stream(F&& f) {
    auto current = c10::cuda::getCurrentCUDAStream(device.index());
    auto side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
    at::cuda::CUDAEvent ready;
    ready.record(current);
    ready.block(side);
    {
      c10::cuda::CUDAStreamGuard guard(side);
      f();
    }
    at::cuda::CUDAEvent done;
    done.record(side);
    done.block(current);
  }

  void capture() {
    for (auto* o : optimizers) o->prepare_lr_tensors();
    for (auto* o : optimizers) o->update_lr_tensors();
    zero_grads();
    c10::cuda::device_synchronize();
    auto g = std::make_unique<at::cuda::CUDAGraph>();
    std::exception_ptr error;
    std::string op;
    on_side_stream([&] {
      NoAutocastCache no_cache;
      g->capture_begin();
      try {
        OpsInFlight ops;
        try {
          output = step(inputs);
        } catch (...) {
          op = OpsInFlight::describe();
          throw;
        }
      } catch (...) {
        error = std::current_exception();
      }
      if (error) {
        try {
          g->capture_end();  // ends the invalidated capture; its own error is the same one
        } catch (...) {
        }
        return;
      }
      g->capture_end();
    });
    if (error) {
      fail("the step could not be captured as a CUDA graph" +
           (op.empty() ? std::string()
                       : ": " + op +
                             " synchronizes with the host or is not "
                             "allowed during capture") +
           " (" + detail::message_of(error) +
           "). A captured step reads nothing on the host: use loom::optim's fused "
           "optimizers, rt.clip_gradients, and no .item() in the step");
    }
    graph = std::move(g);
  }
};

GraphedStep::GraphedStep(int world_size, std::vector<at::Tensor> inputs,
                         std::vector<OptimizerRef> optimizers, Step step,
                         GraphedStepOptions options)
    : impl_(std::make_unique<Impl>()) {
  if (world_size != 1) {
    fail(
        "one process only (a Ddp step's all-reduces are launched by the reducer's hooks, "
        "which a replayed graph would not run); this runtime has " +
        std::to_string(world_size) + " ranks");
  }
  if (inputs.empty()) fail("no static inputs given");
  if (!step) fail("no step given");
  if (options.warmup_steps < 1) {
    fail(
        "warmup_steps must be at least 1 (the optimizer state and the scaler's tensors must "
        "exist before the capture), got " +
        std::to_string(options.warmup_steps));
  }
  const c10::Device device = inputs.front().device();
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) fail("static input " + std::to_string(i) + " is undefined");
    if (inputs[i].device() != device) {
      fail("static input " + std::to_string(i) + " is on " + inputs[i].device().str() +
           ", input 0 on " + device.str() + ": all on the runtime's device");
    }
  }
  if (!device.is_cpu() && !device.is_cuda()) fail("runs on the CPU or CUDA, not " + device.str());
  if (optimizers.empty()) fail("no optimizers given");
  for (std::size_t i = 0; i < optimizers.size(); ++i) {
    auto* fused = dynamic_cast<optim::FusedOptimizer*>(&optimizers[i].get());
    if (fused == nullptr) {
      fail("optimizer " + std::to_string(i) +
           " is not one of loom::optim's fused optimizers (SGD, Adam, AdamW): its step "
           "reads the learning rate on the host, which a CUDA graph would freeze at its "
           "captured value");
    }
    fused->set_tensor_lr(true);
    impl_->optimizers.push_back(fused);
  }
  impl_->inputs = std::move(inputs);
  impl_->step = std::move(step);
  impl_->options = options;
  impl_->device = device;
}

GraphedStep::~GraphedStep() = default;
GraphedStep::GraphedStep(GraphedStep&&) noexcept = default;
GraphedStep& GraphedStep::operator=(GraphedStep&&) noexcept = default;

const at::Tensor& GraphedStep::operator()(const std::vector<at::Tensor>& batch) {
  auto& s = *impl_;
  if (batch.size() != s.inputs.size()) {
    fail("the batch has " + std::to_string(batch.size()) + " tensors, the static inputs " +
         std::to_string(s.inputs.size()));
  }
  {
    at::NoGradGuard no_grad;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      if (batch[i].sizes() != s.inputs[i].sizes() ||
          batch[i].scalar_type() != s.inputs[i].scalar_type()) {
        fail("batch tensor " + std::to_string(i) + " is " + shape_of(batch[i]) +
             ", its static input " + shape_of(s.inputs[i]) + " (a graph replays fixed shapes)");
      }
      if (!batch[i].is_same(s.inputs[i])) s.inputs[i].copy_(batch[i], /*non_blocking=*/true);
    }
    for (auto* o : s.optimizers) o->update_lr_tensors();  // outside any graph
  }
  if (s.device.is_cpu()) {
    s.eager();
  } else {
    c10::cuda::CUDAGuard guard(s.device);
    if (s.graph) {
      s.graph->replay();
    } else if (s.steps < s.options.warmup_steps) {
      s.on_side_stream([&] { s.eager(); });
    } else {
      s.capture();
      s.graph->replay();
    }
  }
  ++s.steps;
  return s.output;
}

bool GraphedStep::captured() const noexcept { return impl_->graph != nullptr; }
std::int64_t GraphedStep::steps() const noexcept { return impl_->steps; }
const std::vector<at::Tensor>& GraphedStep::inputs() const noexcept { return impl_->inputs; }

}  // namespace loom::cuda
