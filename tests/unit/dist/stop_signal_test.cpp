// loom::StopSignal: signals become a flag, should_stop agrees on it (one process here; two
// ranks in the dist.preempt test), handlers come back when it goes.
#include "support/catch.hpp"
#include "support/warnings.hpp"

#include <csignal>

#include <loom/dist/stop_signal.hpp>
#include <loom/loom.hpp>

using Catch::Matchers::Contains;

namespace {

/// The handler installed for `sig` right now.
void (*handler_of(int sig))(int) {
  struct sigaction now {};
  sigaction(sig, nullptr, &now);
  return now.sa_handler;
}

int calls_seen = 0;
void counting_handler(int) { ++calls_seen; }

}  // namespace

TEST_CASE("StopSignal turns SIGTERM, SIGINT and SIGUSR1 into a flag", "[stop]") {
  loom::StopSignal::clear();
  loom::Runtime<loom::Cpu, loom::Fp32> rt;
  for (int sig : {SIGTERM, SIGINT, SIGUSR1}) {
    loom::StopSignal stop;
    REQUIRE_FALSE(stop.should_stop(rt));
    CHECK(stop.signal() == 0);
    CHECK(stop.exit_code() == 0);
    REQUIRE(std::raise(sig) == 0);  // the process lives on: only the flag is set
    CHECK(loom::StopSignal::received() == sig);
    CHECK(stop.should_stop(rt));
    CHECK(stop.signal() == sig);
    CHECK(stop.exit_code() == 128 + sig);
    CHECK(stop.should_stop(rt));  // once agreed, it stays agreed
    loom::StopSignal::clear();
  }
  CHECK(loom::StopSignal::received() == 0);
}

TEST_CASE("StopSignal gives the previous handlers back", "[stop]") {
  loom::StopSignal::clear();
  std::signal(SIGUSR1, &counting_handler);
  {
    loom::StopSignal stop;
    CHECK(handler_of(SIGUSR1) != &counting_handler);
    std::raise(SIGUSR1);
    CHECK(calls_seen == 0);
    CHECK(loom::StopSignal::received() == SIGUSR1);
  }
  CHECK(handler_of(SIGUSR1) == &counting_handler);
  std::raise(SIGUSR1);
  CHECK(calls_seen == 1);
  // The flag belongs to the process: it outlives the StopSignal that caught it.
  CHECK(loom::StopSignal::received() == SIGUSR1);
  loom::StopSignal::clear();
  std::signal(SIGUSR1, SIG_DFL);
}

TEST_CASE("StopSignal handles only the signals it is given, and request() stops by hand",
          "[stop]") {
  loom::StopSignal::clear();
  loom::Runtime<loom::Cpu, loom::Fp32> rt;
  const auto before = handler_of(SIGINT);
  loom::StopSignal stop(loom::StopSignalOptions{.signals = {SIGUSR1}, .check_every = 1});
  CHECK(handler_of(SIGINT) == before);
  CHECK_FALSE(stop.should_stop(rt));
  loom::StopSignal::request(SIGTERM);
  CHECK(stop.should_stop(rt));
  CHECK(stop.exit_code() == 143);
  loom::StopSignal::clear();
}

TEST_CASE("StopSignal refuses check_every below 1", "[stop]") {
  CHECK_THROWS_WITH(loom::StopSignal(loom::StopSignalOptions{.check_every = 0}),
                    Contains("check_every must be at least 1"));
}
