// The roll call behind a failed collective's error (roll_call.hpp).
#include "roll_call.hpp"

#include <chrono>
#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <loom/detail/message_of.hpp>

namespace loom::dist::detail {
namespace {

constexpr std::chrono::milliseconds store_timeout{3000};
constexpr std::chrono::milliseconds answer_time{2000};
constexpr std::chrono::milliseconds poll_every{100};

std::string host_key(int rank) { return "loom/host/" + std::to_string(rank); }
std::string answer_key(int rank) { return "loom/roll_call/" + std::to_string(rank); }

/// The source address of a route to `host`: a UDP socket's connect() picks it and sends
/// nothing. Empty when `host` does not resolve or has no route.
std::string address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &found) != 0 || !found) return {};
  std::string address;
  for (addrinfo* a = found; a && address.empty(); a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t size = sizeof local;
    char text[INET6_ADDRSTRLEN] = {};
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &size) == 0) {
      const void* raw =
          local.ss_family == AF_INET6
              ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(&local)->sin6_addr)
              : static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(&local)->sin_addr);
      if (inet_ntop(local.ss_family, raw, text, sizeof text)) address = text;
    }
    close(fd);
  }
  freeaddrinfo(found);
  return address;
}

std::string to_string(const std::vector<std::uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

}  // namespace

void announce_host(c10d::Store& store, int rank, const std::string& master_addr) {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) std::strcpy(name, "?");
  const std::string address = address_towards(master_addr);
  const std::string text = (address.empty() ? std::string() : address + ", ") + "host " + name;
  store.set(host_key(rank), std::vector<std::uint8_t>(text.begin(), text.end()));
}

std::string roll_call(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
                      const std::string& where) {
  // The store's calls run on a thread of their own: a TCPStore client whose host is cut off
  // blocks in its socket far longer than any timeout set on the store, and this rank must
  // leave with its error in bounded time. The thread keeps the store alive and is left
  // behind, blocked, when the store does not answer. It reports twice: once its own answer is
  // written, then the ranks that did not answer, each with the address it announced.
  struct Call {
    std::promise<void> answered;
    std::promise<std::vector<std::string>> missing;
  };
  auto call = std::make_shared<Call>();
  auto answered = call->answered.get_future();
  auto missing = call->missing.get_future();
  std::thread([call, store, rank, world_size] {
    bool said = false;
    try {
      store->set(answer_key(rank), std::vector<std::uint8_t>{'1'});
      call->answered.set_value();
      said = true;
      std::vector<int> silent;
      const auto deadline = std::chrono::steady_clock::now() + answer_time;
      for (;;) {
        silent.clear();
        for (int r = 0; r < world_size; ++r) {
          if (!store->check({answer_key(r)})) silent.push_back(r);
        }
        if (silent.empty() || std::chrono::steady_clock::now() >= deadline) break;
        std::this_thread::sleep_for(poll_every);
      }
      std::vector<std::string> names;
      for (int r : silent) {
        std::string name = "rank " + std::to_string(r);
        if (store->check({host_key(r)})) name += " (" + to_string(store->get(host_key(r))) + ")";
        names.push_back(std::move(name));
      }
      call->missing.set_value(std::move(names));
    } catch (...) {
      if (!said) call->answered.set_exception(std::current_exception());
      call->missing.set_exception(std::current_exception());
    }
  }).detach();
  auto unreachable = [&](const std::string& why) {
    return "The rendezvous store at " + where + " does not answer this rank either (" + why +
           "): this rank has lost its link to " + where.substr(0, where.rfind(':')) +
           ", or the process that hosts the store there (rank 0, or torchrun's agent) is gone.";
  };
  std::vector<std::string> names;
  try {
    if (answered.wait_for(store_timeout) != std::future_status::ready) {
      return unreachable("no reply within " + std::to_string(store_timeout.count() / 1000) + " s");
    }
    answered.get();
    if (missing.wait_for(answer_time + 2 * store_timeout) != std::future_status::ready) {
      return unreachable("it stopped replying during the roll call");
    }
    names = missing.get();
  } catch (...) {
    std::string text = loom::detail::message_of(std::current_exception());
    if (const auto cut = text.find('\n'); cut != std::string::npos) text.resize(cut);
    return unreachable(text);
  }
  if (names.empty()) {
    return "Every rank answered a roll call through the rendezvous store: none has died or "
           "lost its link (look for a rank that stopped calling collectives).";
  }
  std::string list;
  for (const auto& name : names) list += (list.empty() ? "" : "; ") + name;
  return "Ranks that did not answer a roll call through the rendezvous store within " +
         std::to_string(answer_time.count() / 1000) + " s: " + list +
         ": they have died, lost their link to this host or still wait in a collective.";
}

}  // namespace loom::dist::detail
