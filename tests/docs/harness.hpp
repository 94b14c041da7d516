#pragma once
// What the C++ blocks of loom's pages may take for granted (tests/docs/extract_blocks.py).
//
// A page's block is compiled in a function of its own, with <torch/torch.h>, <loom/loom.hpp>
// and the standard headers below included (and the includes of every block of its page, which
// go to the top of the page's file): another header it needs it includes itself. The
// objects a page leaves undeclared (a model, an optimizer, the runtime, a loss...) are the
// names of loom_doc::values: a block that uses such a name without declaring it gets a
// reference to an object of that type (the marker <!-- doc-block: NAME=VALUE --> gives it
// another one, such as rt=ddp_rt). A block that quotes a file (its first line `// <path>`)
// also gets the names of loom_doc::types, which that file has from its own using-declarations.
// The functions a page leaves to the reader are loom_doc::functions. The blocks are compiled
// and linked, never run: every value and function here aborts.
//
// The extractor reads the aliases of loom_doc::values and loom_doc::types; `// needs: LIB`
// after one says that a block using it needs loom::LIB to link.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include <loom/loom.hpp>
#include <loom/state/checkpoints.hpp>  // for `ckpt`

namespace loom_doc {

/// Never returns: the blocks are compiled and linked, not run.
[[noreturn]] inline void unreachable() { std::abort(); }

/// The object a block uses under a loom_doc::values name.
template <class T>
T& value() {
  unreachable();
}

/// Called once by each compiled block at start-up; tests/docs/main.cpp lists them.
bool register_block(const char* page, int line, const char* digest);

/// A map-style dataset of (image, label) examples, as a page's `dataset`.
struct Samples : torch::data::datasets::Dataset<Samples> {
  torch::data::Example<> get(std::size_t) override { unreachable(); }
  std::optional<std::size_t> size() const override { unreachable(); }
};
using Dataset = torch::data::datasets::MapDataset<Samples, torch::data::transforms::Stack<>>;
using Loader = decltype(torch::data::make_data_loader(std::declval<Dataset>(), std::size_t{64}));

/// A module whose forward takes two tensors (an attention block and its mask).
struct AttentionImpl : torch::nn::Module {
  at::Tensor forward(const at::Tensor& q, const at::Tensor& mask) { return q + mask; }
};
TORCH_MODULE(Attention);

/// A generic `fn` for loom::with_runtime: one result type for every runtime.
struct Fn {
  template <class Runtime>
  int operator()(Runtime&) const {
    unreachable();
  }
};

/// The quick start's command-line options (examples/00_quickstart/main.cpp).
struct Options {
  std::string device = "cpu";
  std::string precision = "32-true";
};

}  // namespace loom_doc

namespace loom_doc::values {
using rt = loom::Runtime<loom::Cpu, loom::Fp16Mixed>;
using ddp_rt = loom::Runtime<loom::Cpu, loom::Fp32, loom::Ddp>;  // needs: dist
using model = torch::nn::Sequential;
using linear = torch::nn::Linear;
using block = torch::nn::Linear;
using attn = Attention;
using optimizer = loom::optim::AdamW;
using opt = loom::optim::AdamW;
using sgd = loom::optim::SGD;
using adamw = loom::optim::AdamW;
using scaler = loom::amp::GradScaler;
using sched = loom::optim::WarmupCosineLR;
using schedule = loom::optim::WarmupCosineLR;
using sampler = loom::DistributedSampler;
using state = loom::State;
using ckpt = loom::Checkpoints;
using dataset = Dataset;
using loader = Loader;
using batches = std::vector<std::pair<at::Tensor, at::Tensor>>;
using my_uneven_shard = std::vector<torch::data::Example<>>;
using loss = at::Tensor;
using x = at::Tensor;
using y = at::Tensor;
using w = at::Tensor;
using q = at::Tensor;
using mask = at::Tensor;
using weight = at::Tensor;
using bias = at::Tensor;
using loss_sum = at::Tensor;
using correct = at::Tensor;
using cuda = at::TensorOptions;
using n = std::size_t;
using dataset_size = std::size_t;
using k = std::int64_t;
using steps = std::int64_t;
using epochs = std::uint64_t;  // as DistributedSampler::epoch()
using total_steps = std::int64_t;
using epoch = std::int64_t;
using batch_size = std::int64_t;
using tokens = std::int64_t;
using n_params = std::int64_t;
using seq_len = std::int64_t;
using world = std::int64_t;
using loss_value = double;
using resume = bool;
using log_this_step = bool;
using dir = std::filesystem::path;
using path = std::filesystem::path;
using device_flag = std::string;
using precision_flag = std::string;
using fn = Fn;
using o = Options;
using calls = int;
}  // namespace loom_doc::values

namespace loom_doc::types {
using Stage = loom::amp::GradScaler::Stage;  // tests/unit/amp/grad_scaler_test.cpp
using Fp32 = loom::precision::Fp32;          // tests/unit/device/cuda_select_test.cpp
}  // namespace loom_doc::types

namespace loom_doc::functions {
inline torch::nn::Sequential make_model() { unreachable(); }
inline at::Tensor loss_fn(const at::Tensor&, const at::Tensor&) { unreachable(); }
inline at::Tensor loss_of(const at::Tensor&, const at::Tensor&) { unreachable(); }
inline void prepare_cache(const std::filesystem::path&) { unreachable(); }
inline void evaluate(torch::nn::Sequential&) { unreachable(); }
template <class Runtime>
double train_and_evaluate(Runtime&, const Options&) {
  unreachable();
}
}  // namespace loom_doc::functions

// examples/07_custom_optimizer's optimizer, which docs/optim.md's quote registers.
struct LionOptions : torch::optim::OptimizerCloneableOptions<LionOptions> {
  using Betas = std::tuple<double, double>;
  LionOptions(double lr = 1e-4) : lr_(lr) {}  // NOLINT: implicit, as LibTorch's options
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }

  TORCH_ARG(double, lr);
  TORCH_ARG(Betas, betas) = std::make_tuple(0.9, 0.99);
  TORCH_ARG(double, weight_decay) = 0.0;
};
struct LionParamState : torch::optim::OptimizerCloneableParamState<LionParamState> {
  TORCH_ARG(at::Tensor, exp_avg);
};
class Lion : public torch::optim::Optimizer {
 public:
  Lion(std::vector<at::Tensor> params, LionOptions defaults)
      : torch::optim::Optimizer({torch::optim::OptimizerParamGroup(std::move(params))},
                                std::make_unique<LionOptions>(defaults)) {}
  using torch::optim::Optimizer::step;
  at::Tensor step(LossClosure) override { loom_doc::unreachable(); }
};
