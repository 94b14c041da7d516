// loom::split_microbatches: micro-batches of a nested batch along dimension 0.
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>
#include "support/catch.hpp"

#include <loom/batch/adapt.hpp>
#include <loom/batch/split.hpp>

namespace {
struct Pair {
  at::Tensor x;
  at::Tensor y;
  std::string tag;
};
}  // namespace

BOOST_HANA_ADAPT_STRUCT(Pair, x, y, tag);

TEST_CASE("split_microbatches cuts every tensor of a tuple as tensor_split does", "[batch]") {
  const auto x = at::arange(20).reshape({10, 2});
  const auto y = at::arange(10);
  const auto micro = loom::split_microbatches(std::make_tuple(x, y, 7), 4);
  REQUIRE(micro.size() == 4);
  // 10 samples in 4: 3, 3, 2, 2 (the first 10 % 4 one larger), as torch.tensor_split.
  const auto expected = at::tensor_split(y, 4);
  std::int64_t at_sample = 0;
  for (std::size_t i = 0; i < micro.size(); ++i) {
    const auto& [mx, my, seven] = micro[i];
    CHECK(my.equal(expected[i]));
    CHECK(mx.equal(x.narrow(0, at_sample, my.size(0))));
    CHECK(mx.size(1) == 2);
    CHECK(seven == 7);
    // Views of the batch, no copy.
    CHECK(mx.data_ptr() == x[at_sample].data_ptr());
    at_sample += my.size(0);
  }
  CHECK(at_sample == 10);
  CHECK(std::get<1>(micro[0]).size(0) == 3);
  CHECK(std::get<1>(micro[3]).size(0) == 2);
}

TEST_CASE("split_microbatches walks maps, Hana structs and optionals", "[batch]") {
  std::map<std::string, at::Tensor> m{{"a", at::ones({8, 3})}, {"b", at::zeros({8})}};
  const auto pieces = loom::split_microbatches(m, 2);
  REQUIRE(pieces.size() == 2);
  CHECK(pieces[1].at("a").sizes() == at::IntArrayRef{4, 3});
  CHECK(pieces[1].at("b").sizes() == at::IntArrayRef{4});

  Pair p{at::arange(6).to(at::kFloat), at::arange(6), "kept"};
  const auto parts = loom::split_microbatches(p, 3);
  REQUIRE(parts.size() == 3);
  CHECK(parts[2].y.equal(at::arange(4, 6)));
  CHECK(parts[2].tag == "kept");

  std::optional<at::Tensor> none;
  const auto with_none = loom::split_microbatches(std::make_tuple(at::ones({4}), none), 4);
  CHECK_FALSE(std::get<1>(with_none[3]).has_value());
  // n = 1: the batch itself, as one micro-batch.
  const auto one = loom::split_microbatches(at::arange(5), 1);
  REQUIRE(one.size() == 1);
  CHECK(one[0].equal(at::arange(5)));
}

TEST_CASE("split_microbatches refuses what it cannot split, naming it", "[batch]") {
  using Catch::Contains;
  CHECK_THROWS_WITH(loom::split_microbatches(at::arange(4), 5),
                    Contains("n is 5 but the batch holds 4 samples; n must be from 1 to 4"));
  CHECK_THROWS_WITH(loom::split_microbatches(at::arange(4), 0), Contains("n is 0"));
  CHECK_THROWS_WITH(loom::split_microbatches(std::make_tuple(at::ones({4}), at::ones({3})), 2),
                    Contains("differ in size along dimension 0 (") &&
                        Contains("every tensor must hold the same samples"));
  CHECK_THROWS_WITH(loom::split_microbatches(std::make_tuple(at::ones({4}), at::ones({})), 2),
                    Contains("a 0-dim tensor"));
  CHECK_THROWS_WITH(loom::split_microbatches(std::make_tuple(1, std::string("x")), 2),
                    Contains("the batch holds no tensor to split"));
}
