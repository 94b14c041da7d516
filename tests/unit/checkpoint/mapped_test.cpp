// Mapped loads (checkpoint/mapped.hpp): load_value with LoadOptions::map, unmapped, copy_all,
// LoadPlan, and rt.load, which maps the file and copies into the memory the model and
// optimizer hold.
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

/// Where the bytes of record `e` of the zip `bytes` start.
std::size_t data_at(const std::string& bytes, const loom::checkpoint::detail::ZipEntry& e) {
  return static_cast<std::size_t>(e.local_at + 30 +
                                  loom::checkpoint::detail::u16(bytes, e.local_at + 26) +
                                  loom::checkpoint::detail::u16(bytes, e.local_at + 28));
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<loom::checkpoint::detail::ZipEntry> entries_of(const std::string& bytes) {
  return loom::checkpoint::detail::zip_entries(
      [&](uint64_t offset, std::size_t n) { return bytes.substr(offset, n); }, bytes.size(),
      "test");
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
  int large = 0;
  for (const auto& e : entries_of(good)) {
    if (e.size < 1000000) continue;
    auto bytes = good;
    bytes[data_at(good, e) + e.size - 1] ^= 0x01;
    write(file, bytes);
    CHECK_THROWS_WITH(loom::checkpoint::load_value(file, std::nullopt, {.map = true}),
                      Contains("the record " + e.name + " is corrupted"));
    ++large;
  }
  CHECK(large >= 1);  // the file has a record of 1 MB or more: the loop above checked it
}

TEST_CASE("copy_all copies as Tensor::copy_ does", "[checkpoint][mapped]") {
  const auto src = at::linspace(-5, 5, 600000, at::kFloat);
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
  auto odd = base.narrow(0, 3, 1500007);  // from 3 bytes past an alignment
  const auto bytes = at::randint(0, 255, {1500007}, at::kByte);
  const auto big = at::randint(0, 255, {1 << 21}, at::kByte);
  auto big_dst = at::zeros({(1 << 21) + 5}, at::kByte).narrow(0, 5, 1 << 21);
  loom::checkpoint::copy_all({{odd, bytes}, {big_dst, big}});
  CHECK(odd.equal(bytes));
  CHECK(base.narrow(0, 0, 3).eq(0).all().item<bool>());
  CHECK(base.narrow(0, 1500010, 1).eq(0).all().item<bool>());
  CHECK(big_dst.equal(big));
}

TEST_CASE("LoadPlan: copies run only when asked; the file's own tensor is adopted only alone",
          "[checkpoint][mapped]") {
  using loom::checkpoint::LoadPlan;
  TempDir dir;
  const auto file = dir.path / "plan.pt";
  const auto w = at::arange(12, at::kFloat).reshape({3, 4});
  loom::checkpoint::save_value(file, c10::IValue(w));
  const auto mapped = loom::checkpoint::load_value(file, std::nullopt, {.map = true}).toTensor();
  const auto read = loom::checkpoint::load_value(file).toTensor();
  REQUIRE(loom::checkpoint::is_mapped(mapped));
  CHECK_FALSE(LoadPlan::may_adopt(mapped));  // a view of the file's pages: copied
  CHECK(LoadPlan::may_adopt(read));          // its own memory, no other user
  // A second tensor on the storage (a view: a copy of `read` would be the same tensor).
  [[maybe_unused]] const auto shared = read.view({12});
  CHECK_FALSE(LoadPlan::may_adopt(read));
  CHECK_FALSE(LoadPlan::may_adopt(at::zeros({8}).narrow(0, 2, 4)));  // part of a storage
  LoadPlan plan;
  CHECK(plan.empty());
  auto into = at::zeros({3, 4}, at::kDouble);  // a cast: the destination's dtype wins
  plan.copy(into, mapped);
  CHECK_FALSE(plan.empty());
  CHECK(into.eq(0).all().item<bool>());  // nothing copied before run()
  plan.run();
  CHECK(into.equal(w.to(at::kDouble)));
}

TEST_CASE("crc32_combine gives the CRC-32 of two pieces one after the other",
          "[checkpoint][mapped]") {
  namespace c = loom::checkpoint::detail;
  const auto t = at::randint(0, 256, {(1 << 20) + 77}, at::kByte);
  const auto* p = static_cast<const unsigned char*>(t.const_data_ptr());
  const std::size_t n = static_cast<std::size_t>(t.numel());
  const uint32_t whole = c::crc32(p, n);
  for (const std::size_t cut :
       {std::size_t{0}, std::size_t{1}, std::size_t{255}, std::size_t{262147}, n - 1, n}) {
    INFO("cut at " << cut);
    CHECK(c::crc32_combine(c::crc32(p, cut), c::crc32(p + cut, n - cut), n - cut) == whole);
  }
  // Many pieces, as copy_all combines them.
  uint32_t crc = c::crc32(p, 1000);
  for (std::size_t at = 1000; at < n; at += 262144) {
    const std::size_t m = std::min<std::size_t>(262144, n - at);
    crc = c::crc32_combine(crc, c::crc32(p + at, m), m);
  }
  CHECK(crc == whole);
  CHECK(c::crc32_combine(0x12345678u, 0, 0) == 0x12345678u);
}

TEST_CASE("under a DeferredChecks copy_all checks a large record as it copies it, finish the rest",
          "[checkpoint][mapped]") {
  namespace ck = loom::checkpoint;
  TempDir dir;
  const auto file = dir.path / "d.pt";
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("w", at::linspace(-3, 3, 700001, at::kFloat));  // 2.8 MB: 11 pieces, the last short
  d.insert("v", at::arange(400000, at::kInt));             // 1.6 MB
  d.insert("s", at::arange(9, at::kLong));                 // small: checked at once
  ck::save_value(file, d, {.sync = false});
  const std::string good = read_file(file);
  std::string w_name, v_name, s_name;
  for (const auto& e : entries_of(good)) {  // which record is which, by size
    if (e.size == 700001 * 4) w_name = e.name;
    if (e.size == 400000 * 4) v_name = e.name;
    if (e.size == 9 * 8) s_name = e.name;
  }
  REQUIRE_FALSE(w_name.empty());
  REQUIRE_FALSE(v_name.empty());
  REQUIRE_FALSE(s_name.empty());
  auto flip = [&](const std::string& name, std::size_t at) {
    auto bytes = good;
    for (const auto& e : entries_of(good)) {
      if (e.name == name) bytes[data_at(good, e) + at] ^= 0x10;
    }
    write(file, bytes);
  };
  auto w = at::zeros({700001});
  auto v = at::zeros({400000}, at::kInt);
  SECTION("a good file") {
    ck::DeferredChecks checks(" (the note)");
    REQUIRE(ck::DeferredChecks::current() == &checks);
    const auto value = ck::load_value(file, std::nullopt, {.map = true});
    ck::copy_all({{w, at_key(value, "w")}, {v, at_key(value, "v")}});
    CHECK(w.equal(at_key(d, "w")));
    CHECK(v.equal(at_key(d, "v")));
    checks.finish();
  }
  SECTION("a corrupted record that is copied: copy_all names it, with the note") {
    flip(w_name, 700001 * 4 - 3);  // in the last, short piece
    ck::DeferredChecks checks(" (the note)");
    const auto value = ck::load_value(file, std::nullopt, {.map = true});  // not checked yet
    CHECK_THROWS_WITH(ck::copy_all({{v, at_key(value, "v")}, {w, at_key(value, "w")}}),
                      Contains("the record " + w_name + " is corrupted") &&
                          Contains("written with it) (the note)"));
    CHECK(v.equal(at_key(d, "v")));  // every pair was copied first
  }
  SECTION("a corrupted record copied some other way: finish names it") {
    flip(v_name, 12345);
    ck::DeferredChecks checks;
    const auto value = ck::load_value(file, std::nullopt, {.map = true});
    ck::copy_all(
        {{w, at_key(value, "w")}, {v.narrow(0, 0, 10), at_key(value, "v").narrow(0, 0, 10)}});
    CHECK(w.equal(at_key(d, "w")));
    CHECK_THROWS_WITH(checks.finish(), Contains("the record " + v_name + " is corrupted"));
  }
  SECTION("a corrupted small record is refused by the read itself") {
    flip(s_name, 3);
    ck::DeferredChecks checks;
    CHECK_THROWS_WITH(ck::load_value(file, std::nullopt, {.map = true}),
                      Contains("the record " + s_name + " is corrupted"));
  }
  SECTION("without one the read checks everything before it returns") {
    flip(w_name, 0);
    CHECK(ck::DeferredChecks::current() == nullptr);
    CHECK_THROWS_WITH(ck::load_value(file, std::nullopt, {.map = true}),
                      Contains("the record " + w_name + " is corrupted"));
  }
  CHECK(ck::DeferredChecks::current() == nullptr);  // each section's is gone
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

TEST_CASE(
    "rt.load of a corrupted record says so, and a good checkpoint loaded after it restores all",
    "[checkpoint][mapped]") {
  TempDir dir;
  const auto file = dir.path / "ck.pt";
  const auto good_file = dir.path / "good.pt";
  Trained t;
  t.train(2);
  t.rt.save(file, {{"model", t.model}, {"optimizer", t.opt}});
  t.rt.save(good_file, {{"model", t.model}, {"optimizer", t.opt}});
  const auto saved = loom::checkpoint::load_value(good_file);
  t.train(1);
  std::vector<at::Tensor> before;
  for (const auto& x : t.tensors()) before.push_back(x.clone());
  const std::string bytes = read_file(file);
  const auto entries = entries_of(bytes);
  auto corrupt = [&](const loom::checkpoint::detail::ZipEntry& e) {
    auto b = bytes;
    b[data_at(bytes, e) + e.size / 2] ^= 0x08;
    write(file, b);
  };
  // A small record (the last layer's bias) is checked as it is read: nothing changes.
  const loom::checkpoint::detail::ZipEntry* small = nullptr;
  const loom::checkpoint::detail::ZipEntry* large = nullptr;
  for (const auto& e : entries) {
    if (e.name.rfind("data/", 0) == 0 && e.size == 3 * 4 && small == nullptr) small = &e;
    if (e.size >= (1u << 20)) large = &e;
  }
  REQUIRE(small != nullptr);
  REQUIRE(large != nullptr);
  corrupt(*small);
  CHECK_THROWS_WITH(t.rt.load(file, {{"model", t.model}, {"optimizer", t.opt}}),
                    Contains("the record " + small->name + " is corrupted"));
  const auto after = t.tensors();
  for (std::size_t i = 0; i < after.size(); ++i) {
    INFO("tensor " << i);
    CHECK(after[i].equal(before[i]));
  }
  // A large one is checked as it is copied: the error says the state may hold part of it.
  corrupt(*large);
  CHECK_THROWS_WITH(t.rt.load(file, {{"model", t.model}, {"optimizer", t.opt}}),
                    Contains("the record " + large->name + " is corrupted") &&
                        Contains("what was loaded may hold part of it (load another checkpoint)"));
  // ... and loading a good checkpoint then restores every tensor.
  (void)t.rt.load(good_file, {{"model", t.model}, {"optimizer", t.opt}});
  CHECK(loom::testing::difference(loom::state::module_state(*t.model),
                                  saved.toGenericDict().at("model")) == "");
  CHECK(loom::testing::difference(loom::state::optimizer_state(t.opt),
                                  saved.toGenericDict().at("optimizer")) == "");
}
