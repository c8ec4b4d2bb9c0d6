// Checks a RIDGE_SOFTNIC_TRACE file: what the software NIC consumed must be exactly what a
// ConnectX NIC would accept. Per queue (QP number):
//   * every `wqe <qpn> <pi> <hex>` line is whole 64-byte blocks that decode as an mlx5 WQE of
//     the subset (kernels/gdr/mlx5_wire.h), whose ds covers exactly those blocks, whose control
//     segment names that QP and whose index is the producer index `pi` (low 16 bits);
//   * producer indices start at 0 and follow each other without gap (pi + blocks);
//   * a WQE is taken only below the last doorbell-record value read for its queue;
//   * `dbr <qpn> <hex>` values never go back, and the last one is the index after the last WQE
//     (the NIC consumed everything that was published).
#pragma once

#include <cstdint>
#include <istream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/gdr/mlx5_wire.h"

namespace ridge::gdr {

struct TraceSummary {
  uint64_t wqes = 0;
  uint64_t dbrs = 0;
  size_t queues = 0;
};

inline bool checkSoftnicTrace(std::istream& in, TraceSummary* sum, std::string* error) {
  struct Queue {
    uint32_t nextPi = 0;   // index after the last WQE (32-bit, as the NIC counts)
    uint32_t lastDbr = 0;  // last record value (16 bits)
    bool sawDbr = false;
  };
  std::map<uint32_t, Queue> queues;
  std::string line;
  uint64_t lineNo = 0;
  auto fail = [&](const std::string& why) {
    *error = "line " + std::to_string(lineNo) + ": " + why + ": " + line.substr(0, 160);
    return false;
  };
  while (std::getline(in, line)) {
    ++lineNo;
    std::istringstream ls(line);
    std::string kind, hex;
    uint32_t qpn = 0;
    if (!(ls >> kind >> qpn)) return fail("not '<kind> <qpn> ...'");
    Queue& q = queues[qpn];
    if (kind == "dbr") {
      if (!(ls >> hex) || hex.size() != 8) return fail("dbr value is not 8 hex digits");
      const uint32_t word = static_cast<uint32_t>(std::stoul(hex, nullptr, 16));
      if (word > 0xffffu) return fail("doorbell record above 16 bits");
      if (q.sawDbr && static_cast<uint16_t>(word - q.lastDbr) >= 0x8000u)
        return fail("doorbell record went back");
      if (static_cast<uint16_t>(word - q.nextPi) >= 0x8000u)
        return fail("doorbell record behind a WQE the NIC already took");
      q.lastDbr = word;
      q.sawDbr = true;
      sum->dbrs += 1;
      continue;
    }
    if (kind != "wqe") return fail("unknown line kind");
    uint32_t pi = 0;
    if (!(ls >> pi >> hex)) return fail("not 'wqe <qpn> <pi> <hex>'");
    if (hex.size() % (2 * mlx5::kWqeBbBytes) != 0 || hex.empty() ||
        hex.size() > 2 * mlx5::kMaxWqeBbs * mlx5::kWqeBbBytes)
      return fail("WQE is not 1 to 4 whole 64-byte blocks");
    mlx5::WqeBuf w{};
    for (size_t i = 0; i < hex.size() / 2; ++i)
      w.bytes[i] = static_cast<uint8_t>(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
    const uint32_t blocks = static_cast<uint32_t>(hex.size() / (2 * mlx5::kWqeBbBytes));
    mlx5::WqeFields f{};
    if (!mlx5::decodeWqe(w.bytes, &f)) return fail("not a well-formed mlx5 WQE of the subset");
    if (mlx5::wqeBbs(f.ds) != blocks) return fail("ds does not cover the WQE's blocks");
    if (f.qpn != qpn) return fail("control segment names another QP");
    if (f.wqeIndex != static_cast<uint16_t>(pi)) return fail("WQE index is not the producer index");
    if (pi != q.nextPi)
      return fail("producer index skips or repeats (expected " + std::to_string(q.nextPi) + ")");
    if (!q.sawDbr || static_cast<uint16_t>(q.lastDbr - (pi + blocks)) >= 0x8000u)
      return fail("WQE taken beyond the doorbell record");
    q.nextPi = pi + blocks;
    sum->wqes += 1;
  }
  for (const auto& [qpn, q] : queues) {
    if (q.nextPi == 0) continue;  // a queue only read (its record never moved)
    if (q.lastDbr != (q.nextPi & 0xffffu)) {
      *error = "QP " + std::to_string(qpn) + ": last doorbell record " + std::to_string(q.lastDbr) +
               " is not the index after its last WQE (" + std::to_string(q.nextPi & 0xffffu) + ")";
      return false;
    }
  }
  sum->queues = queues.size();
  if (sum->wqes == 0) {
    *error = "no WQE in the trace";
    return false;
  }
  return true;
}

}  // namespace ridge::gdr
