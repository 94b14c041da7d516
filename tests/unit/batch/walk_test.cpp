// batch::map over every row of the dispatch table in batch/walk.hpp, and its laws.
#include <array>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <variant>
#include <vector>

#include <torch/data/example.h>
#include "support/catch.hpp"

#include <loom/batch/walk.hpp>

namespace {

struct Sample {
  at::Tensor image;
  std::vector<int64_t> ids;
  std::string tag;
};
struct Single {
  at::Tensor only;
};
struct Handle {  // holds no tensors; opted out
  int fd = 3;
};
enum class Split { train, test };

// Moves to the meta device: a real change of device that needs no accelerator.
const auto to_meta = [](const at::Tensor& t) { return t.to(c10::Device(c10::kMeta)); };
const auto identity = [](const at::Tensor& t) { return t; };

}  // namespace

BOOST_HANA_ADAPT_STRUCT(Sample, image, ids, tag);
BOOST_HANA_ADAPT_STRUCT(Single, only);
template <>
struct loom::opaque<Handle> : std::true_type {};

using loom::batch::map;

TEST_CASE("map applies f to a tensor and leaves undefined tensors alone", "[batch]") {
  auto t = at::ones({1, 1, 1, 1});
  auto m = map(t, to_meta);
  CHECK(m.is_meta());
  CHECK(m.sizes() == t.sizes());
  at::Tensor undefined;
  CHECK_FALSE(map(undefined, to_meta).defined());
}

TEST_CASE("map keeps tuples, pairs and non-tensor leaves", "[batch]") {
  auto image = at::zeros({2, 3});
  auto target = at::arange(2);
  auto b = std::make_tuple(image, target, 7, 2.5, std::string("x"), Split::test);
  auto m = map(b, to_meta);
  STATIC_REQUIRE(std::is_same_v<decltype(m), decltype(b)>);
  CHECK(std::get<0>(m).is_meta());
  CHECK(std::get<1>(m).is_meta());
  CHECK(std::get<1>(m).scalar_type() == at::kLong);
  CHECK(std::get<2>(m) == 7);
  CHECK(std::get<3>(m) == 2.5);
  CHECK(std::get<4>(m) == "x");
  CHECK(std::get<5>(m) == Split::test);
  auto p = map(std::make_pair(image, std::string("y")), to_meta);
  CHECK(p.first.is_meta());
  CHECK(p.second == "y");
}

TEST_CASE("map keeps sequences: vector, deque, array, in order", "[batch]") {
  std::vector<at::Tensor> v{at::full({1}, 1.0), at::full({1}, 2.0), at::full({1}, 3.0)};
  auto times10 = [](const at::Tensor& t) { return t * 10; };
  auto mv = map(v, times10);
  REQUIRE(mv.size() == 3);
  CHECK(mv[0].item<float>() == 10.f);
  CHECK(mv[2].item<float>() == 30.f);
  std::deque<at::Tensor> d(v.begin(), v.end());
  CHECK(map(d, times10)[1].item<float>() == 20.f);
  std::array<at::Tensor, 2> a{v[0], v[1]};
  auto ma = map(a, to_meta);
  CHECK(ma[0].is_meta());
  CHECK(ma[1].is_meta());
}

TEST_CASE("map keeps maps: keys, order and container type", "[batch]") {
  std::map<std::string, at::Tensor> m{{"image", at::ones({2})}, {"target", at::zeros({2})}};
  auto mm = map(m, to_meta);
  STATIC_REQUIRE(std::is_same_v<decltype(mm), decltype(m)>);
  REQUIRE(mm.size() == 2);
  CHECK(mm.begin()->first == "image");
  CHECK(mm.at("image").is_meta());
  CHECK(mm.at("target").is_meta());

  std::unordered_map<std::string, at::Tensor> u;
  for (int i = 0; i < 20; ++i) {
    std::string key = "k";
    key += std::to_string(i);
    u.emplace(key, at::full({1}, i));
  }
  auto mu = map(u, to_meta);
  auto it = u.begin();
  for (auto& [k, t] : mu) {  // same iteration order as the source
    CHECK(k == it->first);
    CHECK(t.is_meta());
    ++it;
  }
}

TEST_CASE("map walks optional and variant", "[batch]") {
  std::optional<at::Tensor> some = at::ones({1}), none;
  CHECK(map(some, to_meta)->is_meta());
  CHECK_FALSE(map(none, to_meta).has_value());
  std::variant<int, at::Tensor, std::string> v = at::ones({1});
  auto mv = map(v, to_meta);
  REQUIRE(mv.index() == 1);
  CHECK(std::get<1>(mv).is_meta());
  std::variant<int, at::Tensor, std::string> s = std::string("keep");
  CHECK(std::get<2>(map(s, to_meta)) == "keep");
}

TEST_CASE("map walks torch::data::Example and Hana structs", "[batch]") {
  torch::data::Example<> e(at::ones({2, 2}), at::arange(2));
  auto me = map(e, to_meta);
  CHECK(me.data.is_meta());
  CHECK(me.target.is_meta());
  torch::data::TensorExample te(at::ones({1}));
  CHECK(map(te, to_meta).data.is_meta());

  Sample s{at::ones({3}), {4, 5}, "cat"};
  auto ms = map(s, to_meta);
  CHECK(ms.image.is_meta());
  CHECK((ms.ids == std::vector<int64_t>{4, 5}));
  CHECK(ms.tag == "cat");
  Single one{at::ones({1})};
  CHECK(map(one, to_meta).only.is_meta());  // single-field struct (Composer's namedtuple bug)

  std::vector<Handle> handles{{5}};
  CHECK(map(handles, to_meta)[0].fd == 5);  // opaque: passed through
}

TEST_CASE("map walks a Mask R-CNN style batch", "[batch]") {
  using Targets = std::map<std::string, at::Tensor>;
  std::vector<std::tuple<at::Tensor, Targets>> b;
  for (int i = 0; i < 3; ++i) {
    b.emplace_back(at::ones({3, 4, 4}),
                   Targets{{"boxes", at::zeros({2, 4})}, {"labels", at::arange(2)}});
  }
  std::size_t leaves = 0;
  auto m = map(b, [&](const at::Tensor& t) {
    ++leaves;
    return to_meta(t);
  });
  CHECK(leaves == 9);
  for (auto& [img, targets] : m) {
    CHECK(img.is_meta());
    CHECK(targets.at("boxes").is_meta());
    CHECK(targets.at("labels").scalar_type() == at::kLong);
  }
}

TEST_CASE("map returns the same tensors when f changes nothing", "[batch]") {
  auto t = at::ones({2});
  auto b = std::make_tuple(t, std::vector<at::Tensor>{t});
  auto m = map(b, identity);
  CHECK(std::get<0>(m).unsafeGetTensorImpl() == t.unsafeGetTensorImpl());
  CHECK(std::get<1>(m)[0].unsafeGetTensorImpl() == t.unsafeGetTensorImpl());
  // The source batch is not modified.
  auto moved = map(b, to_meta);
  CHECK_FALSE(std::get<0>(b).is_meta());
  CHECK(std::get<0>(moved).is_meta());
}
