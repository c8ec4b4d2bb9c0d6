#include "coll/batch.h"

#include <vector>

#include "coll/comm.h"
#include "coll/executor.h"

namespace ridge {

BufferUse bufferUse(const CollArgs& a, int rank, int nranks) {
  const size_t blocks =
      a.type == CollType::AllGather || a.type == CollType::ReduceScatter || a.type == CollType::AlltoAll
          ? static_cast<size_t>(nranks)
          : 1;
  BufferUse u;
  u.sendCount =
      a.type == CollType::ReduceScatter || a.type == CollType::AlltoAll ? a.count * blocks : a.count;
  u.recvCount = a.type == CollType::AllGather || a.type == CollType::AlltoAll ? a.count * blocks : a.count;
  u.readsSend = a.type != CollType::Recv && (a.type != CollType::Broadcast || a.root == rank);
  u.writesRecv = a.type != CollType::Send && (a.type != CollType::Reduce || a.root == rank);
  return u;
}

namespace {

// Runs a communicator's collectives in call order, then its point-to-point chains.
Task runSequence(ridgeComm* comm, std::vector<CollArgs> ops, std::vector<std::vector<CollArgs>> chains) {
  for (const CollArgs& a : ops) {
    Status s = co_await runCollective(comm, a);
    if (!s.isOk()) co_return s;
  }
  for (auto& chain : chains) {
    if (chain.empty()) continue;
    // A chain must not start before this strand finished the collectives (they share
    // the FIFOs), hence spawned here rather than up front. The awaiter is a named local:
    // GCC 12 destroyed the task inside a temporary awaiter twice, and a group holding a
    // collective and a send/receive crashed (test HostGroups.CollectiveAndExchangeInOneGroup).
    SpawnTask spawn{comm, runSequence(comm, std::move(chain), {})};
    co_await spawn;
  }
  co_return Status::ok();
}

// Whether every operation is a send or receive to a different (peer, direction): the usual
// point-to-point group (a sendrecv, a halo or all-to-all exchange), whose operations need no
// chains, so each becomes its own strand with nothing allocated. Bounded quadratic check:
// larger groups build the chains.
bool independentExchanges(const CollArgs* ops, size_t n) {
  if (n > 64) return false;
  for (size_t i = 0; i < n; ++i) {
    if (!isExchange(ops[i].type)) return false;
    for (size_t j = 0; j < i; ++j)
      if (ops[j].type == ops[i].type && ops[j].root == ops[i].root) return false;
  }
  return true;
}

}  // namespace

void spawnBatch(Executor& ex, ridgeComm* c, const CollArgs* ops, size_t n) {
  if (n == 1 || independentExchanges(ops, n)) {
    for (size_t i = 0; i < n; ++i) ex.spawn(c, runCollective(c, ops[i]));  // no vectors
    return;
  }
  std::vector<CollArgs> colls;
  // chains[2*peer] = sends to peer, chains[2*peer+1] = receives from peer
  std::vector<std::vector<CollArgs>> chains(2 * static_cast<size_t>(c->nranks));
  for (size_t i = 0; i < n; ++i) {
    const CollArgs& a = ops[i];
    if (a.type == CollType::Send)
      chains[2 * a.root].push_back(a);
    else if (a.type == CollType::Recv)
      chains[2 * a.root + 1].push_back(a);
    else
      colls.push_back(a);
  }
  if (colls.empty()) {
    for (auto& chain : chains)
      if (!chain.empty()) ex.spawn(c, runSequence(c, std::move(chain), {}));
  } else {
    ex.spawn(c, runSequence(c, std::move(colls), std::move(chains)));
  }
}

}  // namespace ridge
