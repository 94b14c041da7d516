// loom::optim::SGD, Adam and AdamW against Python's torch.optim.X(..., fused=True), bitwise.
//
// tests/parity/optim_parity.py runs each case in Python (two param groups with their own
// options, 50 steps of fixed gradients, f32 and bf16 parameters) and writes the inputs and the
// final parameters and state as exact hex floats, each state tensor with Python's dtype and
// shape. This test replays the inputs through loom's optimizer, checks that each state tensor
// has Python's dtype and shape (f32 exp_avg for bf16 parameters would fail here), and compares
// every final parameter and state tensor bit for bit. Hidden ([.]):
// ctest runs it as optim.parity after optim.parity.generate, with LOOM_OPTIM_PARITY_FILE set.
#include "support/catch.hpp"
#include "support/fixture.hpp"

#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include <loom/optim/adam.hpp>
#include <loom/optim/sgd.hpp>

using loom::testing::bit_mismatches;
using loom::testing::dtype_name;
using loom::testing::dtype_of;
using loom::testing::make;
using loom::testing::Reader;

namespace {

using Options = std::map<std::string, std::vector<double>>;

Options read_group(Reader& in, const std::string& optimizer, int64_t index) {
  in.expect("group");
  REQUIRE(in.integer() == index);
  Options o;
  const std::vector<std::string> keys =
      optimizer == "SGD"
          ? std::vector<std::string>{"lr",           "momentum", "dampening",
                                     "weight_decay", "nesterov", "maximize"}
          : std::vector<std::string>{"lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"};
  for (const auto& k : keys) {
    in.expect(k);
    o[k] = in.numbers(k == "betas" ? 2 : 1);
  }
  return o;
}

std::unique_ptr<torch::optim::OptimizerOptions> make_options(const std::string& optimizer,
                                                             const Options& o) {
  auto at = [&](const char* k, std::size_t i = 0) { return o.at(k).at(i); };
  if (optimizer == "SGD") {
    return std::make_unique<loom::optim::SGDOptions>(loom::optim::SGDOptions(at("lr"))
                                                         .momentum(at("momentum"))
                                                         .dampening(at("dampening"))
                                                         .weight_decay(at("weight_decay"))
                                                         .nesterov(at("nesterov") != 0)
                                                         .maximize(at("maximize") != 0));
  }
  auto fill = [&](auto opts) {
    opts.betas({at("betas", 0), at("betas", 1)})
        .eps(at("eps"))
        .weight_decay(at("weight_decay"))
        .amsgrad(at("amsgrad") != 0)
        .maximize(at("maximize") != 0);
    return std::make_unique<decltype(opts)>(opts);
  };
  if (optimizer == "Adam") return fill(loom::optim::AdamOptions(at("lr")));
  return fill(loom::optim::AdamWOptions(at("lr")));
}

// The optimizer of `name` over two groups; the defaults are group 0's options (each group
// carries its own full options, so the defaults do not matter).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& name,
                                                        std::vector<at::Tensor> g0,
                                                        std::vector<at::Tensor> g1,
                                                        const Options& o0, const Options& o1) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::move(g0), make_options(name, o0));
  groups.emplace_back(std::move(g1), make_options(name, o1));
  if (name == "SGD") {
    auto d = static_cast<loom::optim::SGDOptions&>(*make_options(name, o0));
    return std::make_unique<loom::optim::SGD>(groups, d);
  }
  if (name == "Adam") {
    auto d = static_cast<loom::optim::AdamOptions&>(*make_options(name, o0));
    return std::make_unique<loom::optim::Adam>(groups, d);
  }
  auto d = static_cast<loom::optim::AdamWOptions&>(*make_options(name, o0));
  return std::make_unique<loom::optim::AdamW>(groups, d);
}

std::string shape_text(at::IntArrayRef shape) {  // "[4, 3]", "[]" for a 0-dim tensor
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    text += (i == 0 ? "" : ", ") + std::to_string(shape[i]);
  }
  return text + "]";
}

at::Tensor state_tensor(torch::optim::Optimizer& opt, const at::Tensor& p, const std::string& key) {
  auto it = opt.state().find(p.unsafeGetTensorImpl());
  if (it == opt.state().end()) return {};
  if (auto* s = dynamic_cast<loom::optim::SGDParamState*>(it->second.get())) {
    return key == "momentum_buffer" ? s->momentum_buffer() : at::Tensor();
  }
  auto* a = dynamic_cast<loom::optim::AdamParamState*>(it->second.get());
  REQUIRE(a != nullptr);
  if (key == "step") return a->step();
  if (key == "exp_avg") return a->exp_avg();
  if (key == "exp_avg_sq") return a->exp_avg_sq();
  return a->max_exp_avg_sq();
}

}  // namespace

