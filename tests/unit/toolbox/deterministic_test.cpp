// loom::configure_deterministic_mode and loom::DeterministicMode: Composer's four settings, what
// they do to LibTorch, and the settings before them back.
#include "support/catch.hpp"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>

#include <ATen/ATen.h>

#include <loom/deterministic.hpp>

TEST_CASE("Deterministic mode sets Composer's four settings and restores the ones before",
          "[deterministic]") {
  ::unsetenv("CUBLAS_WORKSPACE_CONFIG");
  const auto before = loom::DeterministicSettings::current();
  REQUIRE_FALSE(before.algorithms);
  REQUIRE_FALSE(before.cublas_workspace_config.has_value());
  {
    loom::DeterministicMode mode;
    CHECK(mode.before() == before);
    const auto now = loom::DeterministicSettings::current();
    CHECK(now.algorithms);
    CHECK_FALSE(now.algorithms_warn_only);
    CHECK(now.cudnn_deterministic);
    CHECK_FALSE(now.cudnn_benchmark);
    CHECK(std::string(std::getenv("CUBLAS_WORKSPACE_CONFIG")) == ":4096:8");
    CHECK(now == loom::deterministic_settings());

    // An op without a deterministic implementation throws; new memory is filled.
    auto t = at::zeros({3});
    CHECK_THROWS_WITH(t.put_(at::tensor({int64_t{0}}), at::ones({1}), /*accumulate=*/false),
                      Catch::Matchers::Contains("does not have a deterministic implementation"));
    CHECK(at::empty({4}).isnan().all().item<bool>());
    CHECK(at::empty({4}, at::kLong).eq(std::numeric_limits<int64_t>::max()).all().item<bool>());
  }
  CHECK(loom::DeterministicSettings::current() == before);
  CHECK(std::getenv("CUBLAS_WORKSPACE_CONFIG") == nullptr);
  auto t = at::zeros({3});
  t.put_(at::tensor({int64_t{0}}), at::ones({1}), false);  // allowed again
  CHECK(t[0].item<float>() == 1.0f);
}

TEST_CASE("Deterministic mode can warn instead of throwing, and configure returns the old",
          "[deterministic]") {
  ::setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8", 1);
  const auto old = loom::configure_deterministic_mode(/*warn_only=*/true);
  CHECK(old.cublas_workspace_config == std::string(":16:8"));
  CHECK(loom::DeterministicSettings::current().algorithms_warn_only);
  auto t = at::zeros({3});
  CHECK_NOTHROW(t.put_(at::tensor({int64_t{1}}), at::ones({1}), false));
  CHECK(t[1].item<float>() == 1.0f);
  old.apply();
  CHECK(loom::DeterministicSettings::current() == old);
  CHECK(std::string(std::getenv("CUBLAS_WORKSPACE_CONFIG")) == ":16:8");
  ::unsetenv("CUBLAS_WORKSPACE_CONFIG");
}
