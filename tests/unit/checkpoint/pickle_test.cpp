// loom::checkpoint's pickle layer (checkpoint/pickle.hpp): the writer and the reader share one
// depth limit and count depth alike, so loom never writes a file it cannot read back.
#include "support/catch.hpp"
#include "support/same_value.hpp"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>

#include <loom/checkpoint/io.hpp>
#include <loom/checkpoint/pickle.hpp>
#include <loom/error.hpp>

using Catch::Matchers::Contains;

namespace {

namespace ckpt = loom::checkpoint::detail;
using Dict = c10::impl::GenericDict;
using List = c10::impl::GenericList;

constexpr int kLimit = 256;  // what the reader has always allowed; the writer allowed 512
static_assert(ckpt::max_depth == kLimit);

// What both halves' refusals say.
const std::string kTooDeep = "nest deeper than " + std::to_string(kLimit);

// How deeply `v` nests, counted as max_depth documents: a container is one level deeper than
// its deepest element or key; scalars, strings, tensors, devices and empty containers are 0.
int nesting(const c10::IValue& v) {
  int d = 0;
  if (v.isList()) {
    for (const auto& e : v.toListRef()) d = std::max(d, 1 + nesting(e));
  } else if (v.isTuple()) {
    for (const auto& e : v.toTupleRef().elements()) d = std::max(d, 1 + nesting(e));
  } else if (v.isGenericDict()) {
    for (const auto& e : v.toGenericDict()) {
      d = std::max({d, 1 + nesting(e.key()), 1 + nesting(e.value())});
    }
  }
  return d;
}

// One kind of container around a value, and the same around the value's pickled body (the
// bytes between PROTO 2 and STOP), spelled as PickleWriter writes it.
struct Shape {
  const char* name;
  std::function<c10::IValue(c10::IValue)> wrap;
  std::function<std::string(const std::string&)> wrap_body;
};

std::string op(ckpt::Opcode o) { return std::string(1, static_cast<char>(o)); }
std::string bin_int1(int v) { return op(ckpt::Opcode::BinInt1) + static_cast<char>(v); }

const std::vector<Shape>& shapes() {
  using O = ckpt::Opcode;
  static const std::vector<Shape> all{
      {"list",
       [](c10::IValue v) {
         List l(c10::AnyType::get());
         l.push_back(std::move(v));
         return c10::IValue(l);
       },
       [](const std::string& b) { return op(O::EmptyList) + op(O::Mark) + b + op(O::Appends); }},
      {"dict with a str key",
       [](c10::IValue v) {
         Dict d(c10::AnyType::get(), c10::AnyType::get());
         d.insert(std::string("k"), std::move(v));
         return c10::IValue(d);
       },
       [](const std::string& b) {
         return op(O::EmptyDict) + op(O::Mark) + op(O::BinUnicode) + std::string("\1\0\0\0k", 5) +
                b + op(O::SetItems);
       }},
      {"dict with an int key",
       [](c10::IValue v) {
         Dict d(c10::AnyType::get(), c10::AnyType::get());
         d.insert(int64_t{7}, std::move(v));
         return c10::IValue(d);
       },
       [](const std::string& b) {
         return op(O::EmptyDict) + op(O::Mark) + bin_int1(7) + b + op(O::SetItems);
       }},
      {"1-tuple",
       [](c10::IValue v) {
         return c10::IValue(c10::ivalue::Tuple::create(std::vector<c10::IValue>{std::move(v)}));
       },
       [](const std::string& b) { return b + op(O::Tuple1); }},
      {"4-tuple (MARK ... TUPLE)",
       [](c10::IValue v) {
         return c10::IValue(c10::ivalue::Tuple::create(
             std::vector<c10::IValue>{std::move(v), int64_t{1}, int64_t{2}, int64_t{3}}));
       },
       [](const std::string& b) {
         return op(O::Mark) + b + bin_int1(1) + bin_int1(2) + bin_int1(3) + op(O::Tuple);
       }},
  };
  return all;
}

// `leaf` inside `n` containers: shapes()[k] alone, or all of them in turn when k is npos.
c10::IValue nest(c10::IValue leaf, int n, std::size_t k) {
  for (int i = 0; i < n; ++i) {
    const auto& s = shapes()[k == std::string::npos ? i % shapes().size() : k];
    leaf = s.wrap(std::move(leaf));
  }
  return leaf;
}

struct Pickled {
  std::string pkl;
  std::vector<ckpt::PickleWriter::Storage> storages;
};

Pickled pickle(const c10::IValue& v) {
  ckpt::PickleWriter w;
  auto pkl = w.pickle(v);
  return {std::move(pkl), w.storages()};
}

c10::IValue unpickle(const std::string& pkl,
                     const std::vector<ckpt::PickleWriter::Storage>& storages = {}) {
  ckpt::StorageLoader load = [&](const std::string& key, int64_t nbytes) {
    for (const auto& s : storages) {
      if (s.key == key && s.bytes.numel() == nbytes) return s.bytes;
    }
    throw loom::Error("test: no storage " + key);
  };
  return ckpt::PickleReader(pkl, load, std::nullopt).read();
}

// A pickle's body: the bytes between PROTO 2 and STOP.
std::string body(const std::string& pkl) {
  REQUIRE(pkl.size() >= 3);
  REQUIRE(pkl.substr(0, 2) == "\x80\x02");
  REQUIRE(pkl.back() == '.');
  return pkl.substr(2, pkl.size() - 3);
}
std::string with_header(const std::string& b) {
  return op(ckpt::Opcode::Proto) + '\2' + b + op(ckpt::Opcode::Stop);
}

// A torch.save file around a pickle, as load_bytes reads it (as tests/fuzz wraps its inputs).
std::string file_of(const std::string& pkl) {
  std::string out;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* p, size_t n) {
    out.append(static_cast<const char*>(p), n);
    return n;
  });
  writer.writeRecord("data.pkl", pkl.data(), pkl.size());
  writer.writeRecord("byteorder", "little", 6);
  writer.writeEndOfFile();
  return out;
}