TEST_CASE("loom's fused optimizers match torch.optim's fused=True bitwise over 50 steps",
          "[.][parity][optim]") {
  const char* path = std::getenv("LOOM_OPTIM_PARITY_FILE");
  if (path == nullptr) {
    FAIL(
        "LOOM_OPTIM_PARITY_FILE is not set; run this test through ctest (optim.parity), which "
        "generates the fixture first");
  }
  Reader in(path);
  in.expect("loom-optim-parity");
  REQUIRE(in.integer() == 2);  // 2: state tensors carry Python's dtype and shape
  in.expect("device");
  const c10::Device device(in.word());  // where Python ran: cpu, or cuda (gpu-check)
  in.expect("cases");
  const auto cases = in.integer();
  int64_t tensors = 0, equal = 0;
  for (int64_t c = 0; c < cases; ++c) {
    in.expect("case");
    const auto name = in.word();
    const auto optimizer = in.word();
    const auto dtype = in.word() == "bf16" ? at::kBFloat16 : at::kFloat;
    INFO("case " << name);
    std::vector<at::Tensor> params;
    for (int64_t i = 0; i < 3; ++i) {
      in.expect("param");
      REQUIRE(in.integer() == i);
      std::vector<int64_t> shape(static_cast<std::size_t>(in.integer()));
      int64_t numel = 1;
      for (auto& d : shape) numel *= (d = in.integer());
      params.push_back(make(in.numbers(numel), shape, dtype).to(device).requires_grad_());
    }
    const auto o0 = read_group(in, optimizer, 0);
    const auto o1 = read_group(in, optimizer, 1);
    auto opt = make_optimizer(optimizer, {params[0], params[1]}, {params[2]}, o0, o1);

    in.expect("steps");
    const auto steps = in.integer();
    for (int64_t step = 0; step < steps; ++step) {
      opt->zero_grad();
      for (std::size_t i = 0; i < params.size(); ++i) {
        in.expect("grad");
        REQUIRE(in.integer() == step);
        REQUIRE(in.integer() == static_cast<int64_t>(i));
        auto first = in.word();
        if (first == "none") continue;
        auto values = std::vector<double>{std::strtod(first.c_str(), nullptr)};
        for (auto v : in.numbers(params[i].numel() - 1)) values.push_back(v);
        params[i].mutable_grad() = make(values, params[i].sizes(), dtype).to(device).clone();
      }
      opt->step();
    }

    for (std::size_t i = 0; i < params.size(); ++i) {
      INFO("param " << i);
      in.expect("final");
      REQUIRE(in.integer() == static_cast<int64_t>(i));
      auto expected = make(in.numbers(params[i].numel()), params[i].sizes(), dtype);
      CHECK(params[i].device() == device);
      const auto bad_param = bit_mismatches(params[i], expected);
      CHECK(bad_param == 0);
      ++tensors;
      equal += bad_param == 0;
      const int n_keys = optimizer == "SGD" ? 1 : 4;
      for (int k = 0; k < n_keys; ++k) {
        in.expect("state");
        REQUIRE(in.integer() == static_cast<int64_t>(i));
        const auto key = in.word();
        INFO("state " << key);
        auto mine = state_tensor(*opt, params[i], key);
        const auto their_dtype = in.word();
        if (their_dtype == "none") {
          CHECK_FALSE(mine.defined());
          continue;
        }
        // Python's own dtype and shape, compared with loom's: not assumed from loom's tensor.
        std::vector<int64_t> their_shape(static_cast<std::size_t>(in.integer()));
        int64_t numel = 1;
        for (auto& d : their_shape) numel *= (d = in.integer());
        const auto values = in.numbers(numel);
        REQUIRE(mine.defined());
        ++tensors;
        CHECK(dtype_name(mine.scalar_type()) == their_dtype);
        CHECK(shape_text(mine.sizes()) == shape_text(their_shape));
        CHECK(mine.device() == device);
        if (dtype_name(mine.scalar_type()) != their_dtype || mine.sizes().vec() != their_shape) {
          continue;  // reported above; the bits of different dtypes or shapes do not compare
        }
        auto theirs = make(values, their_shape, dtype_of(their_dtype));
        const auto bad = bit_mismatches(mine, theirs);
        CHECK(bad == 0);
        equal += bad == 0;
      }
    }
    in.expect("end");
  }
  std::cout << "optim_parity: " << cases << " cases on " << device << ", " << equal << " of "
            << tensors
            << " final parameters and state tensors equal to torch.optim's (fused=True) in "
               "dtype, shape and bits\n";
}
