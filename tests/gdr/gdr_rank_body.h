// What a rank of a gdr transport test does, shared by the forked-rank tests on one host
// (gdr_transport_test.cpp) and those across network namespaces (gdr_netns_test.cpp): a ring
// shift and an int32 sum allreduce per size, each checked exactly, then the process's gdr and
// software-NIC counters reported as lines the parent parses.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "rank_launcher.h"
#include "test_data.h"
#include "transports/gdr/gdr_transport.h"
#include "transports/softnic/softnic.h"

namespace ridgetest {

// Runs the exchanges on `comm` (n ranks, this is rank `me`), reports, destroys the
// communicator. 0 on success, 1 on a wrong or failed call.
inline int runGdrExchanges(ridgeComm_t comm, int n, int me, Reporter& rep,
                           const std::vector<size_t>& counts) {
  for (size_t count : counts) {
    std::vector<int32_t> in(count), out(count, -1);
    const uint32_t key = rankKey(static_cast<uint32_t>(count), me);
    for (size_t i = 0; i < count; ++i) in[i] = static_cast<int32_t>(elemHash(key, i));
    const int to = (me + 1) % n, from = (me + n - 1) % n;
    ridgeGroupStart();
    ridgeSend(in.data(), count, ridgeInt32, to, comm, nullptr);
    ridgeRecv(out.data(), count, ridgeInt32, from, comm, nullptr);
    ridgeResult_t r = ridgeGroupEnd();
    if (r != ridgeSuccess) {
      rep.fail("sendrecv", std::to_string(count) + ": " + describeResult(r, comm));
      return 1;
    }
    const uint32_t fromKey = rankKey(static_cast<uint32_t>(count), from);
    for (size_t i = 0; i < count; ++i) {
      if (out[i] != static_cast<int32_t>(elemHash(fromKey, i))) {
        rep.fail("sendrecv", std::to_string(count) + " elements: wrong value at " + std::to_string(i));
        return 1;
      }
    }
    r = ridgeAllReduce(in.data(), out.data(), count, ridgeInt32, ridgeSum, comm, nullptr);
    if (r != ridgeSuccess) {
      rep.fail("allreduce", std::to_string(count) + ": " + describeResult(r, comm));
      return 1;
    }
    for (size_t i = 0; i < count; ++i) {
      uint32_t want = 0;
      for (int k = 0; k < n; ++k) want += elemHash(rankKey(static_cast<uint32_t>(count), k), i);
      if (static_cast<uint32_t>(out[i]) != want) {
        rep.fail("allreduce", std::to_string(count) + " elements: wrong sum at " + std::to_string(i));
        return 1;
      }
    }
  }
  const ridge::gdr::Counters c = ridge::gdr::processCounters();
  const ridge::gdr::SetupReport s = ridge::gdr::lastSetupReport();
  rep.line("COUNTERS " + std::to_string(c.slotsWritten) + " " + std::to_string(c.creditStalls) + " " +
           std::to_string(c.stagedLost) + " " + std::to_string(c.slotsLanded) + " " +
           std::to_string(c.creditsReturned) + " " + std::to_string(c.completionErrors));
  const ridge::softnic::Counters nic = ridge::softnic::processCounters();
  rep.line("FAULTS " +
           std::to_string(nic.injectedDrops + nic.injectedDups + nic.injectedReorders + nic.injectedDelays));
  rep.line(std::string("MODE ") + ridge::gdr::modeName(s.mode) + " " + (s.paced ? "paced" : "free") + " " +
           (s.stagingTier.empty() ? "-" : s.stagingTier));
  rep.info(std::string(ridge::gdr::modeName(s.mode)) + ": " + ridge::gdr::countersToString(c));
  ridgeCommFinalize(comm);
  ridgeCommDestroy(comm);
  return 0;
}

// One rank's report, as runGdrExchanges wrote it.
struct GdrRankCounters {
  unsigned long long written = 0, stalls = 0, lost = 0, landed = 0, returned = 0, errors = 0, faults = 0;
  std::string mode, paced, tier;
};

inline std::vector<GdrRankCounters> parseGdrCounters(const LaunchResult& res) {
  std::vector<GdrRankCounters> out;
  for (const RankResult& rr : res.ranks) {
    GdrRankCounters rc;
    for (const std::string& l : linesWith(rr, "COUNTERS "))
      std::sscanf(l.c_str(), "%llu %llu %llu %llu %llu %llu", &rc.written, &rc.stalls, &rc.lost, &rc.landed,
                  &rc.returned, &rc.errors);
    for (const std::string& l : linesWith(rr, "FAULTS ")) std::sscanf(l.c_str(), "%llu", &rc.faults);
    for (const std::string& l : linesWith(rr, "MODE ")) {
      char m[32] = {0}, p[16] = {0}, t[16] = {0};
      std::sscanf(l.c_str(), "%31s %15s %15s", m, p, t);
      rc.mode = m;
      rc.paced = p;
      rc.tier = t;
    }
    out.push_back(rc);
  }
  return out;
}

}  // namespace ridgetest
