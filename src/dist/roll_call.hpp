#pragma once
// After a failed collective: which peers are gone. gloo's timeouts name no peer ("Timed out
// waiting 20000ms for recv operation to complete"); the rendezvous store, which every rank
// reaches independently of the collectives, can tell which ranks are still there. Internal
// to the loom::dist library.
#include <string>

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace loom::dist::detail {

/// Records, at setup, how the others can name this rank: its address on the route to
/// `master_addr` (the rendezvous host) and the machine's host name.
void announce_host(c10d::Store& store, int rank, const std::string& master_addr);

/// One sentence for a failed collective's error: every rank that fails writes its name to the
/// store and waits up to two seconds for the others; the ranks that did not answer are named
/// with their addresses ("they have died, lost their link or still wait in a collective").
/// The store's calls run on a thread that is left behind when the store does not answer, so
/// the sentence comes within 11 s whatever the network does (3 s for the answer, 8 s for the
/// others' answers and their addresses; 2 s when a rank is gone and the store answers). A store
/// that does not answer in time means that this rank lost its link to the store's host,
/// `where` (MASTER_ADDR:MASTER_PORT), or that the store's process is gone, and the sentence
/// says so.
std::string roll_call(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
                      const std::string& where);

}  // namespace loom::dist::detail
