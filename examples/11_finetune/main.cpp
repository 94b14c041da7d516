// Fine-tuning a pretrained model from its safetensors weights: a small GPT-2-style language
// model (Hugging Face's layout and names: transformer.wte, transformer.h.0.attn.c_attn, ...,
// Conv1D weights stored [in, out], the output head tied to the token embedding) whose weights
// a Python program wrote (make_pretrained.py), loaded with loom::safetensors::load_into
// (strict: every name and shape checked), fine-tuned on a text at the byte level, and written
// back as safetensors that Python reads (check_finetuned.py).
//
//   finetune --pretrained model.safetensors --out finetuned.safetensors [--text FILE]
//            [--steps 150] [--batch 16] [--lr 3e-3] [--layers 2] [--heads 4] [--width 64]
//            [--context 64]
//
// The shape options must be those of the pretrained model (config.json beside it says them);
// a mismatch is load_into's error, listing the names and shapes that differ. The validation
// loss is the mean cross-entropy over 8 fixed windows of the text's last tenth, printed before
// and after, as check_finetuned.py computes it from the files.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>
#include <CLI/CLI.hpp>

#include <loom/checkpoint/safetensors.hpp>
#include <loom/loom.hpp>

#include "common/char_lm.hpp"  // read_text, windows

namespace {

/// Hugging Face's Conv1D: a linear layer whose weight is stored [in, out].
struct Conv1DImpl : torch::nn::Module {
  Conv1DImpl(int64_t in, int64_t out) {
    weight = register_parameter("weight", at::empty({in, out}).normal_(0, 0.02));
    bias = register_parameter("bias", at::zeros({out}));
  }
  at::Tensor forward(const at::Tensor& x) {
    auto shape = x.sizes().vec();
    shape.back() = weight.size(1);
    return at::addmm(bias, x.reshape({-1, x.size(-1)}), weight).view(shape);
  }
  at::Tensor weight, bias;
};
TORCH_MODULE(Conv1D);

struct AttentionImpl : torch::nn::Module {
  AttentionImpl(int64_t width, int64_t n_head) : heads(n_head) {
    c_attn = register_module("c_attn", Conv1D(width, 3 * width));
    c_proj = register_module("c_proj", Conv1D(width, width));
  }
  at::Tensor forward(const at::Tensor& x) {  // (B, T, C)
    const int64_t b = x.size(0), t = x.size(1), c = x.size(2);
    auto qkv = c_attn(x).split(c, /*dim=*/2);
    auto heads_of = [&](const at::Tensor& u) {
      return u.view({b, t, heads, c / heads}).transpose(1, 2);  // (B, H, T, D)
    };
    const at::Tensor y = at::scaled_dot_product_attention(heads_of(qkv[0]), heads_of(qkv[1]),
                                                          heads_of(qkv[2]), /*attn_mask=*/{},
                                                          /*dropout_p=*/0.0, /*is_causal=*/true);
    return c_proj(y.transpose(1, 2).reshape({b, t, c}));
  }
  int64_t heads;
  Conv1D c_attn{nullptr}, c_proj{nullptr};
};
TORCH_MODULE(Attention);

struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(int64_t width) {
    c_fc = register_module("c_fc", Conv1D(width, 4 * width));
    c_proj = register_module("c_proj", Conv1D(4 * width, width));
  }
  at::Tensor forward(const at::Tensor& x) { return c_proj(at::gelu(c_fc(x), "tanh")); }
  Conv1D c_fc{nullptr}, c_proj{nullptr};
};
TORCH_MODULE(Mlp);

struct GptBlockImpl : torch::nn::Module {
  GptBlockImpl(int64_t width, int64_t heads) {
    using torch::nn::LayerNorm, torch::nn::LayerNormOptions;
    ln_1 = register_module("ln_1", LayerNorm(LayerNormOptions({width}).eps(1e-5)));
    attn = register_module("attn", Attention(width, heads));
    ln_2 = register_module("ln_2", LayerNorm(LayerNormOptions({width}).eps(1e-5)));
    mlp = register_module("mlp", Mlp(width));
  }
  at::Tensor forward(at::Tensor x) {
    x = x + attn(ln_1(x));
    return x + mlp(ln_2(x));
  }
  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  Attention attn{nullptr};
  Mlp mlp{nullptr};
};
TORCH_MODULE(GptBlock);

