// loom::Ddp's environment: torchrun's variables (read_environment), the agent's death, SIGPIPE.
#include <loom/dist/process_group.hpp>

#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#ifdef __linux__
#include <sys/prctl.h>
#include <unistd.h>
#endif

#include <loom/detail/env.hpp>
#include <loom/error.hpp>

#include "common.hpp"

namespace loom::dist {

namespace {

constexpr std::string_view who = "loom::Ddp";

const char* env(const char* name) { return std::getenv(name); }

}  // namespace

Environment read_environment() {
  Environment e;
  const char* rank = env("RANK");
  const char* world = env("WORLD_SIZE");
  const char* local = env("LOCAL_RANK");
  const char* addr = env("MASTER_ADDR");
  const char* port = env("MASTER_PORT");
  e.single_process = !rank && !world && !local && !addr && !port;
  e.world_size = loom::detail::parse_env_index(world, who, "WORLD_SIZE", INT_MAX).value_or(1);
  if (e.world_size < 1) {
    throw Error("loom::Ddp: WORLD_SIZE is \"0\"; a run has at least one process");
  }
  e.rank = loom::detail::parse_env_index(rank, who, "RANK", INT_MAX).value_or(0);
  if (e.rank >= e.world_size) {
    throw Error("loom::Ddp: RANK is " + std::to_string(e.rank) + " but WORLD_SIZE is " +
                std::to_string(e.world_size) + "; RANK must be from 0 to WORLD_SIZE - 1");
  }
  e.local_rank = loom::detail::parse_env_index(local, who, "LOCAL_RANK", INT_MAX).value_or(0);
  e.node_rank =
      loom::detail::parse_env_index(env("GROUP_RANK"), who, "GROUP_RANK", INT_MAX).value_or(0);
  if (addr) e.master_addr = addr;
  if (port) e.master_port = loom::detail::parse_env_index(port, who, "MASTER_PORT", 65535).value();
  if (e.world_size > 1 && (!addr || e.master_addr.empty() || !port)) {
    throw Error("loom::Ddp: WORLD_SIZE is " + std::to_string(e.world_size) + " but " +
                std::string(!addr || e.master_addr.empty() ? "MASTER_ADDR" : "MASTER_PORT") +
                " is not set; start the processes with torchrun, or set MASTER_ADDR and "
                "MASTER_PORT to rank 0's address and a free port on every rank");
  }
  const char* agent = env("TORCHELASTIC_USE_AGENT_STORE");
  e.agent_store = agent && std::string_view(agent) == "True";
  e.under_agent = env("TORCHELASTIC_RUN_ID") != nullptr;
  e.restart_count = loom::detail::parse_env_index(env("TORCHELASTIC_RESTART_COUNT"), who,
                                                  "TORCHELASTIC_RESTART_COUNT", INT_MAX)
                        .value_or(0);
  e.max_restarts = loom::detail::parse_env_index(env("TORCHELASTIC_MAX_RESTARTS"), who,
                                                 "TORCHELASTIC_MAX_RESTARTS", INT_MAX)
                       .value_or(0);
  return e;
}

namespace detail {

/// Under torchrun's agent: the kernel kills this process when its parent (the agent, which
/// started it) dies. A parent that died between getppid() and prctl() changed getppid()
/// (this process went to init or a subreaper): then it leaves now. One that died earlier
/// took its store with it, and connecting fails within DdpOptions::timeout.
void die_with_parent() {
#ifdef __linux__
  const pid_t parent = getppid();
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) {
    throw Error(std::string("loom::Ddp: prctl(PR_SET_PDEATHSIG) failed: ") + std::strerror(errno));
  }
  if (getppid() != parent) {
    throw Error(
        "loom::Ddp: torchrun's agent, which started this worker, has exited (TORCHELASTIC_RUN_ID "
        "is set but the parent process is gone); leaving without training");
  }
#endif
}

/// A write to a socket whose peer died raises SIGPIPE, whose default action ends the process
/// before gloo can report the dead rank. Python ignores SIGPIPE at start-up, so Python DDP sees
/// an error instead; a process that left SIGPIPE at its default gets the same. A handler the
/// program installed is kept.
void ignore_default_sigpipe() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    std::signal(SIGPIPE, SIG_IGN);
  }
}

}  // namespace detail

}  // namespace loom::dist
