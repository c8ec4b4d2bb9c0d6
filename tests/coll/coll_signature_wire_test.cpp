// Operation signatures on the wire (issue 19, item 1: "the check costs nothing measurable"):
// on shared memory the small all-pairs allreduce carries its header's digest in the slot's
// metadata (the tag extension of transports/transport.h) and the full header in the slot's last
// line, so the data slot holds the payload alone and the receiver reads no cache line more than
// without signatures. Reads the communicator's connectors, so it links the static library.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "coll/comm.h"
#include "coll/signature.h"
#include "rank_launcher.h"

namespace ridgetest {
namespace {

// Rank 1 looks at rank 0's slot of a 1 KiB allreduce before taking part in it: the slot holds
// the 4096 payload bytes alone, tagged with a digest, and the slot's last line holds the full
// header (rank 0's allreduce #1 of 1024 floats). Both ranks' allreduce then runs right.
// Without the tag extension the slot held 64 header bytes before the payload (4160 bytes).
TEST(CollSignatureWire, ShmSmallAllReduceCarriesItsDigestInTheSlotMetadata) {
  setLoopbackEnv();
  setenv("RIDGE_TIMEOUT", "20", 1);
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return;
  LaunchResult res = launchRanks(2, 60.0, [&](int me, Reporter& rep) {
    ridgeComm_t comm = initRank(2, id, me, rep);
    if (!comm) return 2;
    const size_t n = 1024;
    std::vector<float> in(n, static_cast<float>(me + 1)), out(n, -1.0f);
    if (me == 1) {
      ridge::RecvConnector* rx = comm->recvFrom[0];
      if (!rx->carriesTags()) {
        rep.line("SKIP the connector from rank 0 is not shared memory");
      } else {
        ridge::SlotInfo info;
        const void* slot = nullptr;
        const double until = nowSec() + scaledSeconds(20);
        while (!(slot = rx->tryPeek(&info)) && nowSec() < until) usleep(100);
        if (!slot) {
          rep.fail("peek", "rank 0's slot never arrived");
        } else {
          rep.line("BYTES " + std::to_string(info.bytes));
          if (info.tag == 0) rep.fail("tag", "the slot was posted without a tag");
          ridge::HeaderWire h;
          std::memcpy(&h, static_cast<const char*>(slot) + rx->slotBytes() - sizeof h, sizeof h);
          if (h.sig.magic != ridge::kSignatureMagic || h.sig.rank != 0 || h.sig.seq != 1 ||
              h.sig.count != n || h.sig.kind != static_cast<uint8_t>(ridge::CollType::AllReduce))
            rep.fail("cold header", "the slot's last line does not hold rank 0's allreduce #1 header");
          if (h.digest != info.tag) rep.fail("cold header", "its digest differs from the post's tag");
          float first;
          std::memcpy(&first, slot, sizeof first);
          if (first != 1.0f) rep.fail("payload", "the slot does not start with rank 0's data");
        }
      }
    }
    ridgeResult_t r = ridgeAllReduce(in.data(), out.data(), n, ridgeFloat32, ridgeSum, comm, nullptr);
    if (r != ridgeSuccess) rep.fail("allreduce", describeResult(r, comm));
    if (out[0] != 3.0f || out[n - 1] != 3.0f) rep.fail("allreduce", "wrong sum");
    ridgeCommDestroy(comm);
    return 0;
  });
  reportChildFailures(res, "peeked allreduce", true);
  const auto skipped = linesWith(res.ranks[1], "SKIP ");
  if (!skipped.empty()) GTEST_SKIP() << skipped[0];
  const auto bytes = linesWith(res.ranks[1], "BYTES ");
  ASSERT_EQ(bytes.size(), 1u);
  EXPECT_EQ(std::atoi(bytes[0].c_str()), 4096) << "the data slot carries more than the payload";
}

// A FIFO position reused by an untagged post after a tagged one arrives untagged: tagged small
// allreduces alternate with sends (whose header slot is untagged) for more rounds than the FIFO
// has slots; a stale tag would make a receive read a data slot's last line as the send's header.
TEST(CollSignatureWire, UntaggedPostAfterTaggedOnesIsUntagged) {
  setLoopbackEnv();
  setenv("RIDGE_TIMEOUT", "20", 1);
  ridgeUniqueId id;
  if (!makeUniqueId(&id)) return;
  LaunchResult res = launchRanks(2, 60.0, [&](int me, Reporter& rep) {
    ridgeComm_t comm = initRank(2, id, me, rep);
    if (!comm) return 2;
    std::vector<float> a(256), b(256);
    for (int iter = 0; iter < 200; ++iter) {
      std::fill(a.begin(), a.end(), static_cast<float>(me + iter));
      ridgeResult_t r = ridgeAllReduce(a.data(), b.data(), a.size(), ridgeFloat32, ridgeSum, comm, nullptr);
      if (r == ridgeSuccess && b[0] != static_cast<float>(1 + 2 * iter)) rep.fail("allreduce", "wrong sum");
      if (r == ridgeSuccess)
        r = me == 0 ? ridgeSend(a.data(), 16, ridgeFloat32, 1, comm, nullptr)
                    : ridgeRecv(b.data(), 16, ridgeFloat32, 0, comm, nullptr);
      if (r == ridgeSuccess && me == 1 && b[15] != static_cast<float>(iter)) rep.fail("recv", "wrong data");
      if (r != ridgeSuccess) {
        rep.fail("iteration " + std::to_string(iter), describeResult(r, comm));
        break;
      }
    }
    ridgeCommDestroy(comm);
    return 0;
  });
  reportChildFailures(res, "alternating tagged and untagged", true);
}

}  // namespace
}  // namespace ridgetest
