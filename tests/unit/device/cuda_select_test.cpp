// loom::Cuda where CUDA may be missing (its names, its error without CUDA, strict LOCAL_RANK),
// and run-time device selection (parse_device, with_device).
// Each test holds on both kinds of machine: where CUDA is missing it checks the errors, where
// it is present the GPU suite (tests/gpu) checks the device itself.
#include <cstdlib>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <torch/cuda.h>
#include "support/catch.hpp"
#include "support/env.hpp"

#include <loom/concepts/device_policy.hpp>
#include <loom/device/cuda.hpp>
#include <loom/device/select.hpp>
#include <loom/precision/fp32.hpp>
#include <loom/runtime.hpp>

using Catch::Matchers::Contains;
using loom::device::Cpu;
using loom::device::Cuda;
using loom::device::Kind;
using loom::precision::Fp32;
using loom::testing::EnvGuard;

TEST_CASE("Cuda is a DevicePolicy with constant names", "[device][cuda]") {
  STATIC_REQUIRE(loom::DevicePolicy<Cuda>);
  STATIC_REQUIRE(Cuda::device_type() == c10::kCUDA);
  STATIC_REQUIRE(Cuda::name() == "cuda");
  STATIC_REQUIRE(Cuda::ddp_backend() == "nccl");
  STATIC_REQUIRE(sizeof(loom::Runtime<Cuda, Fp32>) > 0);
  // The prefetching view over a vector of batches type-checks (it runs in tests/gpu).
  using View = decltype(std::declval<const Cuda&>().dataloader_to_device(
      std::declval<std::vector<at::Tensor>&>(), loom::device::NoPrefetch{},
      loom::device::Prefetch{}));
  STATIC_REQUIRE(std::ranges::input_range<View>);
  STATIC_REQUIRE(std::is_same_v<std::ranges::range_value_t<View>, at::Tensor>);
}

TEST_CASE("Cuda::is_available agrees with torch, and construction follows it", "[device][cuda]") {
  CHECK(Cuda::is_available() == torch::cuda::is_available());
  if (!Cuda::is_available()) {
    CHECK_THROWS_AS(Cuda(), loom::Error);
    CHECK_THROWS_WITH(Cuda(), Contains("CUDA is not available") && Contains("Cpu"));
    CHECK_THROWS_WITH(Cuda(0), Contains("CUDA is not available"));
  } else {
    CHECK(Cuda().device().is_cuda());
  }
}

TEST_CASE("LOCAL_RANK must be a whole number", "[device][cuda]") {
  using loom::device::Cuda;
  {
    EnvGuard unset("LOCAL_RANK", nullptr);
    CHECK(Cuda::local_rank() == 0);
  }
  for (auto [text, index] : {std::pair{"0", 0}, std::pair{"3", 3}}) {
    EnvGuard env("LOCAL_RANK", text);
    CHECK(Cuda::local_rank() == index);
  }
  for (const char* bad : {"", "x", "1x", " 1", "-1", "1.0", "99999999999"}) {
    CAPTURE(bad);
    EnvGuard env("LOCAL_RANK", bad);
    CHECK_THROWS_WITH(Cuda::local_rank(), Contains("LOCAL_RANK is \"" + std::string(bad) + "\""));
  }
  // The constructor reads it before it looks for a device, so the message is the same here.
  EnvGuard env("LOCAL_RANK", "two");
  CHECK_THROWS_WITH(Cuda(), Contains("LOCAL_RANK is \"two\""));
  // An explicit index never reads LOCAL_RANK.
  if (!Cuda::is_available()) CHECK_THROWS_WITH(Cuda(0), Contains("CUDA is not available"));
}

TEST_CASE("parse_device accepts cpu, cuda, gpu and auto in any case", "[device][select]") {
  using loom::device::parse_device;
  CHECK(parse_device("cpu") == Kind::Cpu);
  CHECK(parse_device("CPU") == Kind::Cpu);
  CHECK(parse_device("Cuda") == Kind::Cuda);
  CHECK(parse_device("gpu") == Kind::Cuda);
  CHECK(parse_device("GPU") == Kind::Cuda);
  CHECK(parse_device("Auto") == (Cuda::is_available() ? Kind::Cuda : Kind::Cpu));
  CHECK_THROWS_AS(parse_device("magic_device"), loom::Error);
  CHECK_THROWS_WITH(parse_device("magic_device"), Contains("\"magic_device\""));
  CHECK_THROWS_WITH(parse_device(""), Contains("unknown device \"\""));
  CHECK_THROWS_WITH(parse_device("cuda:0"), Contains("cuda:0"));
}

TEST_CASE("with_device calls the callable with the selected policy", "[device][select]") {
  auto name_of = [](auto device) { return std::string(decltype(device)::name()); };
  CHECK(loom::device::with_device("CPU", name_of) == "cpu");
  CHECK(loom::device::with_device("auto", name_of) == (Cuda::is_available() ? "cuda" : "cpu"));
  if (!Cuda::is_available()) {
    CHECK_THROWS_WITH(loom::device::with_device("gpu", name_of), Contains("CUDA is not available"));
  }
  CHECK_THROWS_WITH(loom::device::with_device("tpu", name_of), Contains("\"tpu\""));
  int calls = 0;
  loom::device::with_device("cpu", [&](auto device) {
    loom::Runtime<decltype(device), Fp32> rt(device);
    calls += rt.device().device().is_cpu();
  });
  CHECK(calls == 1);
}