/// GPT-2's `transformer`: token and position embeddings, the blocks, the final LayerNorm.
struct TransformerImpl : torch::nn::Module {
  TransformerImpl(int64_t vocab, int64_t context, int64_t width, int64_t layers, int64_t heads) {
    using torch::nn::Embedding, torch::nn::LayerNorm, torch::nn::LayerNormOptions;
    wte = register_module("wte", Embedding(vocab, width));
    wpe = register_module("wpe", Embedding(context, width));
    h = register_module("h", torch::nn::ModuleList());
    for (int64_t i = 0; i < layers; ++i) h->push_back(GptBlock(width, heads));
    ln_f = register_module("ln_f", LayerNorm(LayerNormOptions({width}).eps(1e-5)));
  }
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::ModuleList h{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
};
TORCH_MODULE(Transformer);

/// GPT2LMHeadModel: the transformer and a head tied to the token embedding (no weight of its
/// own, as the safetensors file has none).
struct GptImpl : torch::nn::Module {
  GptImpl(int64_t vocab, int64_t context, int64_t width, int64_t layers, int64_t heads) {
    transformer = register_module("transformer", Transformer(vocab, context, width, layers, heads));
  }
  at::Tensor forward(const at::Tensor& ids) {  // (B, T) -> logits (B, T, V)
    const at::Tensor positions = at::arange(ids.size(1), ids.options());
    at::Tensor x = transformer->wte(ids) + transformer->wpe(positions);
    for (const auto& block : *transformer->h) x = block->as<GptBlock>()->forward(x);
    return at::matmul(transformer->ln_f(x), transformer->wte->weight.t());
  }
  Transformer transformer{nullptr};
};
TORCH_MODULE(Gpt);

struct Options {
  std::string pretrained, out;
  std::vector<std::string> text{"/usr/share/common-licenses/GPL-3"};
  int64_t steps = 150, batch = 16, layers = 2, heads = 4, width = 64, context = 64;
  double lr = 3e-3;
};

/// The mean cross-entropy over 8 fixed windows of `val` (check_finetuned.py's windows).
double validation_loss(Gpt& model, const at::Tensor& val, int64_t context) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> xs, ys;
  for (int64_t i = 0; i < 8; ++i) {
    const int64_t start = i * (val.size(0) - context - 1) / 8;
    xs.push_back(val.narrow(0, start, context));
    ys.push_back(val.narrow(0, start + 1, context));
  }
  const at::Tensor logits = model->forward(at::stack(xs));
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                              at::stack(ys).reshape({-1}))
      .item<double>();
}

int run(const Options& o) {
  const std::string text = examples::read_text(o.text);
  at::Tensor bytes = at::empty({static_cast<int64_t>(text.size())}, at::kLong);
  auto* id = bytes.data_ptr<int64_t>();
  for (std::size_t i = 0; i < text.size(); ++i) id[i] = static_cast<unsigned char>(text[i]);
  const int64_t cut = bytes.size(0) * 9 / 10;
  const at::Tensor train = bytes.narrow(0, 0, cut), val = bytes.narrow(0, cut, bytes.size(0) - cut);

  Gpt model(256, o.context, o.width, o.layers, o.heads);  // byte-level: 256 tokens
  loom::safetensors::load_into(*model, o.pretrained);     // strict: every name and shape checked
  int64_t params = 0;
  for (const auto& p : model->parameters()) params += p.numel();
  std::printf("loaded %zu tensors (%lld parameters) from %s\n",
              loom::safetensors::named_tensors(*model).size(), static_cast<long long>(params),
              o.pretrained.c_str());

  loom::Runtime<loom::Cpu, loom::Fp32> rt;
  loom::optim::AdamW opt(model->parameters(), loom::optim::AdamWOptions(o.lr));
  rt.setup(model, opt);
  const double before = validation_loss(model, val, o.context);
  std::printf("validation loss before fine-tuning: %.6f\n", before);
  for (int64_t step = 0; step < o.steps; ++step) {
    auto [x, y] = examples::windows(train, o.context, o.batch, static_cast<uint64_t>(step));
    opt.zero_grad();
    const at::Tensor logits = rt.forward(model, x);
    const at::Tensor loss = torch::nn::functional::cross_entropy(
        logits.reshape({-1, logits.size(-1)}), y.reshape({-1}));
    rt.backward(loss, model);
    rt.clip_gradients(opt, /*max_norm=*/1.0);
    rt.optimizer_step(opt);
    if ((step + 1) % 50 == 0) {
      std::printf("step %lld: loss %.4f\n", static_cast<long long>(step + 1), loss.item<double>());
    }
  }
  const double after = validation_loss(model, val, o.context);
  std::printf("validation loss after %lld steps: %.6f (%s)\n", static_cast<long long>(o.steps),
              after, after < before - 1.0 ? "learned" : "did not learn");
  loom::safetensors::save(o.out, loom::safetensors::named_tensors(*model), {{"format", "pt"}});
  std::printf("saved %s\n", o.out.c_str());
  return after < before - 1.0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Fine-tunes a GPT-2-style model from its safetensors weights"};
  app.add_option("--pretrained", o.pretrained, "the pretrained weights (.safetensors)")->required();
  app.add_option("--out", o.out, "where the fine-tuned weights go (.safetensors)")->required();
  app.add_option("--text", o.text, "text files, or directories of them");
  app.add_option("--steps", o.steps, "optimizer steps")->check(CLI::Range(1, 1000000));
  app.add_option("--batch", o.batch, "windows per step")->check(CLI::Range(1, 4096));
  app.add_option("--lr", o.lr, "AdamW's learning rate");
  app.add_option("--layers", o.layers, "blocks (the pretrained model's n_layer)");
  app.add_option("--heads", o.heads, "attention heads (n_head)");
  app.add_option("--width", o.width, "embedding width (n_embd)");
  app.add_option("--context", o.context, "positions (n_positions), the training window");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "finetune: %s\n", e.what());
    return 1;
  }
}
