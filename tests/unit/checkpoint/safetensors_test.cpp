// loom::safetensors: every dtype written and read back, the checks a file outside the format
// fails (each naming what is wrong), load_into's strict and lenient loads, Hugging Face's
// sharded layout.
#include "support/catch.hpp"
#include "support/warnings.hpp"

#include <unistd.h>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <loom/checkpoint/safetensors.hpp>
#include <loom/error.hpp>

using Catch::Matchers::Contains;

namespace {

namespace fs = std::filesystem;
namespace st = loom::safetensors;

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("loom_safetensors_" + std::to_string(::getpid()) +
                                               "_" + std::to_string(++count()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
  static int& count() {
    static int n = 0;
    return n;
  }
};

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// A file of `header` (padded as written) and `data` bytes.
std::string file_of(const std::string& header, const std::string& data) {
  std::string text = header;
  text.append((8 - text.size() % 8) % 8, ' ');
  const std::uint64_t n = text.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + text + data;
}

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const auto x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

}  // namespace

TEST_CASE("safetensors: every dtype round-trips bit for bit, mapped and from memory",
          "[checkpoint][safetensors]") {
  TempDir tmp;
  torch::manual_seed(1);
  const at::Tensor f = at::randn({3, 5});
  std::vector<std::pair<std::string, at::Tensor>> tensors{
      {"f64", f.to(at::kDouble)},
      {"f32", f},
      {"f16", f.to(at::kHalf)},
      {"bf16", f.to(at::kBFloat16)},
      {"i64", at::arange(7)},
      {"i32", at::arange(7, at::kInt)},
      {"i16", at::arange(7, at::kShort)},
      {"i8", at::arange(-3, 4, at::kChar)},
      {"u8", at::arange(200, 207, at::kByte)},
      {"bool", at::rand({4}) > 0.5},
      {"e4m3", f.to(at::kFloat8_e4m3fn)},
      {"e5m2", f.to(at::kFloat8_e5m2)},
      {"c64", at::randn({2}, at::kComplexFloat)},
      {"u16", at::arange(5, at::kInt).to(at::kUInt16)},
      {"u32", at::arange(5, at::kInt).to(at::kUInt32)},
      {"u64", at::arange(5, at::kInt).to(at::kUInt64)},
      {"scalar", at::tensor(2.5)},
      {"empty", at::empty({0, 4})},
      {"strided", f.t()}};
  const auto path = tmp.path / "all.safetensors";
  st::save(path, tensors, {{"format", "pt"}});
  const auto bytes = read(path);
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  CHECK(n % 8 == 0);  // the data starts 8-byte aligned, as Python's writer pads it
  for (const auto& loaded : {st::load(path), st::load_bytes(bytes)}) {
    CHECK(loaded.metadata.at("format") == "pt");
    REQUIRE(loaded.tensors.size() == tensors.size());
    for (const auto& [name, t] : tensors) {
      INFO(name);
      CHECK(same_bits(loaded.at(name), t));
    }
  }
  // As Python writes them: by safetensors' dtype enumeration, the last (U64) first.
  const auto order = st::load(path).tensors;
  CHECK(order.front().first == "u64");
  CHECK(order.back().first == "bool");
  CHECK_THROWS_WITH(st::load(path).at("nope"), Contains("no tensor named 'nope'"));
  CHECK_THROWS_WITH(st::save(path, {{"a", f}, {"a", f}}), Contains("'a' is given twice"));
  CHECK_THROWS_WITH(st::save(path, {{"q", at::ones({2}, at::kComplexDouble)}}),
                    Contains("do not hold"));
}

TEST_CASE("safetensors: a file outside the format is an error naming what is wrong",
          "[checkpoint][safetensors]") {
  const std::string four(16, 'x');
  auto fails = [](const std::string& bytes, const std::string& why) {
    CHECK_THROWS_WITH(st::load_bytes(bytes, "F"),
                      Contains("F is not a valid safetensors file") && Contains(why));
  };
  fails("abc", "shorter than the 8 bytes");
  std::string huge(8, '\0');
  const std::uint64_t big = 200'000'000;
  std::memcpy(huge.data(), &big, 8);
  fails(huge, "claims 200000000 bytes (at most 100000000)");
  std::string past(8, '\0');
  const std::uint64_t ten = 10;
  std::memcpy(past.data(), &ten, 8);
  fails(past + "{}", "claims 10 bytes of a file of 10");
  fails(file_of("{\"a\":", ""), "not JSON");
  fails(file_of("[1]", ""), "not a JSON object");
  fails(file_of(R"({"a":{"dtype":"F33","shape":[4],"data_offsets":[0,16]}})", four),
        "unknown dtype \"F33\"");
  fails(file_of(R"({"a":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", four),
        "not a non-negative integer");
  fails(file_of(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", four),
        "holds 16 bytes where its shape and dtype make 12");
  fails(file_of(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[16,0]}})", four),
        "begin <= end");
  fails(file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                four),
        "(they overlap)");
  fails(file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", four), "(a gap)");
  fails(file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", four),
        "cover 8 bytes of a data buffer of 16");
  fails(file_of(R"({"a":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}})", four),
        "cover 32 bytes of a data buffer of 16");
  fails(file_of(R"({"__metadata__":{"k":1}})", ""), "__metadata__ value of 'k' is not a string");
  fails(file_of(R"({"a":{"dtype":"F32","shape":[4]}})", four),
        "is not {dtype, shape, data_offsets}");
  fails(file_of(R"({"a":{"dtype":"F32","shape":[4611686018427387904,8],"data_offsets":[0,16]}})",
                four),
        "more than 2^64");
  // A valid one of an odd offset: copied, not a misaligned view.
  const auto ok = st::load_bytes(file_of(R"({"b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                                         R"("a":{"dtype":"F32","shape":[1],"data_offsets":[1,5]}})",
                                         std::string("\x01\x00\x00\x80\x3f", 5)),
                                 "F");
  CHECK(ok.at("a").item<float>() == 1.0F);
}

