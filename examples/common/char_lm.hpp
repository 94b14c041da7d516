#pragma once
// The character-level transformer language model of examples 08_char_lm and 10_fsdp: the text
// (files or directories of them), its characters as ids, a pre-norm transformer block, the
// model over any block type (Block, or loom::FsdpUnit<Block> under loom::Fsdp), and the
// training windows drawn from a generator seeded per step.
#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <loom/nn/activation_checkpoint.hpp>

namespace examples {

/// The bytes of every regular file named, a directory's files in name order (symbolic links
/// skipped: Debian's GPL is a link to GPL-3).
std::string read_text(const std::vector<std::string>& sources) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  for (const auto& s : sources) {
    if (fs::is_directory(s)) {
      std::vector<fs::path> in_dir;
      for (const auto& e : fs::directory_iterator(s)) {
        if (e.is_regular_file() && !e.is_symlink()) in_dir.push_back(e.path());
      }
      std::sort(in_dir.begin(), in_dir.end());
      files.insert(files.end(), in_dir.begin(), in_dir.end());
    } else {
      files.emplace_back(s);
    }
  }
  std::string text;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) throw std::runtime_error("cannot read the text file " + f.string());
    text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return text;
}

/// The characters of a text as token ids, and back.
class Vocabulary {
 public:
  explicit Vocabulary(const std::string& text) {
    std::array<bool, 256> seen{};
    for (unsigned char c : text) seen[c] = true;
    for (int c = 0; c < 256; ++c) {
      if (seen[static_cast<std::size_t>(c)]) {
        id_[static_cast<std::size_t>(c)] = static_cast<int64_t>(chars_.size());
        chars_.push_back(static_cast<char>(c));
      }
    }
  }
  int64_t size() const { return static_cast<int64_t>(chars_.size()); }
  at::Tensor encode(const std::string& text) const {
    at::Tensor ids = at::empty({static_cast<int64_t>(text.size())}, at::kLong);
    auto* p = ids.data_ptr<int64_t>();
    for (std::size_t i = 0; i < text.size(); ++i) {
      const int64_t id = id_[static_cast<unsigned char>(text[i])];
      p[i] = id < 0 ? 0 : id;  // a prompt character the text never uses: the first one
    }
    return ids;
  }
  char decode(int64_t id) const { return chars_.at(static_cast<std::size_t>(id)); }

 private:
  std::vector<char> chars_;
  std::array<int64_t, 256> id_ = [] {
    std::array<int64_t, 256> a{};
    a.fill(-1);
    return a;
  }();
};

/// Pre-norm transformer block: x + attention(LayerNorm(x)), then x + MLP(LayerNorm(x)) with
/// GELU. Sequence first, (T, B, C), as torch::nn::MultiheadAttention takes it.
struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t width, int64_t heads)
      : ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        attn(register_module("attn", torch::nn::MultiheadAttention(
                                         torch::nn::MultiheadAttentionOptions(width, heads)))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        mlp(register_module(
            "mlp", torch::nn::Sequential(torch::nn::Linear(width, 4 * width), torch::nn::GELU(),
                                         torch::nn::Linear(4 * width, width)))) {}

  at::Tensor forward(const at::Tensor& x, const at::Tensor& causal) {
    const at::Tensor h = ln1(x);
    at::Tensor y = x + std::get<0>(attn->forward(h, h, h, /*key_padding_mask=*/{},
                                                 /*need_weights=*/false, causal));
    return y + mlp->forward(ln2(y));
  }

  torch::nn::LayerNorm ln1;
  torch::nn::MultiheadAttention attn;
  torch::nn::LayerNorm ln2;
  torch::nn::Sequential mlp;
};
TORCH_MODULE(Block);

/// Token and position embeddings, the blocks (each a B: Block, or loom::FsdpUnit<Block> for
/// loom::Fsdp), a final LayerNorm and the logits.
template <class B>
struct CharLMImpl : torch::nn::Module {
  CharLMImpl(int64_t vocab, int64_t block, int64_t width, int64_t layers, int64_t heads)
      : tok(register_module("tok", torch::nn::Embedding(vocab, width))),
        pos(register_module("pos", torch::nn::Embedding(block, width))),
        ln(register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        head(register_module("head", torch::nn::Linear(width, vocab))) {
    for (int64_t i = 0; i < layers; ++i) blocks->push_back(B(width, heads));
    register_module("blocks", blocks);
  }

  /// (B, T) token ids -> (B, T, vocab) logits; position t sees positions <= t only.
  at::Tensor forward(const at::Tensor& ids) {
    const int64_t t = ids.size(1);
    at::Tensor x = tok(ids) + pos(at::arange(t, ids.options()));
    x = x.transpose(0, 1);  // (T, batch, C)
    // LibTorch's attention adds attn_mask to the scores (a bool mask too, as 0 and 1): -inf
    // above the diagonal hides the future.
    const at::Tensor causal =
        at::full({t, t}, -std::numeric_limits<float>::infinity(), ids.options().dtype(at::kFloat))
            .triu(1);
    for (const auto& b : *blocks) {
      auto* block = b->template as<typename B::ContainedType>();
      // Activation checkpointing: the block keeps only its input; backward runs it again.
      x = recompute && is_training() ? loom::activation_checkpoint(block, x, causal)
                                     : block->forward(x, causal);
    }
    return head(ln(x)).transpose(0, 1);
  }

  bool recompute = false;  // --checkpoint-activations

  torch::nn::Embedding tok, pos;
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm ln;
  torch::nn::Linear head;
};

template <class B>
class CharLM : public torch::nn::ModuleHolder<CharLMImpl<B>> {
 public:
  using torch::nn::ModuleHolder<CharLMImpl<B>>::ModuleHolder;
};

/// Windows of block + 1 characters: inputs and the next characters. The windows of (step,
/// micro-batch) come from a generator seeded with them alone, so a resumed run draws what an
/// uninterrupted one would.
std::pair<at::Tensor, at::Tensor> windows(const at::Tensor& ids, int64_t block, int64_t batch,
                                          uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const at::Tensor starts = at::randint(ids.size(0) - block - 1, {batch}, gen, at::kLong);
  const at::Tensor offsets = at::arange(block + 1, at::kLong);
  const at::Tensor rows = ids.index({starts.unsqueeze(1) + offsets});  // (batch, block + 1)
  return {rows.narrow(1, 0, block), rows.narrow(1, 1, block)};
}

template <class RT, class Model>
at::Tensor loss_of(RT& rt, Model& model, const at::Tensor& x, const at::Tensor& y) {
  const at::Tensor logits = rt.forward(model, x);  // (B, T, V) in the default dtype
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                              y.reshape({-1}));
}

/// The mean loss over fixed windows of the validation text.
template <class RT, class Model>
double validation_loss(RT& rt, Model& model, const at::Tensor& val, int64_t block, int64_t batch) {
  at::NoGradGuard no_grad;
  model->eval();
  double sum = 0;
  constexpr int kBatches = 8;
  for (int i = 0; i < kBatches; ++i) {
    auto [x, y] = windows(val, block, batch, 1'000'000u + static_cast<uint64_t>(i));
    sum += loss_of(rt, model, rt.to_device(x), rt.to_device(y)).template item<double>();
  }
  model->train();
  return sum / kBatches;
}

}  // namespace examples
