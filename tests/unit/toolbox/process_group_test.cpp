// loom::dist::ProcessGroup and the Collectives rows in one process: what a group says before
// and after connect, the errors it names itself by, and agree / agree_on. Two and more ranks:
// dist.* (tests/dist/run_dist.py) and checkpoint.resume.seam.
#include "support/catch.hpp"

#ifdef LOOM_TEST_DIST

#include <chrono>
#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include <loom/detail/agree_on_failure.hpp>
#include <loom/dist/process_group.hpp>
#include <loom/loom.hpp>

#include "support/env.hpp"

using Catch::Matchers::Equals;
using Catch::Matchers::Message;
using loom::testing::EnvGuard;

namespace {

/// No torchrun variable: one process.
struct OneProcess {
  EnvGuard rank{"RANK", nullptr}, world{"WORLD_SIZE", nullptr}, local{"LOCAL_RANK", nullptr};
  EnvGuard addr{"MASTER_ADDR", nullptr}, port{"MASTER_PORT", nullptr};
  EnvGuard agent{"TORCHELASTIC_RUN_ID", nullptr};
};

static_assert(loom::Collectives<loom::SingleProcess>);
static_assert(loom::Collectives<loom::Ddp>);
static_assert(loom::Collectives<loom::Zero>);

}  // namespace

TEST_CASE(
    "ProcessGroup in one process: the ranks, a connect that records, collectives that "
    "return their input",
    "[dist][process_group]") {
  OneProcess env;
  loom::dist::ProcessGroup g("my_strategy");
  CHECK(g.rank() == 0);
  CHECK(g.world_size() == 1);
  CHECK(g.local_rank() == 0);
  CHECK(g.node_rank() == 0);
  CHECK(g.environment().single_process);
  CHECK(g.name() == "my_strategy");
  CHECK(g.backend().empty());
  CHECK(g.options().timeout == std::chrono::minutes(5));

  g.connect(c10::Device(c10::kCPU), "gloo");
  CHECK_FALSE(g.connected());  // one process: no store, no group
  CHECK(g.backend() == "gloo");
  CHECK(g.device() == c10::Device(c10::kCPU));
  CHECK_THROWS_MATCHES(g.connect(c10::Device(c10::kCPU), "gloo"), loom::Error,
                       Message("my_strategy: the process group's connect() was called a second "
                               "time"));

  at::Tensor t = at::arange(4, at::kFloat);
  g.all_reduce(t, loom::dist::ReduceOp::Sum);
  CHECK(t.equal(at::arange(4, at::kFloat)));
  g.all_reduce(t, loom::dist::ReduceOp::Mean);
  CHECK(t.equal(at::arange(4, at::kFloat)));
  at::Tensor ints = at::arange(4, at::kLong);
  CHECK_THROWS_MATCHES(g.all_reduce(ints, loom::dist::ReduceOp::Mean), loom::Error,
                       Message("my_strategy::all_reduce: ReduceOp::Mean needs a floating tensor, "
                               "not Long"));
  g.broadcast(t, 0);
  CHECK_THROWS_MATCHES(g.broadcast(t, 1), loom::Error,
                       Message("my_strategy::broadcast: source rank 1 is not in [0, 0]"));
  const std::vector<at::Tensor> all = g.all_gather(t);
  REQUIRE(all.size() == 1);
  CHECK(all[0].equal(t));
  CHECK(all[0].data_ptr() != t.data_ptr());  // a copy
  CHECK(g.broadcast_object(std::string("hello"), 0) == "hello");
  const loom::StateDict dict{{"step", c10::IValue(int64_t{7})}};
  CHECK(g.broadcast_object(dict, 0).at("step").toInt() == 7);
  g.barrier();
  g.barrier("named");
  g.teardown();
  g.teardown();  // a second teardown does nothing
}

TEST_CASE("ProcessGroup refuses a timeout that is not positive and a backend it cannot connect",
          "[dist][process_group]") {
  OneProcess env;
  loom::dist::GroupOptions zero_timeout;
  zero_timeout.timeout = std::chrono::milliseconds(0);
  CHECK_THROWS_MATCHES(loom::dist::ProcessGroup("my_strategy", zero_timeout), loom::Error,
                       Message("my_strategy: GroupOptions::timeout must be positive"));
  loom::dist::ProcessGroup g("my_strategy");
  CHECK_THROWS_MATCHES(g.connect(c10::Device(c10::kCPU), "mpi"), loom::Error,
                       Message("my_strategy: the backend \"mpi\" is not available; loom::Ddp runs "
                               "on \"gloo\" (CPU, CUDA) and \"nccl\" (CUDA)"));
  loom::dist::GroupOptions gloo;
  gloo.backend = "gloo";  // the options' backend wins over connect's
  loom::dist::ProcessGroup chosen("my_strategy", gloo);
  chosen.connect(c10::Device(c10::kCPU), "nccl");
  CHECK(chosen.backend() == "gloo");
}

TEST_CASE("agree and agree_on: one process throws its own failure with the step's name",
          "[dist][process_group]") {
  OneProcess env;
  loom::dist::ProcessGroup g("my_strategy");
  g.connect(c10::Device(c10::kCPU), "gloo");
  g.agree("", "loom::save: writing f.pt");  // nobody failed
  CHECK_THROWS_MATCHES(g.agree("disk full", "loom::save: writing f.pt"), loom::Error,
                       Message("loom::save: writing f.pt failed on rank 0: disk full"));
  loom::SingleProcess one;
  one.agree("", "a step");
  CHECK_THROWS_MATCHES(one.agree("no", "a step"), loom::Error,
                       Message("a step failed on rank 0: no"));

  int ran = 0;
  loom::detail::agree_on(one, "a step", [&] { ++ran; });
  CHECK(ran == 1);
  CHECK_THROWS_MATCHES(
      loom::detail::agree_on(one, "a step", [] { throw std::runtime_error("boom"); }), loom::Error,
      Message("a step failed on rank 0: boom"));
  CHECK_THROWS_MATCHES(loom::detail::agree_on(g, "a step", [] { throw std::runtime_error(""); }),
                       loom::Error, Message("a step failed on rank 0: an error with no message"));
  CHECK(loom::detail::failure_of(std::exception_ptr()).empty());
  CHECK_THAT(loom::detail::failure_of(std::make_exception_ptr(std::runtime_error("x"))),
             Equals("x"));
}

#endif  // LOOM_TEST_DIST
