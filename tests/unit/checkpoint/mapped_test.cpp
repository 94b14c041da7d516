// Mapped loads (checkpoint/mapped.hpp): load_value with LoadOptions::map, unmapped, copy_all,
// and rt.load, which maps the file and copies into the memory the model and optimizer hold.
#include "support/catch.hpp"
#include "support/same_value.hpp"

#include <unistd.h>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <loom/loom.hpp>

using Catch::Matchers::Contains;

namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path = fs::temp_directory_path() /
                  ("loom_mapped_" + std::to_string(::getpid()) + "_" + std::to_string(++count()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
  static int& count() {
    static int n = 0;
    return n;
  }
};

void write(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void same(const c10::IValue& a, const c10::IValue& b, const std::string& where) {
  CHECK(loom::testing::difference(a, b, loom::testing::Layout::Exact, where) == "");
}

at::Tensor at_key(const c10::IValue& d, const char* key) {
  return d.toGenericDict().at(std::string(key)).toTensor();
}

/// Every tensor of `v` (in dicts, lists and tuples).
void each_tensor(const c10::IValue& v, const std::function<void(const at::Tensor&)>& f) {
  if (v.isTensor()) f(v.toTensor());
  if (v.isGenericDict()) {
    for (const auto& e : v.toGenericDict()) each_tensor(e.value(), f);
  }
  if (v.isList()) {
    for (const auto& e : v.toList()) each_tensor(e, f);
  }
  if (v.isTuple()) {
    for (const auto& e : v.toTupleRef().elements()) each_tensor(e, f);
  }
}

int mapped_count(const c10::IValue& v) {
  int n = 0;
  each_tensor(v, [&](const at::Tensor& t) { n += loom::checkpoint::is_mapped(t) ? 1 : 0; });
  return n;
}

/// Two storages past 1 MiB (checked on two threads), a small one, two views of one storage, a
/// tensor that requires grad.
c10::IValue spec() {
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("big", at::arange(3 * 262144, at::kInt));
  d.insert("w", at::linspace(-1, 1, 600000, at::kFloat));
  d.insert("small", at::arange(10, at::kLong));
  const auto base = at::arange(20, at::kDouble);
  d.insert("pair", c10::ivalue::Tuple::create({base.narrow(0, 0, 10), base.narrow(0, 10, 10)}));
  d.insert("grad", at::linspace(0, 1, 5, at::kFloat).requires_grad_(true));
  d.insert("n", int64_t{7});
  return d;
}

}  // namespace

TEST_CASE("a mapped load views the file, and unmapped gives its tensors memory of their own",
          "[checkpoint][mapped]") {
  TempDir dir;
  const auto file = dir.path / "m.pt";
  loom::checkpoint::save_value(file, spec(), {.sync = false});
  const auto v = loom::checkpoint::load_value(file, std::nullopt, {.map = true});
  same(v, spec(), "mapped");
  CHECK(mapped_count(v) == 6);
  const auto pair = v.toGenericDict().at("pair").toTupleRef().elements();
  CHECK(pair[0].toTensor().is_alias_of(pair[1].toTensor()));  // one storage, as in the file
  // A write to a mapped tensor copies its page: the file keeps its bytes.
  at_key(v, "big").fill_(-3);
  CHECK(at_key(v, "big").eq(-3).all().item<bool>());
  same(loom::checkpoint::load_value(file), spec(), "the file after a write to a mapped tensor");
  const auto fresh = loom::checkpoint::load_value(file, std::nullopt, {.map = true});
  const auto own = loom::checkpoint::unmapped(fresh);
  same(own, spec(), "unmapped");
  CHECK(mapped_count(own) == 0);
  const auto own_pair = own.toGenericDict().at("pair").toTupleRef().elements();
  CHECK(own_pair[0].toTensor().is_alias_of(own_pair[1].toTensor()));  // still shared
  CHECK(at_key(own, "grad").requires_grad());
  // Nothing mapped: the very same tensors come back.
  const c10::IValue plain = spec();
  const auto back = loom::checkpoint::unmapped(plain);
  CHECK(at_key(back, "big").is_same(at_key(plain, "big")));
  // Without the option (and for load_bytes) nothing is mapped.
  CHECK(mapped_count(loom::checkpoint::load_value(file)) == 0);
}

TEST_CASE("a mapped load refuses exactly the truncated and corrupted files a copying load does",
          "[checkpoint][mapped]") {
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("a", at::arange(300000, at::kInt));  // 1.2 MB: the two-thread check
  d.insert("b", at::linspace(0, 1, 1000, at::kFloat));
  d.insert("c", at::arange(6, at::kLong));
  const c10::IValue value = d;
  const auto good = loom::checkpoint::save_bytes(value);
  TempDir dir;
  const auto file = dir.path / "x.pt";
  auto outcome = [&](const std::string& bytes, bool map) -> std::string {
    if (map) write(file, bytes);
    try {
      const auto v = map ? loom::checkpoint::load_value(file, std::nullopt, {.map = true})
                         : loom::checkpoint::load_bytes(bytes);
      const auto diff = loom::testing::difference(v, value, loom::testing::Layout::Exact);
      return diff.empty() ? "same" : "read a different value: " + diff;
    } catch (const loom::Error&) {
      return "refused";
    }
  };
  int tried = 0, refused = 0;
  for (std::size_t n = 0; n < good.size(); n += 1 + good.size() / 61) {
    const auto bytes = good.substr(0, n);
    const auto mapped = outcome(bytes, true);
    INFO("truncated to " << n << " bytes");
    CHECK(mapped == "refused");
    CHECK(mapped == outcome(bytes, false));
    ++tried;
  }
  CHECK(tried > 50);
  tried = 0;
  for (std::size_t i = 0; i < good.size(); i += 1 + good.size() / 151) {
    auto bytes = good;
    bytes[i] = static_cast<char>(bytes[i] ^ 0x40);
    const auto mapped = outcome(bytes, true);
    INFO("byte " << i << " flipped");
    CHECK(mapped == outcome(bytes, false));
    CHECK((mapped == "refused" || mapped == "same"));
    refused += mapped == "refused" ? 1 : 0;
    ++tried;
  }
  CHECK(refused > tried / 2);
  // A flip in the large record names it, from whichever thread checked it.
  const auto entries = loom::checkpoint::detail::zip_entries(
      [&](uint64_t offset, std::size_t n) { return good.substr(offset, n); }, good.size(), "test");
  for (const auto& e : entries) {
    if (e.size < 1000000) continue;
    auto bytes = good;
    const auto data_at = e.local_at + 30 + loom::checkpoint::detail::u16(good, e.local_at + 26) +
                         loom::checkpoint::detail::u16(good, e.local_at + 28);
    bytes[data_at + e.size - 1] ^= 0x01;
    write(file, bytes);
    CHECK_THROWS_WITH(loom::checkpoint::load_value(file, std::nullopt, {.map = true}),
                      Contains("the record " + e.name + " is corrupted"));
  }
}

TEST_CASE("copy_all copies as Tensor::copy_ does, streaming the large plain ones",
          "[checkpoint][mapped]") {
  const auto src = at::linspace(-5, 5, 600000, at::kFloat);  // 2.4 MB: streamed
  auto dst = at::zeros({600000});
  auto wider = at::zeros({600000}, at::kDouble);  // a cast: copy_
  auto strided = at::zeros({1000, 600}).t();      // not contiguous: copy_
  const auto src2 = at::arange(600000, at::kFloat).reshape({600, 1000});
  auto small = at::zeros({7});
  const auto v0 = dst._version();
  loom::checkpoint::copy_all(
      {{dst, src}, {wider, src}, {strided, src2}, {small, src.narrow(0, 3, 7)}});
  CHECK(dst.equal(src));
  CHECK(dst._version() > v0);  // autograd sees the write
  CHECK(wider.equal(src.to(at::kDouble)));
  CHECK(strided.equal(src2));
  CHECK(small.equal(src.narrow(0, 3, 7)));
  // An odd offset into the destination (not 16-byte aligned) and an odd length.
  auto base = at::zeros({1500011}, at::kByte);
  auto odd = base.narrow(0, 3, 1500007);  // 1.5 MB: streamed, from 3 bytes past an alignment
  const auto bytes = at::randint(0, 255, {1500007}, at::kByte);
  const auto big = at::randint(0, 255, {1 << 21}, at::kByte);
  auto big_dst = at::zeros({(1 << 21) + 5}, at::kByte).narrow(0, 5, 1 << 21);
  loom::checkpoint::copy_all({{odd, bytes}, {big_dst, big}});
  CHECK(odd.equal(bytes));
  CHECK(base.narrow(0, 0, 3).eq(0).all().item<bool>());
  CHECK(base.narrow(0, 1500010, 1).eq(0).all().item<bool>());
  CHECK(big_dst.equal(big));
}

namespace {

struct Trained {
  torch::nn::Sequential model{torch::nn::Linear(512, 1024), torch::nn::ReLU(),
                              torch::nn::Linear(1024, 3)};
  loom::Runtime<loom::Cpu, loom::Fp32> rt;
  loom::optim::Adam opt{model->parameters(), loom::optim::AdamOptions(1e-2)};
  Trained() { rt.setup(model, opt); }
  void train(int steps) {
    for (int i = 0; i < steps; ++i) {
      const auto x = at::arange(8 * 512, at::kFloat).reshape({8, 512}).sin() * (i + 1);
      const auto loss = at::cross_entropy_loss(rt.forward(model, x), at::arange(8, at::kLong) % 3);
      rt.backward(loss, model);
      rt.optimizer_step(opt);
      opt.zero_grad();
    }
  }
  std::vector<at::Tensor> tensors() {
    std::vector<at::Tensor> out;
    for (const auto& p : model->parameters()) {
      out.push_back(p);
      const auto& s =
          static_cast<loom::optim::AdamParamState&>(*opt.state().at(p.unsafeGetTensorImpl()));
      out.push_back(s.exp_avg());
      out.push_back(s.exp_avg_sq());
    }
    return out;
  }
};

}  // namespace

TEST_CASE("rt.load copies into the memory the model and optimizer hold and keeps nothing mapped",
          "[checkpoint][mapped]") {
  TempDir dir;
  const auto file = dir.path / "ck.pt";
  Trained t;
  t.train(2);
  at::Tensor extra = at::linspace(0, 1, 300000, at::kFloat);
  c10::IValue any = at::arange(5, at::kInt);
  at::Tensor unasked = at::arange(300000, at::kInt);
  t.rt.save(file, {{"model", t.model},
                   {"optimizer", t.opt},
                   {"extra", extra},
                   {"any", any},
                   {"unasked", unasked}});
  const auto saved = loom::checkpoint::load_value(file);
  t.train(2);  // the model and optimizer move on
  std::vector<const void*> where;
  std::vector<int64_t> versions;
  for (const auto& x : t.tensors()) {
    where.push_back(x.const_data_ptr());
    versions.push_back(x._version());
  }
  at::Tensor loaded_extra;  // undefined: the entry adopts what it loads
  c10::IValue loaded_any;
  const auto rest = t.rt.load(
      file,
      {{"model", t.model}, {"optimizer", t.opt}, {"extra", loaded_extra}, {"any", loaded_any}});
  const auto now = t.tensors();
  for (std::size_t i = 0; i < now.size(); ++i) {
    INFO("tensor " << i << " (parameter, exp_avg, exp_avg_sq in turn)");
    CHECK(now[i].const_data_ptr() == where[i]);  // loaded in place: no new memory
    CHECK(now[i]._version() > versions[i]);
    CHECK_FALSE(loom::checkpoint::is_mapped(now[i]));
  }
  CHECK(loom::testing::difference(loom::state::module_state(*t.model),
                                  saved.toGenericDict().at("model")) == "");
  CHECK(loom::testing::difference(loom::state::optimizer_state(t.opt),
                                  saved.toGenericDict().at("optimizer")) == "");
  CHECK(loaded_extra.equal(extra));
  CHECK_FALSE(loom::checkpoint::is_mapped(loaded_extra));
  CHECK(loaded_any.toTensor().equal(any.toTensor()));
  CHECK(mapped_count(loaded_any) == 0);
  REQUIRE(rest.count("unasked") == 1);
  CHECK(rest.at("unasked").toTensor().equal(unasked));
  CHECK(mapped_count(rest.at("unasked")) == 0);
  // A fresh optimizer has no state to reuse: it gets state of its own, not the file's pages.
  loom::optim::Adam fresh(t.model->parameters(), loom::optim::AdamOptions(1.0));
  (void)t.rt.load(file, {{"optimizer", fresh}});
  CHECK(loom::testing::difference(loom::state::optimizer_state(fresh),
                                  saved.toGenericDict().at("optimizer")) == "");
  for (const auto& p : t.model->parameters()) {
    const auto& s =
        static_cast<loom::optim::AdamParamState&>(*fresh.state().at(p.unsafeGetTensorImpl()));
    CHECK_FALSE(loom::checkpoint::is_mapped(s.exp_avg()));
    CHECK_FALSE(loom::checkpoint::is_mapped(s.exp_avg_sq()));
  }
}

TEST_CASE("rt.load of a corrupted record leaves the model and optimizer as they were",
          "[checkpoint][mapped]") {
  TempDir dir;
  const auto file = dir.path / "ck.pt";
  Trained t;
  t.train(2);
  t.rt.save(file, {{"model", t.model}, {"optimizer", t.opt}});
  t.train(1);
  std::vector<at::Tensor> before;
  for (const auto& x : t.tensors()) before.push_back(x.clone());
  std::ifstream in(file, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  const auto entries = loom::checkpoint::detail::zip_entries(
      [&](uint64_t offset, std::size_t n) { return bytes.substr(offset, n); }, bytes.size(),
      "test");
  // The last large record: every other record, read and checked before it, is good.
  const loom::checkpoint::detail::ZipEntry* last = nullptr;
  for (const auto& e : entries) {
    if (e.size >= (1u << 20)) last = &e;
  }
  REQUIRE(last != nullptr);
  const auto data_at = last->local_at + 30 +
                       loom::checkpoint::detail::u16(bytes, last->local_at + 26) +
                       loom::checkpoint::detail::u16(bytes, last->local_at + 28);
  bytes[data_at + last->size / 2] ^= 0x08;
  write(file, bytes);
  CHECK_THROWS_WITH(t.rt.load(file, {{"model", t.model}, {"optimizer", t.opt}}),
                    Contains("the record " + last->name + " is corrupted"));
  const auto after = t.tensors();
  for (std::size_t i = 0; i < after.size(); ++i) {
    INFO("tensor " << i);
    CHECK(after[i].equal(before[i]));
  }
}