TEST_CASE("safetensors: load_into checks names and shapes; the sharded layout both ways",
          "[checkpoint][safetensors]") {
  TempDir tmp;
  torch::manual_seed(2);
  torch::nn::Sequential model(torch::nn::Linear(4, 3),
                              torch::nn::LayerNorm(torch::nn::LayerNormOptions({3})));
  const auto path = tmp.path / "model.safetensors";
  st::save(path, st::named_tensors(*model));
  torch::nn::Sequential other(torch::nn::Linear(4, 3),
                              torch::nn::LayerNorm(torch::nn::LayerNormOptions({3})));
  const auto report = st::load_into(*other, path);
  CHECK(report.missing.empty());
  for (const auto& [name, t] : st::named_tensors(*model)) {
    CHECK(at::equal(t, st::load(path).at(name)));
  }
  CHECK(at::equal(other[0]->as<torch::nn::LinearImpl>()->weight,
                  model[0]->as<torch::nn::LinearImpl>()->weight));

  // 0.* of other shapes, 1.* (the LayerNorm) fits, 2.* missing.
  torch::nn::Sequential wrong(torch::nn::Linear(4, 2),
                              torch::nn::LayerNorm(torch::nn::LayerNormOptions({3})),
                              torch::nn::Linear(2, 2));
  const at::Tensor before = wrong[1]->as<torch::nn::LayerNormImpl>()->weight.clone();
  CHECK_THROWS_WITH(st::load_into(*wrong, path),
                    Contains("does not fit the module") &&
                        Contains("missing (2): 2.weight, 2.bias") &&
                        Contains("of another shape (2): 0.weight: [3, 4] in the file, [2, 4] in "
                                 "the module, 0.bias: [3] in the file, [2] in the module"));
  CHECK(at::equal(before, wrong[1]->as<torch::nn::LayerNormImpl>()->weight));  // nothing copied
  const auto lenient = st::load_into(*wrong, path, /*strict=*/false);
  CHECK(lenient.missing.size() == 2);
  CHECK(lenient.mismatched.size() == 2);
  CHECK(lenient.unexpected.empty());
  CHECK(at::equal(wrong[1]->as<torch::nn::LayerNormImpl>()->weight,
                  model[1]->as<torch::nn::LayerNormImpl>()->weight));  // what fits, loaded
  torch::nn::Sequential fewer(torch::nn::Linear(4, 3));
  CHECK(st::load_into(*fewer, path, /*strict=*/false).unexpected ==
        std::vector<std::string>{"1.bias", "1.weight"});  // in the file's order

  // Sharded: at most 40 bytes of tensor data a file: 0.weight (48) alone, then the rest (36).
  const auto index =
      st::save_sharded(tmp.path / "sharded", st::named_tensors(*model), 40, {{"format", "pt"}});
  CHECK(index.filename() == "model.safetensors.index.json");
  CHECK(fs::exists(tmp.path / "sharded" / "model-00001-of-00002.safetensors"));
  CHECK(fs::exists(tmp.path / "sharded" / "model-00002-of-00002.safetensors"));
  const auto whole = st::load_sharded(index);
  REQUIRE(whole.tensors.size() == 4);
  for (const auto& [name, t] : st::named_tensors(*model)) CHECK(at::equal(t, whole.at(name)));
  torch::nn::Sequential third(torch::nn::Linear(4, 3),
                              torch::nn::LayerNorm(torch::nn::LayerNormOptions({3})));
  CHECK(st::load_into(*third, index).missing.empty());
  CHECK(at::equal(third[1]->as<torch::nn::LayerNormImpl>()->bias,
                  model[1]->as<torch::nn::LayerNormImpl>()->bias));
  std::ofstream(tmp.path / "sharded" / "bad.json") << R"({"weight_map": {"x": "../etc"}})";
  CHECK_THROWS_WITH(st::load_sharded(tmp.path / "sharded" / "bad.json"),
                    Contains("not a file beside it"));
}