void same(const c10::IValue& a, const c10::IValue& b, const std::string& where) {
  CHECK(loom::testing::difference(a, b, loom::testing::Layout::Exact, where) == "");
}

std::vector<std::pair<const char*, c10::IValue>> leaves() {
  return {{"an int", int64_t{1}},
          {"None", c10::IValue()},
          {"a str", std::string("leaf")},
          {"an empty list", List(c10::AnyType::get())},
          {"an empty dict", Dict(c10::AnyType::get(), c10::AnyType::get())},
          {"an empty tuple", c10::ivalue::Tuple::create(std::vector<c10::IValue>{})},
          {"a tensor", at::arange(6, at::kFloat).view({2, 3})},
          {"a device", c10::Device("cpu")}};
}

}  // namespace

TEST_CASE("pickle: a list nested at the depth limit round-trips, one level deeper is refused",
          "[checkpoint][pickle]") {
  const auto at_limit = nest(int64_t{1}, kLimit, 0);
  const auto too_deep = nest(int64_t{1}, kLimit + 1, 0);
  REQUIRE(nesting(at_limit) == kLimit);
  REQUIRE(nesting(too_deep) == kLimit + 1);

  SECTION("in memory, through PickleWriter and PickleReader") {
    const auto got = unpickle(pickle(at_limit).pkl);
    CHECK(nesting(got) == kLimit);
    same(got, at_limit, "at the limit");
    CHECK_THROWS_AS(pickle(too_deep), loom::Error);
    CHECK_THROWS_WITH(pickle(too_deep), Contains("cannot save") && Contains(kTooDeep));
  }
  SECTION("as a torch.save file, through save_value and load_value") {
    const auto dir =
        std::filesystem::temp_directory_path() / ("loom-pickle-test-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const auto path = dir / "deep.pt";
    loom::checkpoint::save_value(path, at_limit);
    const auto got = loom::checkpoint::load_value(path);
    CHECK(nesting(got) == kLimit);
    same(got, at_limit, "loaded");
    same(loom::checkpoint::load_bytes(loom::checkpoint::save_bytes(at_limit)), at_limit, "bytes");

    // One level deeper: refused before any file is written, so none exists that loom can't read.
    const auto deeper = dir / "deeper.pt";
    CHECK_THROWS_WITH(loom::checkpoint::save_value(deeper, too_deep), Contains(kTooDeep));
    CHECK_THROWS_WITH(loom::checkpoint::save_bytes(too_deep), Contains(kTooDeep));
    CHECK_FALSE(std::filesystem::exists(deeper));
    int files = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++files;
    CHECK(files == 1);  // deep.pt, and no temporary
    std::filesystem::remove_all(dir);
  }
}

TEST_CASE("pickle: the reader refuses a pickle nested one level past the limit",
          "[checkpoint][pickle]") {
  using O = ckpt::Opcode;
  // `n` lists around None, spelled as the writer spells them: PROTO 2, n x (EMPTY_LIST MARK),
  // NONE, n x APPENDS, STOP.
  auto lists = [](int n) {
    std::string b;
    for (int i = 0; i < n; ++i) b += op(O::EmptyList) + op(O::Mark);
    b += op(O::None);
    for (int i = 0; i < n; ++i) b += op(O::Appends);
    return with_header(b);
  };
  // At the limit the crafted bytes are the writer's, and they read back.
  const auto at_limit = nest(c10::IValue(), kLimit, 0);
  REQUIRE(lists(kLimit) == pickle(at_limit).pkl);
  const auto got = unpickle(lists(kLimit));
  CHECK(nesting(got) == kLimit);
  same(got, at_limit, "read");

  // One level deeper: what the old writer (limit 512) wrote, and what the reader refuses.
  CHECK_THROWS_AS(unpickle(lists(kLimit + 1)), loom::Error);
  CHECK_THROWS_WITH(unpickle(lists(kLimit + 1)),
                    Contains("corrupt or unsupported checkpoint") && Contains(kTooDeep));
  CHECK_THROWS_WITH(loom::checkpoint::load_bytes(file_of(lists(kLimit + 1))), Contains(kTooDeep));
  CHECK(nesting(loom::checkpoint::load_bytes(file_of(lists(kLimit)))) == kLimit);
}

TEST_CASE("pickle: the writer refuses exactly what the reader refuses, for every container",
          "[checkpoint][pickle]") {
  // Each shape alone, and all of them in turn, around each kind of leaf: at the limit the value
  // round-trips; one level deeper the writer refuses it, and the reader refuses the bytes the
  // writer would have written for it (its body at the limit, wrapped once more).
  std::vector<std::pair<std::string, std::size_t>> kinds;
  for (std::size_t k = 0; k < shapes().size(); ++k) kinds.emplace_back(shapes()[k].name, k);
  kinds.emplace_back("every container in turn", std::string::npos);
  for (const auto& [kind, k] : kinds) {
    // The outermost container of a value nested n deep (when nested in turn).
    const auto& outer = shapes()[k == std::string::npos ? kLimit % shapes().size() : k];
    for (const auto& [leaf_name, leaf] : leaves()) {
      INFO(kind << " around " << leaf_name);
      const auto at_limit = nest(leaf, kLimit, k);
      const auto too_deep = outer.wrap(at_limit);
      REQUIRE(nesting(at_limit) == kLimit);
      REQUIRE(nesting(too_deep) == kLimit + 1);

      const auto pickled = pickle(at_limit);
      const auto got = unpickle(pickled.pkl, pickled.storages);
      CHECK(nesting(got) == kLimit);
      same(got, at_limit, "read");

      CHECK_THROWS_WITH(pickle(too_deep), Contains(kTooDeep));
      // The crafted wrapping is the writer's own one level below the limit...
      const auto below = pickle(nest(leaf, kLimit - 1, k)).pkl;
      const auto& below_outer =
          shapes()[k == std::string::npos ? (kLimit - 1) % shapes().size() : k];
      REQUIRE(with_header(below_outer.wrap_body(body(below))) == pickled.pkl);
      // ...and one level above it the reader refuses it with the same limit.
      CHECK_THROWS_WITH(unpickle(with_header(outer.wrap_body(body(pickled.pkl))), pickled.storages),
                        Contains(kTooDeep));
    }
  }
}

TEST_CASE("pickle: depth is the deepest branch's, wherever it lies", "[checkpoint][pickle]") {
  // A shallow element first and the deep one last, in a dict and in a list.
  auto deep_last = [](int n) {
    Dict d(c10::AnyType::get(), c10::AnyType::get());
    d.insert(std::string("shallow"), int64_t{1});
    List l(c10::AnyType::get());
    l.push_back(int64_t{2});
    l.push_back(nest(int64_t{3}, n - 2, std::string::npos));
    d.insert(std::string("deep"), l);
    return c10::IValue(d);
  };
  const auto ok = deep_last(kLimit);
  REQUIRE(nesting(ok) == kLimit);
  const auto pickled = pickle(ok);
  same(unpickle(pickled.pkl), ok, "read");
  const auto too_deep = deep_last(kLimit + 1);
  REQUIRE(nesting(too_deep) == kLimit + 1);
  CHECK_THROWS_WITH(pickle(too_deep), Contains(kTooDeep));
}
