#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "topo/pci.h"
#include "topo/summary.h"
#include "topo/xml.h"
#include "topo_samples.h"

namespace fs = std::filesystem;

namespace ridge {
namespace {

std::vector<std::string> sampleFiles() {
  std::vector<std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(kSamples)) {
    if (e.is_regular_file() && e.path().extension() == ".xml") files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

bool isNcclGraphFile(const std::string& path) {
  std::ifstream f(path);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return text.find("<graphs") != std::string::npos;
}

// ---- This machine -------------------------------------------------------------------------

TEST(TopoSummary, ThisHost) {
  HostSummary s;
  ASSERT_TRUE(summarizeThisHost(&s).isOk());
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  EXPECT_GE(s.pus, 1);
  // PUs are those this process may use: never more than the online CPUs, and in practice
  // all of them or a cgroup's share.
  EXPECT_LE(s.pus, online);
  EXPECT_GE(s.cores, 1);
  EXPECT_LE(s.cores, s.pus);
  EXPECT_GE(s.packages, 1);
  EXPECT_LE(s.packages, s.cores);
  EXPECT_GE(s.numaNodes, 1);
  EXPECT_EQ(static_cast<size_t>(s.gpus), s.gpuNames.size());
  EXPECT_EQ(static_cast<size_t>(s.nics), s.nicNames.size());
  EXPECT_FALSE(s.source.empty());
  EXPECT_GE(s.discoveryMs, 0.0);
  std::string text = formatSummary(s);
  EXPECT_NE(text.find("discovered in"), std::string::npos) << text;
}

TEST(TopoSummary, SysfsAgreesWithPrimarySource) {
  HostSummary primary, sysfs;
  ASSERT_TRUE(summarizeThisHost(&primary).isOk());
  ASSERT_TRUE(summarizeThisHostSysfs(&sysfs).isOk());
  EXPECT_EQ(sysfs.pus, primary.pus);
  EXPECT_EQ(sysfs.cores, primary.cores);
  EXPECT_EQ(sysfs.packages, primary.packages);
  EXPECT_EQ(sysfs.gpus, primary.gpus);
  EXPECT_EQ(sysfs.nics, primary.nics);
}

// ---- Files --------------------------------------------------------------------------------

TEST(TopoSummary, SyntheticHwlocXmlExactCounts) {
#ifndef RIDGE_HAVE_HWLOC
  GTEST_SKIP() << "built without hwloc: hwloc XML files cannot be read";
#else
  HostSummary s;
  const std::string path = kData + "/two-socket-gpu-nic.xml";
  Status st = summarizeHwlocXml(path, &s);
  ASSERT_TRUE(st.isOk()) << st.message();
  EXPECT_EQ(s.hostname, "synthetic-node");
  EXPECT_EQ(s.packages, 2);
  EXPECT_EQ(s.numaNodes, 2);
  EXPECT_EQ(s.cores, 4);
  EXPECT_EQ(s.pus, 8);
  EXPECT_EQ(s.gpus, 1);  // the ASPEED BMC display is not a GPU
  EXPECT_EQ(s.nics, 1);
  ASSERT_EQ(s.gpuNames.size(), 1u);
  EXPECT_EQ(s.gpuNames[0],
            "0000:3b:00.0 NVIDIA Corporation GA100 [A100 SXM4 40GB] [cuda0] (PCIe 31.51 GB/s)");
  ASSERT_EQ(s.nicNames.size(), 1u);
  EXPECT_EQ(s.nicNames[0], "0000:81:00.0 Mellanox [15b3:101b] [ib0,mlx5_0] (PCIe 31.51 GB/s)");
  EXPECT_NE(s.source.find("hwloc XML"), std::string::npos) << s.source;
#endif
}

TEST(TopoSummary, SyntheticNcclTopologyExactCounts) {
  HostSummary s;
  Status st = summarizeHwlocXml(kData + "/nccl-two-numa.xml", &s);
  ASSERT_TRUE(st.isOk()) << st.message();
  EXPECT_EQ(s.hostname, "");
  EXPECT_EQ(s.packages, -1);
  EXPECT_EQ(s.cores, -1);
  EXPECT_EQ(s.numaNodes, 2);
  EXPECT_EQ(s.pus, 16);
  EXPECT_EQ(s.gpus, 3);
  EXPECT_EQ(s.nics, 2);  // the dual-port NIC is one PCI function
  ASSERT_EQ(s.gpuNames.size(), 3u);
  EXPECT_EQ(s.gpuNames[0], "0000:11:00.0 NVIDIA [10de:2330] [gpu0] (PCIe x16 Gen5)");
  EXPECT_EQ(s.gpuNames[2], "0000:90:00.0 (PCIe x8 Gen4)");
  ASSERT_EQ(s.nicNames.size(), 2u);
  EXPECT_EQ(s.nicNames[0], "0000:13:00.0 Mellanox [15b3:1021] [mlx5_0,mlx5_0] (PCIe x16 Gen5)");
  EXPECT_EQ(s.nicNames[1], "eth0 (no PCI path)");
  std::string text = formatSummary(s);
  EXPECT_NE(text.find("? packages, 2 NUMA nodes, ? cores, 16 PUs, 3 GPUs, 2 NICs"), std::string::npos)
      << text;
}

TEST(TopoSummary, EverySampleLoads) {
  SKIP_WITHOUT_SAMPLES();
  std::vector<std::string> files = sampleFiles();
  ASSERT_FALSE(files.empty()) << "no .xml file under " << kSamples;
  for (const std::string& path : files) {
    SCOPED_TRACE(path);
    HostSummary s;
    Status st = summarizeHwlocXml(path, &s);
    if (isNcclGraphFile(path)) {
      // A graph file lists channels, not a machine: refused with a clear message.
      EXPECT_EQ(st.code(), ridgeInvalidArgument);
      EXPECT_NE(st.message().find("graph"), std::string::npos) << st.message();
      continue;
    }
#ifndef RIDGE_HAVE_HWLOC
    if (st.code() == ridgeInvalidUsage) continue;  // hwloc XML without hwloc
#endif
    ASSERT_TRUE(st.isOk()) << st.message();
    // Plausible for one server: counts known or -1 (the format does not say).
    EXPECT_GE(s.numaNodes, 1);
    EXPECT_TRUE(s.packages == -1 || (s.packages >= 1 && s.packages <= 16)) << s.packages;
    EXPECT_TRUE(s.cores == -1 || s.cores >= s.packages) << s.cores;
    EXPECT_TRUE(s.pus == -1 || (s.pus >= 1 && s.pus <= 4096)) << s.pus;
    EXPECT_TRUE(s.cores == -1 || s.pus >= s.cores);
    EXPECT_GE(s.gpus, 1) << "every sample machine has GPUs";
    EXPECT_LE(s.gpus, 16);
    EXPECT_LE(s.nics, 32);
    EXPECT_EQ(static_cast<size_t>(s.gpus), s.gpuNames.size());
    EXPECT_EQ(static_cast<size_t>(s.nics), s.nicNames.size());
    EXPECT_LE(summaryToCompactString(s).size(), kCompactSummaryMax);
  }
}

struct Expected {
  const char* file;
  int packages, numaNodes, cores, pus, gpus, nics;
};

// Counts stated by the samples' README and checked by hand in the files.
TEST(TopoSummary, KnownSamplesExactCounts) {
  SKIP_WITHOUT_SAMPLES();
  const Expected known[] = {
      // HGX A100 80GB: 2 Ice Lake NUMA nodes of 64 threads, 8 GPUs, 5 ConnectX-6 (bonded).
      {"nccl/aliyun-SimAI_topo_8A100_4CX6.xml", -1, 2, -1, 128, 8, 5},
      // Azure ND H100 v5: 8 GPUs, 8 InfiniBand NICs, 2 x 48 threads.
      {"nccl/azure_ndv5-topo.xml", -1, 2, -1, 96, 8, 8},
      // Azure NC A100 v4: 4 GPUs on 4 NUMA nodes, one Ethernet NIC with no PCI path.
      {"nccl/azure_ncv4-topo.xml", -1, 4, -1, 96, 4, 1},
#ifdef RIDGE_HAVE_HWLOC
      // LLNL Corona: 2 x EPYC 7401 (24 cores, SMT2), 8 NUMA nodes, 4 MI25 (the ASPEED
      // display does not count), 2 I350 functions + 1 ConnectX-6.
      // LLNL Sierra (hwloc 1.x): 2 POWER9 x 22 cores x SMT4; 2 memory NUMA nodes plus the
      // 4 V100s' memory shown as NUMA nodes; 2 dual-port ConnectX-5 + 2 Broadcom functions.
      {"hwloc/flux-sched_sierra2_node0_power9_4xV100_4xmlx5.xml", 2, 6, 44, 176, 4, 6},
      {"hwloc/flux-sched_corona11_epyc_4xMI25_pex8747_cx6.xml", 2, 8, 48, 96, 4, 3},
      // Supermicro X9DRG-HF (hwloc 3 format): 2 x 8 cores x 2 threads, 3 Tesla M2075 and a
      // Radeon (the Matrox display does not count), 2 I350 functions + 1 ConnectX-4.
      {"hwloc/hwloc-tests_32em64t-2n8c2t-pci-normalio.xml", 2, 2, 16, 32, 4, 3},
#endif
  };
  for (const Expected& e : known) {
    SCOPED_TRACE(e.file);
    HostSummary s;
    Status st = summarizeHwlocXml(kSamples + "/" + e.file, &s);
    ASSERT_TRUE(st.isOk()) << st.message();
    EXPECT_EQ(s.packages, e.packages);
    EXPECT_EQ(s.numaNodes, e.numaNodes);
    EXPECT_EQ(s.cores, e.cores);
    EXPECT_EQ(s.pus, e.pus);
    EXPECT_EQ(s.gpus, e.gpus);
    EXPECT_EQ(s.nics, e.nics);
  }
}

TEST(TopoSummary, NcclTopologyDeviceNames) {
  SKIP_WITHOUT_SAMPLES();
  HostSummary s;
  ASSERT_TRUE(summarizeHwlocXml(kSamples + "/nccl/aliyun-SimAI_topo_8A100_4CX6.xml", &s).isOk());
  ASSERT_EQ(s.gpuNames.size(), 8u);
  EXPECT_EQ(s.gpuNames[0], "0000:13:00.0 NVIDIA [10de:20b2] [gpu0] (PCIe x16 Gen4)");
  ASSERT_EQ(s.nicNames.size(), 5u);
  EXPECT_EQ(s.nicNames[0], "0000:06:00.0 Mellanox [15b3:101d] [mlx5_bond_0] (PCIe x16 Gen4)");
  EXPECT_NE(s.source.find("NCCL topology XML"), std::string::npos);
}

TEST(TopoSummary, MissingAndMalformedFiles) {
  HostSummary s;
  EXPECT_EQ(summarizeHwlocXml(kData + "/no-such-file.xml", &s).code(), ridgeSystemError);
  const std::string dir = ::testing::TempDir();
  const std::string truncated = dir + "/ridge-truncated-topo.xml";
  {
    std::ofstream f(truncated);
    f << "<system version=\"1\">\n  <cpu numaid=\"0\" affinity=\"ff\">\n    <pci busid=\"0000:01:00.0\" cl";
  }
  Status st = summarizeHwlocXml(truncated, &s);
  EXPECT_EQ(st.code(), ridgeInvalidArgument);
  EXPECT_NE(st.message().find("line 3"), std::string::npos) << st.message();
  const std::string other = dir + "/ridge-other-root.xml";
  {
    std::ofstream f(other);
    f << "<?xml version=\"1.0\"?><catalog/>";
  }
  st = summarizeHwlocXml(other, &s);
  EXPECT_EQ(st.code(), ridgeInvalidArgument);
  EXPECT_NE(st.message().find("<catalog>"), std::string::npos) << st.message();
  std::remove(truncated.c_str());
  std::remove(other.c_str());
}

// ---- Compact form -------------------------------------------------------------------------

TEST(TopoSummary, CompactStringIsShortAndRoundTrips) {
  HostSummary s;
  ASSERT_TRUE(summarizeThisHost(&s).isOk());
  std::string line = summaryToCompactString(s);
  EXPECT_LE(line.size(), kCompactSummaryMax);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  HostSummary back;
  ASSERT_TRUE(parseCompactSummary(line, &back).isOk());
  EXPECT_EQ(back.hostname, s.hostname);
  EXPECT_EQ(back.packages, s.packages);
  EXPECT_EQ(back.numaNodes, s.numaNodes);
  EXPECT_EQ(back.cores, s.cores);
  EXPECT_EQ(back.pus, s.pus);
  EXPECT_EQ(back.gpus, s.gpus);
  EXPECT_EQ(back.nics, s.nics);
}

TEST(TopoSummary, CompactStringCutsLongHostnames) {
  HostSummary s;
  s.hostname = std::string(300, 'h') + " with spaces";
  s.packages = s.cores = -1;
  s.numaNodes = 64;
  s.pus = 4096;
  s.gpus = 16;
  s.nics = 32;
  std::string line = summaryToCompactString(s);
  EXPECT_EQ(line.size(), kCompactSummaryMax);
  HostSummary back;
  ASSERT_TRUE(parseCompactSummary(line, &back).isOk());
  EXPECT_EQ(back.packages, -1);
  EXPECT_EQ(back.pus, 4096);
  EXPECT_EQ(back.nics, 32);
  EXPECT_EQ(parseCompactSummary("garbage", &back).code(), ridgeInvalidArgument);
}

// ---- Helpers ------------------------------------------------------------------------------

TEST(TopoPci, Classification) {
  EXPECT_TRUE(topo::isGpuClass(0x0302, 0x10de));   // NVIDIA 3D controller
  EXPECT_TRUE(topo::isGpuClass(0x0300, 0x1002));   // AMD VGA
  EXPECT_TRUE(topo::isGpuClass(0x0302, 0));        // unknown vendor (NCCL files)
  EXPECT_FALSE(topo::isGpuClass(0x0300, 0x1a03));  // ASPEED BMC
  EXPECT_FALSE(topo::isGpuClass(0x0300, 0x102b));  // Matrox BMC
  EXPECT_FALSE(topo::isGpuClass(0x0207, 0x15b3));
  EXPECT_TRUE(topo::isNicClass(0x0200));
  EXPECT_TRUE(topo::isNicClass(0x0207));
  EXPECT_FALSE(topo::isNicClass(0x0108));
  EXPECT_EQ(topo::pcieLinkText(16, topo::parseGts("16.0 GT/s PCIe")), "PCIe x16 Gen4");
  EXPECT_EQ(topo::pcieLinkText(16, topo::parseGts("32 GT/s")), "PCIe x16 Gen5");
  EXPECT_EQ(topo::pcieLinkText(0, topo::parseGts("Unknown")), "");
  EXPECT_EQ(topo::pcieLinkText(8, 0), "PCIe x8");
}

TEST(TopoXml, ParsesAttributesEntitiesAndComments) {
  topo::XmlElement root;
  Status st = topo::parseXml(
      "<?xml version=\"1.0\"?>\n<!-- a > b -->\n<a x='1' y=\"&lt;&amp;&#65;\"><b/><!-- c --><b "
      "z=\"2\">t</b></a>\n",
      "test", &root);
  ASSERT_TRUE(st.isOk()) << st.message();
  EXPECT_EQ(root.name, "a");
  ASSERT_NE(root.attribute("y"), nullptr);
  EXPECT_EQ(*root.attribute("y"), "<&A");
  ASSERT_EQ(root.children.size(), 2u);
  EXPECT_EQ(*root.children[1].attribute("z"), "2");
  EXPECT_EQ(topo::parseXml("<a><b></a>", "test", &root).code(), ridgeInvalidArgument);
  EXPECT_EQ(topo::parseXml("<a/><b/>", "test", &root).code(), ridgeInvalidArgument);
}

}  // namespace
}  // namespace ridge
