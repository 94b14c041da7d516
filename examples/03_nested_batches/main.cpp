// Extension point: nested batches, and user structs opted in to them.
//
//   nested_batches [--device cpu] [--precision bf16-mixed]
//
// rt.to_device(batch) and rt.forward(model, batch...) walk any nesting of tensors, tuples,
// pairs, std::vector, std::optional, std::variant and std::map, and a user struct once it is
// adapted with BOOST_HANA_ADAPT_STRUCT. A member type that holds no tensors is marked
// loom::opaque<T> and passed through untouched. The precision then casts every floating leaf
// (bf16 under bf16-mixed) and leaves integer leaves (labels, ids) alone.
// Prints each leaf's dtype before the forward, inside it and after it, then runs one
// training step on the same batches.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/sgd.h>
#include <CLI/CLI.hpp>

#include <loom/loom.hpp>

namespace nested {

/// Where a sample came from: no tensors inside, so the walker must not look into it.
struct Origin {
  std::string file;
  int64_t row = 0;
};

/// A user batch type: two tensors and an opaque member.
struct Sample {
  at::Tensor image;  // (B, 1, 2, 4) f32
  at::Tensor ids;    // (B, 4) i64
  Origin origin;
};

}  // namespace nested

// Opting in: the walker visits image, ids and origin (which it then passes through).
BOOST_HANA_ADAPT_STRUCT(nested::Sample, image, ids, origin);
template <>
struct loom::opaque<nested::Origin> : std::true_type {};

namespace nested {

using Pair = std::tuple<at::Tensor, at::Tensor>;     // features (B, 8) f32, labels (B,) i64
using Features = std::map<std::string, at::Tensor>;  // dense (B, 8) f32, token_ids (B, 4) i64
using Weights = std::optional<at::Tensor>;           // per-token weights (B, 4) f32, or none

struct Options {
  std::string device = "cpu";
  std::string precision = "bf16-mixed";
};

/// One printed row: where the leaf is and its dtype at each stage.
void row(const char* leaf, const std::string& before, const std::string& inside) {
  std::printf("  %-18s %-9s -> %s\n", leaf, before.c_str(), inside.c_str());
}
std::string dtype(const at::Tensor& t) { return c10::toString(t.scalar_type()); }
std::string dtype(const Weights& w) { return w ? dtype(*w) : "absent"; }

/// Embeds token ids, mixes them with the dense features, classifies into three classes.
struct NetImpl : torch::nn::Module {
  torch::nn::Embedding embed{register_module("embed", torch::nn::Embedding(100, 8))};
  torch::nn::Linear hidden{register_module("hidden", torch::nn::Linear(8, 8))};
  torch::nn::Linear head{register_module("head", torch::nn::Linear(8, 3))};
};
TORCH_MODULE(Net);

template <class RT>
int run(RT& rt) {
  constexpr int64_t B = 16;
  Net net;
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
  rt.setup(net, opt);

  // Built on the host, as a data pipeline would; to_device moves every tensor leaf at once.
  auto pair = rt.to_device(Pair(torch::randn({B, 8}), torch::randint(0, 3, {B})));
  auto features = rt.to_device(
      Features{{"dense", torch::randn({B, 8})}, {"token_ids", torch::randint(0, 100, {B, 4})}});
  auto weights = rt.to_device(Weights(torch::rand({B, 4})));
  auto sample = rt.to_device(
      Sample{torch::randn({B, 1, 2, 4}), torch::randint(0, 100, {B, 4}), {"generated", 7}});
  std::printf("%s on %s: batches on %s\n", std::string(RT::precision_name()).c_str(),
              std::string(rt.device().name()).c_str(), std::get<0>(pair).device().str().c_str());

  // The model takes all four batches; it records what its arguments look like inside the
  // forward context, after convert_input.
  std::map<std::string, std::string> seen;
  auto model = [&](const Pair& p, const Features& f, const Weights& w, const Sample& s) {
    seen = {{"pair.features", dtype(std::get<0>(p))},
            {"pair.labels", dtype(std::get<1>(p))},
            {"map.dense", dtype(f.at("dense"))},
            {"map.token_ids", dtype(f.at("token_ids"))},
            {"optional.weights", dtype(w)},
            {"struct.image", dtype(s.image)},
            {"struct.ids", dtype(s.ids)}};
    auto tokens = net->embed(s.ids) + net->embed(f.at("token_ids"));        // (B, 4, 8)
    auto token_weights = w ? w->unsqueeze(-1) : at::ones_like(tokens);      // (B, 4, 1|8)
    auto pooled = (tokens * token_weights).mean(1);                         // (B, 8)
    auto x = std::get<0>(p) + f.at("dense") + s.image.flatten(1) + pooled;  // (B, 8)
    auto logits = net->head(torch::nn::functional::relu(net->hidden(x)));   // (B, 3)
    auto pred = logits.argmax(1);                                           // (B,) i64
    seen["output.logits"] = dtype(logits);
    seen["output.pred"] = dtype(pred);
    return Features{{"logits", logits}, {"pred", pred}};
  };

  auto out = rt.forward(model, pair, features, weights, sample);  // after convert_output
  row("leaf", "before", "inside forward");
  row("pair.features", dtype(std::get<0>(pair)), seen["pair.features"]);
  row("pair.labels", dtype(std::get<1>(pair)), seen["pair.labels"]);
  row("map.dense", dtype(features.at("dense")), seen["map.dense"]);
  row("map.token_ids", dtype(features.at("token_ids")), seen["map.token_ids"]);
  row("optional.weights", dtype(weights), seen["optional.weights"]);
  row("struct.image", dtype(sample.image), seen["struct.image"]);
  row("struct.ids", dtype(sample.ids), seen["struct.ids"]);
  std::printf("  %-18s %s row %lld, passed through\n", "struct.origin", sample.origin.file.c_str(),
              static_cast<long long>(sample.origin.row));
  row("leaf", "inside", "after forward");
  row("output.logits", seen["output.logits"], dtype(out.at("logits")));
  row("output.pred", seen["output.pred"], dtype(out.at("pred")));

  // An absent optional stays absent: nothing to cast, nothing to move.
  auto no_weights = rt.to_device(Weights());
  rt.forward(model, pair, features, no_weights, sample);
  row("optional (none)", "absent", seen["optional.weights"]);

  // The same batches train: the loss reads the fp32 logits and the untouched int64 labels.
  auto loss = torch::nn::functional::cross_entropy(out.at("logits"), std::get<1>(pair));  // () f32
  double l = rt.backward(loss, net).template item<double>();
  bool applied = rt.optimizer_step(opt).applied();
  std::printf("one training step: loss %.4f, %s\n", l, applied ? "applied" : "skipped");
  return 0;
}

}  // namespace nested

int main(int argc, char** argv) {
  nested::Options o;
  CLI::App app{"Passes nested and user-struct batches through a runtime.", "nested_batches"};
  app.option_defaults()->always_capture_default();
  app.add_option("--device", o.device, "cpu, cuda, gpu or auto");
  app.add_option("--precision", o.precision,
                 "one of " + std::string(loom::precision::allowed_names));
  CLI11_PARSE(app, argc, argv);

  try {
    torch::manual_seed(0);
    return loom::with_runtime(o.device, o.precision, [](auto& rt) { return nested::run(rt); });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nested_batches: %s\n", e.what());
    return 2;
  }
}
