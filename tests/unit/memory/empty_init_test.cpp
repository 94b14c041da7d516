// loom::EmptyInit: modules built on the meta device, given memory by rt.setup and values by
// rt.load or rt.reset_parameters; forward refuses to run without them.
#include "support/catch.hpp"
#include "support/warnings.hpp"

#include <unistd.h>
#include <filesystem>
#include <string>

#include <ATen/ATen.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/optim/sgd.h>

#include <loom/checkpoint/io.hpp>
#include <loom/checkpoint/mapped.hpp>
#include <loom/loom.hpp>
#include <loom/nn/empty_init.hpp>

using Catch::Matchers::Contains;

namespace {

namespace fs = std::filesystem;

/// Linear, LayerNorm and BatchNorm1d: each kind of initialization (random, constant, running
/// statistics). Built in registration order.
torch::nn::Sequential make_model() {
  torch::nn::Sequential model;
  model->push_back(torch::nn::Linear(6, 8));
  model->push_back(torch::nn::LayerNorm(torch::nn::LayerNormOptions({8})));
  model->push_back(torch::nn::BatchNorm1d(8));
  model->push_back(torch::nn::Linear(8, 2));
  return model;
}

/// A layer no initializer knows: a parameter of its own.
struct ScaleImpl : torch::nn::Module {
  ScaleImpl() { scale = register_parameter("scale", torch::empty({4})); }
  at::Tensor forward(const at::Tensor& x) { return x * scale; }
  at::Tensor scale;
};
TORCH_MODULE(Scale);

void check_equal(torch::nn::Module& a, torch::nn::Module& b) {
  const auto pa = a.named_parameters(), pb = b.named_parameters();
  REQUIRE(pa.size() == pb.size());
  for (const auto& item : pa) CHECK(at::equal(item.value(), pb[item.key()]));
  const auto ba = a.named_buffers(), bb = b.named_buffers();
  REQUIRE(ba.size() == bb.size());
  for (const auto& item : ba) CHECK(at::equal(item.value(), bb[item.key()]));
}

}  // namespace

TEST_CASE("A module built under EmptyInit has no memory; setup gives it, load its values",
          "[empty_init]") {
  torch::nn::Sequential model{nullptr};
  {
    loom::EmptyInit empty;
    model = make_model();
    CHECK(at::empty({2}).is_meta());  // every factory, inside the scope
  }
  CHECK_FALSE(at::empty({2}).is_meta());  // and none after it
  for (const auto& p : model->parameters()) CHECK(p.is_meta());
  CHECK(loom::nn::has_meta_tensors(*model));
  torch::optim::SGD opt(model->parameters(), 0.1);  // over the meta parameters

  torch::manual_seed(5);
  auto reference = make_model();
  const fs::path file =
      fs::temp_directory_path() / ("loom_empty_" + std::to_string(::getpid()) + ".pt");
  loom::Runtime<loom::Cpu, loom::Fp32> saver;
  saver.setup(reference);
  saver.save(file, loom::State{{"model", reference}});

  loom::Runtime<loom::Cpu, loom::Fp32> rt;
  rt.setup(model, opt);
  CHECK_FALSE(loom::nn::has_meta_tensors(*model));
  for (const auto& p : model->parameters()) CHECK(p.device().is_cpu());
  const auto x = torch::randn({3, 6});
  CHECK_THROWS_WITH(rt.forward(model, x),
                    Contains("built under loom::EmptyInit and holds no values yet") &&
                        Contains("rt.reset_parameters(model)"));
  rt.load(file, loom::State{{"model", model}}, loom::LoadOptions{.keep_mapped = true});
  check_equal(*model, *reference);
  // Its memory held nothing: the parameters and buffers keep the file's pages (copy-on-write).
  for (const auto& p : model->parameters()) CHECK(loom::checkpoint::is_mapped(p));
  for (const auto& b : model->buffers()) CHECK(loom::checkpoint::is_mapped(b));
  // The optimizer built over the meta tensors steps the real ones; the file stays as it was.
  const at::Tensor before = model->parameters()[0].detach().clone();
  opt.zero_grad();
  rt.backward(rt.forward(model, x).square().sum(), model);
  rt.optimizer_step(opt);
  CHECK_FALSE(at::equal(before, model->parameters()[0]));
  const auto saved = loom::checkpoint::load_value(file).toGenericDict().at("model").toGenericDict();
  CHECK(at::equal(saved.at("0.weight").toTensor(), reference->parameters()[0]));

  SECTION("by default the load copies into the memory setup gave") {
    torch::nn::Sequential copied{nullptr};
    {
      loom::EmptyInit empty;
      copied = make_model();
    }
    loom::Runtime<loom::Cpu, loom::Fp32> rt2;
    rt2.setup(copied);
    rt2.load(file, loom::State{{"model", copied}});
    check_equal(*copied, *reference);
    for (const auto& p : copied->parameters()) CHECK_FALSE(loom::checkpoint::is_mapped(p));
  }
  SECTION("a module built normally is copied into: its memory is its own") {
    auto built = make_model();
    loom::Runtime<loom::Cpu, loom::Fp32> rt2;
    rt2.setup(built);
    rt2.load(file, loom::State{{"model", built}}, loom::LoadOptions{.keep_mapped = true});
    check_equal(*built, *reference);
    for (const auto& p : built->parameters()) CHECK_FALSE(loom::checkpoint::is_mapped(p));
  }
  fs::remove(file);
}

