// PCIe transaction model: the design documents' worked example, the efficiency table of
// gdr-write-facts.md, Little's law, the P2P penalties, monotonicity, and the constants file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "topo/pcie_model.h"

namespace ridge::topo {
namespace {

const PcieConstants kDefaults{};

// One Gen5 x16 link straight to the completer, with the endpoint parameters given.
Route directRoute(Completer completer, int mps, int mrrs, int completion, int rcb = 64) {
  Route r;
  r.hops = {Hop::link(5, 16)};
  r.completer = completer;
  r.params.mpsBytes = mps;
  r.params.mrrsBytes = mrrs;
  r.params.completionBytes = completion;
  r.params.rcbBytes = rcb;
  return r;
}

TEST(PcieModel, WorkedExampleReadOf512BytesIn256ByteCompletions) {
  // Design documents: 512 B answered in 256 B completions costs 2 x 20 B of header, so at
  // best 512 / 552 = 92.75% efficient.
  EXPECT_DOUBLE_EQ(readDataEfficiency(kDefaults, 512, 256), 512.0 / 552.0);
  TransferEstimate e = estimateRead(directRoute(Completer::GpuMemory, 256, 512, 256), 512, kDefaults);
  EXPECT_EQ(e.requestTlps, 1u);
  EXPECT_EQ(e.dataTlps, 2u);
  EXPECT_DOUBLE_EQ(e.wireBytes, 552);
  EXPECT_NEAR(e.efficiency, 0.9275, 0.0001);
  EXPECT_DOUBLE_EQ(e.reverseWireBytes, 24);  // one read request the other way
}

// The reference table prints two decimals and rounds loosely (512/536 = 0.955 is printed 0.95,
// 128/148 = 0.865 is printed 0.87), so its figures are matched within 0.006.
constexpr double kTableRounding = 0.006;

TEST(PcieModel, WriteEfficiencyTable) {
  // gdr-write-facts.md: payload 8 B, 64 B, >= 512 B at MPS 128/256/512.
  struct Row {
    int mps;
    double at8, at64, atLarge;
  } rows[] = {{128, 0.25, 0.73, 0.84}, {256, 0.25, 0.73, 0.91}, {512, 0.25, 0.73, 0.95}};
  for (const Row& row : rows) {
    Route r = directRoute(Completer::NicMemory, row.mps, 512, 0);
    EXPECT_NEAR(estimateWrite(r, 8, kDefaults).efficiency, row.at8, kTableRounding) << row.mps;
    EXPECT_NEAR(estimateWrite(r, 64, kDefaults).efficiency, row.at64, kTableRounding) << row.mps;
    for (uint64_t n : {512u, 4096u, 1u << 20}) {
      EXPECT_NEAR(estimateWrite(r, n, kDefaults).efficiency, row.atLarge, kTableRounding)
          << row.mps << " " << n;
    }
    EXPECT_NEAR(writeTlpEfficiency(kDefaults, row.mps), row.atLarge, kTableRounding);
  }
}

TEST(PcieModel, ReadEfficiencyTable) {
  // gdr-write-facts.md: reads answered in 64, 128 or 256 B completions.
  struct Row {
    int completion;
    double at8, at64, atLarge;
  } rows[] = {{64, 0.29, 0.76, 0.76}, {128, 0.29, 0.76, 0.87}, {256, 0.29, 0.76, 0.93}};
  for (const Row& row : rows) {
    Route r = directRoute(Completer::HostMemory, 256, 512, row.completion);
    EXPECT_NEAR(estimateRead(r, 8, kDefaults).efficiency, row.at8, kTableRounding) << row.completion;
    EXPECT_NEAR(estimateRead(r, 64, kDefaults).efficiency, row.at64, kTableRounding) << row.completion;
    for (uint64_t n : {512u, 4096u, 1u << 20}) {
      EXPECT_NEAR(estimateRead(r, n, kDefaults).efficiency, row.atLarge, kTableRounding)
          << row.completion << " " << n;
    }
  }
}

TEST(PcieModel, ReadRequestsAndCompletionSplits) {
  Route r = directRoute(Completer::HostMemory, 256, 512, 64);
  TransferEstimate e = estimateRead(r, 4096 + 100, kDefaults);
  EXPECT_EQ(e.requestTlps, 9u);         // 8 full 512 B requests and a 100 B tail
  EXPECT_EQ(e.dataTlps, 8u * 8u + 2u);  // 8 x 64 B each, the tail in 64 + 36
  EXPECT_DOUBLE_EQ(e.reverseWireBytes, 9 * 24.0);
  // A completion never carries more than MPS: 1024 B completions at MPS 256 become 256 B.
  Route big = directRoute(Completer::GpuMemory, 256, 1024, 1024, 128);
  EXPECT_EQ(resolveEndpoint(big, kDefaults).completionBytes, 256);
  EXPECT_EQ(estimateRead(big, 1024, kDefaults).dataTlps, 4u);
}

TEST(PcieModel, LinkRates) {
  EXPECT_NEAR(pcieLinkGBs(kDefaults, 4, 16), 31.5, 0.01);  // gdr-write-facts.md
  EXPECT_NEAR(pcieLinkGBs(kDefaults, 5, 16), 63.0, 0.02);  // 63.015 exactly
  EXPECT_NEAR(pcieLinkGBs(kDefaults, 3, 16), 15.75, 0.01);
  EXPECT_NEAR(pcieLinkGBs(kDefaults, 1, 1), 0.25, 1e-9);
  EXPECT_EQ(pcieLinkGBs(kDefaults, 7, 16), 0);
  EXPECT_EQ(pcieLinkGBs(kDefaults, 4, 3), 0);
  EXPECT_EQ(pcieLinkGBs(kDefaults, 0, 16), 0);
}

TEST(PcieModel, WriteIsOneTraversalReadIsARoundTrip) {
  Route r;
  r.hops = {Hop::link(4, 16), Hop::pcieSwitch(), Hop::link(4, 16)};
  r.completer = Completer::GpuMemory;
  const PcieConstants& c = kDefaults;
  double oneWay = 2 * c.pcie_link_latency_ns + c.pcie_switch_latency_ns;
  EXPECT_DOUBLE_EQ(traversalNs(r, c), oneWay);
  EXPECT_DOUBLE_EQ(estimateWrite(r, 8, c).latencyNs, oneWay);
  TransferEstimate rd = estimateRead(r, 8, c);
  EXPECT_DOUBLE_EQ(rd.roundTripNs, 2 * oneWay + c.gpu_memory_access_ns);
  EXPECT_GT(rd.totalNs, estimateWrite(r, 8, c).totalNs);
}

TEST(PcieModel, LittlesLawLimitsReads) {
  // gdr-write-facts.md: 50 GB/s (a 400G NIC) at a 1 us round trip needs about 50 KB of
  // outstanding reads, about 98 requests of 512 B.
  EXPECT_DOUBLE_EQ(bytesInFlightFor(50, 1000), 50000);
  EXPECT_EQ(std::ceil(bytesInFlightFor(50, 1000) / 512), 98);

  Route r = directRoute(Completer::GpuMemory, 256, 512, 256, 128);
  r.hops[0].latencyNs = 250;
  r.params.completerAccessNs = 500;  // 250 out + 500 access + 250 back = 1 us
  r.params.maxOutstandingReads = 98;
  TransferEstimate e = estimateRead(r, 64 << 20, kDefaults);
  EXPECT_DOUBLE_EQ(e.roundTripNs, 1000);
  EXPECT_NEAR(e.outstandingLimitGBs, 98 * 512 / 1000.0, 1e-9);
  EXPECT_GE(e.outstandingLimitGBs, 50);
  r.params.maxOutstandingReads = 97;
  EXPECT_LT(estimateRead(r, 64 << 20, kDefaults).outstandingLimitGBs, 50);
  // With only 32 tags the link (58 GB/s) is not what limits the read.
  r.params.maxOutstandingReads = 32;
  e = estimateRead(r, 64 << 20, kDefaults);
  EXPECT_NEAR(e.bandwidthGBs, 32 * 512 / 1000.0, 1e-9);
  EXPECT_NE(std::string(e.limitedBy).find("outstanding"), std::string::npos);
  // Writes need no tags.
  EXPECT_EQ(estimateWrite(r, 64 << 20, kDefaults).outstandingLimitGBs, 0);
}

TEST(PcieModel, PeerReadsThroughTheRootComplexArePenalized) {
  const PcieConstants& c = kDefaults;
  Route toGpu;
  toGpu.hops = {Hop::link(5, 16), Hop::rootComplex(), Hop::link(5, 16)};
  toGpu.completer = Completer::GpuMemory;
  ASSERT_TRUE(isPeerToPeer(toGpu));
  TransferEstimate e = estimateRead(toGpu, 64 << 20, c);
  EXPECT_NEAR(e.bandwidthGBs, e.linkLimitGBs * c.rc_peer_read_fraction, 1e-9);
  EXPECT_STREQ(e.limitedBy, "root-complex P2P read forwarding");
  // The same hops ending in host memory are ordinary DMA: no penalty.
  Route toHost = toGpu;
  toHost.completer = Completer::HostMemory;
  EXPECT_FALSE(isPeerToPeer(toHost));
  EXPECT_EQ(estimateRead(toHost, 64 << 20, c).peerLimitGBs, 0);
  // Across the socket link peer reads get the measured cross-socket figure.
  Route acrossSockets;
  acrossSockets.hops = {Hop::link(5, 16), Hop::rootComplex(), Hop::socketLink(), Hop::rootComplex(),
                        Hop::link(5, 16)};
  acrossSockets.completer = Completer::GpuMemory;
  e = estimateRead(acrossSockets, 64 << 20, c);
  EXPECT_DOUBLE_EQ(e.bandwidthGBs, c.socket_peer_read_gbs);
  EXPECT_STREQ(e.limitedBy, "P2P reads across the socket link");
  // Peer writes pay the smaller write-forwarding factor.
  TransferEstimate w = estimateWrite(toGpu, 64 << 20, c);
  EXPECT_NEAR(w.bandwidthGBs, w.linkLimitGBs * c.rc_peer_write_fraction, 1e-9);
}

TEST(PcieModel, SocketLinkBoundsTheRate) {
  Route r;
  r.hops = {Hop::link(5, 16), Hop::rootComplex(), Hop::socketLink(10, 120)};
  r.completer = Completer::HostMemory;
  TransferEstimate e = estimateWrite(r, 1 << 20, kDefaults);
  EXPECT_DOUBLE_EQ(e.bandwidthGBs, 10);
  EXPECT_STREQ(e.limitedBy, "socket link");
  EXPECT_DOUBLE_EQ(e.latencyNs, kDefaults.pcie_link_latency_ns + kDefaults.root_complex_latency_ns + 120);
}

TEST(PcieModel, MoreHopsAreNeverFaster) {
  const PcieConstants& c = kDefaults;
  const Hop extras[] = {Hop::pcieSwitch(), Hop::rootComplex(), Hop::socketLink(),
                        Hop::link(3, 8),   Hop::link(5, 16),   Hop::socketLink(1000, 0)};
  for (Completer completer : {Completer::HostMemory, Completer::GpuMemory, Completer::NicMemory}) {
    Route base;
    base.hops = {Hop::link(4, 16), Hop::pcieSwitch(), Hop::link(4, 16)};
    base.completer = completer;
    for (const Hop& extra : extras) {
      for (size_t at = 0; at <= base.hops.size(); ++at) {
        Route longer = base;
        longer.hops.insert(longer.hops.begin() + static_cast<long>(at), extra);
        for (uint64_t n : {8ull, 64ull, 4096ull, 1ull << 20, 64ull << 20}) {
          std::string where = describeRoute(longer) + " n=" + std::to_string(n);
          EXPECT_GE(estimateWrite(longer, n, c).totalNs, estimateWrite(base, n, c).totalNs) << where;
          EXPECT_GE(estimateRead(longer, n, c).totalNs, estimateRead(base, n, c).totalNs) << where;
          EXPECT_LE(estimateWrite(longer, n, c).bandwidthGBs, estimateWrite(base, n, c).bandwidthGBs)
              << where;
          EXPECT_LE(estimateRead(longer, n, c).bandwidthGBs, estimateRead(base, n, c).bandwidthGBs) << where;
        }
      }
    }
  }
}

TEST(PcieModel, LargerMpsIsNeverLessEfficientForWrites) {
  for (uint64_t n = 1; n <= 20000; n += 7) {
    double previous = 0;
    for (int mps = 128; mps <= 4096; mps *= 2) {
      double eff = estimateWrite(directRoute(Completer::NicMemory, mps, 512, 0), n, kDefaults).efficiency;
      EXPECT_GE(eff, previous) << "n=" << n << " mps=" << mps;
      previous = eff;
    }
  }
}

TEST(PcieModel, ZeroBytesAndUnratedLinks) {
  Route r;
  r.hops = {Hop::pcieSwitch()};  // no link with a known rate
  r.completer = Completer::NicMemory;
  TransferEstimate e = estimateWrite(r, 0, kDefaults);
  EXPECT_EQ(e.dataTlps, 0u);
  EXPECT_DOUBLE_EQ(e.totalNs, kDefaults.pcie_switch_latency_ns);
  e = estimateWrite(r, 4096, kDefaults);
  EXPECT_TRUE(std::isinf(e.bandwidthGBs));
  EXPECT_DOUBLE_EQ(e.totalNs, e.latencyNs);
}

TEST(PcieModel, ReverseRouteKeepsRequesterParameters) {
  Route r;
  r.hops = {Hop::link(5, 16), Hop::pcieSwitch(), Hop::link(4, 8)};
  r.completer = Completer::NicMemory;
  r.params.mpsBytes = 512;
  r.params.mrrsBytes = 1024;
  r.params.maxOutstandingReads = 64;
  r.params.completionBytes = 128;
  Route back = reverseRoute(r, Completer::GpuMemory);
  ASSERT_EQ(back.hops.size(), 3u);
  EXPECT_EQ(back.hops[0].pcieGen, 4);
  EXPECT_EQ(back.hops[2].pcieGen, 5);
  EXPECT_EQ(back.completer, Completer::GpuMemory);
  EXPECT_EQ(back.params.mpsBytes, 512);
  EXPECT_EQ(back.params.mrrsBytes, 1024);
  EXPECT_EQ(back.params.maxOutstandingReads, 64);
  EXPECT_EQ(back.params.completionBytes, 0);  // completer side: the GPU's default
  EXPECT_EQ(describeRoute(back), "Gen4 x8 > switch > Gen5 x16 > GPU memory");
}

// ---- Constants file -------------------------------------------------------------------

TEST(PcieConstantsFile, DefaultsAreValidAndKeysUnique) {
  EXPECT_TRUE(validatePcieConstants(kDefaults).isOk());
  std::set<std::string> keys;
  for (const PcieConstantInfo& i : pcieConstantTable()) {
    EXPECT_TRUE(keys.insert(i.key).second) << i.key;
    EXPECT_GE(i.defaultValue, i.minimum) << i.key;
    EXPECT_LE(i.defaultValue, i.maximum) << i.key;
    EXPECT_GT(std::string(i.source).size(), 10u) << i.key << " needs a source";
  }
}

TEST(PcieConstantsFile, OverridesWithCommentsAndBlankLines) {
  PcieConstants c;
  std::string text =
      "# measured on host A\n"
      "\n"
      "mps_bytes = 512   # BIOS setting\n"
      "  rc_peer_read_fraction=0.25\n"
      "socket_link_gbs = 40\t\n";
  ASSERT_TRUE(parsePcieConstants(text, "a.txt", &c).isOk());
  EXPECT_EQ(c.mps_bytes, 512);
  EXPECT_DOUBLE_EQ(c.rc_peer_read_fraction, 0.25);
  EXPECT_DOUBLE_EQ(c.socket_link_gbs, 40);
  EXPECT_EQ(c.mrrs_bytes, kDefaults.mrrs_bytes);  // untouched keys keep their value
}

TEST(PcieConstantsFile, LoadsFromAFile) {
  std::string path = ::testing::TempDir() + "pcie_constants_" + std::to_string(getpid()) + ".txt";
  {
    std::ofstream f(path);
    f << "nic_read_tags = 1024\npcie_switch_latency_ns = 90.5\n";
  }
  PcieConstants c;
  ASSERT_TRUE(loadPcieConstants(path, &c).isOk());
  EXPECT_EQ(c.nic_read_tags, 1024);
  EXPECT_DOUBLE_EQ(c.pcie_switch_latency_ns, 90.5);
  std::remove(path.c_str());

  Status s = loadPcieConstants(path, &c);  // now missing
  EXPECT_EQ(s.code(), ridgeInvalidArgument);
  EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
}

// Each bad file fails with a message naming the file, the line and the reason, and leaves
// the constants unchanged.
TEST(PcieConstantsFile, BadFilesAreRefusedWithFileAndLine) {
  struct Case {
    const char* text;
    const char* where;  // "file:line"
    const char* why;
  } cases[] = {
      {"mps_bytes = 256\nmsp_bytes = 256\n", "bad.txt:2:", "unknown key 'msp_bytes'"},
      {"# c\nsocket_link_gbs = 12abc\n", "bad.txt:2:", "not a number"},
      {"socket_link_gbs = \n", "bad.txt:1:", "no value"},
      {"socket_link_gbs = nan\n", "bad.txt:1:", "not a number"},
      {"socket_link_gbs 12\n", "bad.txt:1:", "expected 'key = value'"},
      {"pcie_switch_latency_ns = -5\n", "bad.txt:1:", "out of range"},
      {"socket_link_gbs = 0\n", "bad.txt:1:", "out of range"},
      {"nic_read_tags = 0\n", "bad.txt:1:", "out of range"},
      {"nic_read_tags = 12.5\n", "bad.txt:1:", "whole number"},
      {"mps_bytes = 384\n", "bad.txt:1:", "power of two"},
      {"mps_bytes = 64\n", "bad.txt:1:", "out of range"},
      {"mrrs_bytes = 8192\n", "bad.txt:1:", "out of range"},
      {"rcb_endpoint_bytes = 96\n", "bad.txt:1:", "64 or 128"},
      {"host_completion_bytes = 100\n", "bad.txt:1:", "multiple of 64"},
      {"rc_peer_read_fraction = 1.5\n", "bad.txt:1:", "out of range"},
      {"mps_bytes = 512\n\nmps_bytes = 256\n", "bad.txt:3:", "already set at line 1"},
      // Cross-constant rule: no single line is wrong, the file is.
      {"rcb_root_complex_bytes = 128\n", "bad.txt:", "multiple of rcb_root_complex_bytes"},
  };
  for (const Case& k : cases) {
    PcieConstants c;
    c.socket_link_gbs = 33;  // must survive a failed load
    Status s = parsePcieConstants(k.text, "bad.txt", &c);
    EXPECT_EQ(s.code(), ridgeInvalidArgument) << k.text;
    EXPECT_NE(s.message().find(k.where), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(k.why), std::string::npos) << s.message();
    EXPECT_DOUBLE_EQ(c.socket_link_gbs, 33) << k.text;
    EXPECT_EQ(c.mps_bytes, kDefaults.mps_bytes) << k.text;
  }
}

TEST(PcieConstantsFile, DocsListEveryConstant) {
  std::ifstream f(std::string(RIDGE_DOCS_DIR) + "/topology.md");
  ASSERT_TRUE(f) << "docs/topology.md missing";
  std::stringstream text;
  text << f.rdbuf();
  for (const PcieConstantInfo& i : pcieConstantTable()) {
    EXPECT_NE(text.str().find(std::string("`") + i.key + "`"), std::string::npos)
        << i.key << " is not documented in docs/topology.md";
  }
}

}  // namespace
}  // namespace ridge::topo