TEST_CASE("Two tensors a file stores on one storage are kept apart when mapped", "[empty_init]") {
  // A file where two parameters are views of one storage (saved from a model that tied them):
  // the module built under EmptyInit keeps them apart, one on the file's pages, one copied.
  torch::manual_seed(3);
  auto tied = torch::nn::Linear(4, 4);
  auto other = torch::nn::Linear(4, 4);
  other->weight.set_data(tied->weight.data());  // one storage
  torch::nn::Sequential reference(tied, other);
  const fs::path file =
      fs::temp_directory_path() / ("loom_empty_tied_" + std::to_string(::getpid()) + ".pt");
  auto top = loom::state::new_dict();
  top.insert("model", loom::state::module_state(*reference));
  loom::checkpoint::save_value(file, c10::IValue(top));
  torch::nn::Sequential model{nullptr};
  {
    loom::EmptyInit empty;
    model = torch::nn::Sequential(torch::nn::Linear(4, 4), torch::nn::Linear(4, 4));
  }
  loom::Runtime<loom::Cpu, loom::Fp32> rt;
  rt.setup(model);
  rt.load(file, loom::State{{"model", model}}, loom::LoadOptions{.keep_mapped = true});
  fs::remove(file);
  check_equal(*model, *reference);
  const auto w0 = model->named_parameters()["0.weight"];
  const auto w1 = model->named_parameters()["1.weight"];
  CHECK(loom::checkpoint::is_mapped(w0) != loom::checkpoint::is_mapped(w1));
  CHECK_FALSE(w0.storage().is_alias_of(w1.storage()));
  w0.detach().add_(1);
  CHECK(at::equal(w1, reference->named_parameters()["1.weight"]));
}

TEST_CASE("reset_parameters gives the values of the seeded build; an unknown module is named",
          "[empty_init]") {
  torch::manual_seed(11);
  auto reference = make_model();
  torch::nn::Sequential model{nullptr};
  {
    loom::EmptyInit empty;
    model = make_model();
  }
  loom::Runtime<loom::Cpu, loom::Fp32> rt;
  rt.setup(model);
  torch::manual_seed(11);
  rt.reset_parameters(model);
  check_equal(*model, *reference);
  CHECK(rt.forward(model, torch::randn({3, 6})).sizes() == at::IntArrayRef{3, 2});

  torch::nn::Sequential custom{nullptr};
  {
    loom::EmptyInit empty;
    custom = torch::nn::Sequential(torch::nn::Linear(4, 4), Scale());
  }
  loom::Runtime<loom::Cpu, loom::Fp32> rt2;
  rt2.setup(custom);
  CHECK_THROWS_WITH(rt2.reset_parameters(custom),
                    Contains("no initializer knows the module(s) '1' (") && Contains("ScaleImpl)"));
  CHECK_THROWS_WITH(rt2.forward(custom, torch::randn({2, 4})), Contains("holds no values yet"));
  rt2.reset_parameters(custom, [](torch::nn::Module& m) {
    if (auto* scale = dynamic_cast<ScaleImpl*>(&m)) {
      scale->scale.fill_(2.0);
      return true;
    }
    return loom::nn::reset_parameters(m);
  });
  CHECK(at::equal(custom[1]->as<ScaleImpl>()->scale, at::full({4}, 2.0)));
  CHECK_NOTHROW(rt2.forward(custom, torch::randn({2, 4})));
}
