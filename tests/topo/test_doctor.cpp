// ridge-topo doctor on machines built by the test: a preset's topology plus the /sys and
// /proc files a healthy machine of that shape would have, written into a temporary folder,
// then one fault planted at a time. The doctor must name each planted fault, and none on
// the healthy machine; a recorded run must replay to the same report.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <set>
#include <string>

#include "core/status.h"
#include "topo/doctor.h"
#include "topo/presets.h"
#include "topo/sysfs.h"

namespace ridge::topo {
namespace {

namespace fs = std::filesystem;

double gtsOfGen(int gen) {
  static const double kGts[] = {0, 2.5, 5, 8, 16, 32, 64};
  return gen >= 1 && gen <= 6 ? kGts[gen] : 0;
}

// A temporary machine folder in the layout `ridge-topo capture` writes.
class Fixture {
 public:
  explicit Fixture(const std::string& preset) {
    EXPECT_TRUE(loadPreset(preset, &t).isOk());
    char tmpl[] = "/tmp/ridge-doctor-XXXXXX";
    const char* made = mkdtemp(tmpl);
    EXPECT_NE(made, nullptr);
    dir = made ? made : "/tmp/ridge-doctor-failed";
    writeHealthy();
  }
  ~Fixture() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }

  void put(const std::string& path, const std::string& content) const {
    ASSERT_TRUE(makeDirs(fs::path(dir + path).parent_path().string()));
    ASSERT_TRUE(writeFile(dir + path, content));
  }
  void remove(const std::string& path) const {
    std::error_code ec;
    fs::remove_all(dir + path, ec);
  }
  std::string pci(const std::string& name) const {
    return "/sys/bus/pci/devices/" + t.node(t.find(name)).busId;
  }
  // The switch downstream port (or root port) a device hangs from.
  std::string parentPci(const std::string& name) const {
    return "/sys/bus/pci/devices/" + t.node(t.node(t.find(name)).parent).busId;
  }
  std::string config(int acsControl) const {
    std::string cfg(4096, '\0');
    // Extended capability at 0x100: ACS (id 0x000d, version 1, no next), capability and
    // control words.
    const uint32_t header = 0x000d | (1u << 16);
    const uint32_t capCtl = 0x005f | (uint32_t(acsControl) << 16);
    for (int i = 0; i < 4; ++i) {
      cfg[0x100 + i] = char(header >> (8 * i));
      cfg[0x104 + i] = char(capCtl >> (8 * i));
    }
    return cfg;
  }

  DoctorReport doctor(bool all = true) const {
    DoctorOptions o;
    o.allPairs = all;
    return runDoctor(t, SysRoot(dir), o);
  }

  Topology t;
  std::string dir;

 private:
  void writeHealthy() {
    put("/proc/sys/kernel/osrelease", "6.1.0-18-amd64\n");
    put("/proc/modules",
        "nvidia_peermem 16384 0 - Live 0x0000000000000000 (OE)\n"
        "nvidia 56827904 2 nvidia_peermem, Live 0x0000000000000000 (OE)\n"
        "mlx5_ib 475136 0 - Live 0x0000000000000000\n");
    put("/proc/driver/nvidia/version",
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build  "
        "(dvs-builder@U16)\n");
    put("/proc/driver/nvidia/params",
        "ResmanDebugLevel: 4294967295\nRegistryDwords: \"PeerMappingOverride=1;\"\n");
    put("/proc/cmdline", "BOOT_IMAGE=/vmlinuz root=/dev/sda1 intel_iommu=on iommu=pt\n");
    put("/sys/class/iommu/dmar0/.keep", "");
    put("/proc/self/status", "Name:\tridge-topo\nCpus_allowed_list:\t0-111\nMems_allowed_list:\t0-1\n");
    put("/sys/devices/system/node/node0/cpulist", "0-55\n");
    put("/sys/devices/system/node/node1/cpulist", "56-111\n");
    for (int id = 0; id < int(t.nodes().size()); ++id) {
      const Node& n = t.node(id);
      if (n.busId.size() != 12) continue;
      const std::string d = "/sys/bus/pci/devices/" + n.busId;
      // The link a function reports: the one above it, or for a root or downstream port
      // (whose link to the parent is inside the root complex or switch) the one below.
      int gen = 0, width = 0;
      if (int l = t.linkBetween(n.parent, id); l >= 0 && t.link(l).pcieGen > 0) {
        gen = t.link(l).pcieGen;
        width = t.link(l).pcieWidth;
      }
      for (int c : n.children)
        if (int l = t.linkBetween(id, c); gen == 0 && l >= 0 && t.link(l).pcieGen > 0) {
          gen = t.link(l).pcieGen;
          width = t.link(l).pcieWidth;
        }
      if (gen > 0) {
        const std::string speed = std::to_string(gtsOfGen(gen)).substr(0, gen >= 4 ? 4 : 3) + " GT/s PCIe\n";
        put(d + "/current_link_speed", speed);
        put(d + "/max_link_speed", speed);
        put(d + "/current_link_width", std::to_string(width) + "\n");
        put(d + "/max_link_width", std::to_string(width) + "\n");
      }
      put(d + "/numa_node", std::to_string(n.numa >= 0 ? t.node(n.numa).index : -1) + "\n");
      put(d + "/iommu_group/type", "identity\n");
      if (n.kind == NodeKind::PciBridge) put(d + "/config", config(0));
      if (n.kind == NodeKind::Gpu)
        put(d + "/resource",
            "0x00000000a0000000 0x00000000a0ffffff 0x0000000000040200\n"
            "0x0000200000000000 0x0000201fffffffff 0x000000000014220c\n");
      if (n.kind == NodeKind::Nic) {
        const std::string ib = "mlx5_" + std::to_string(n.index);
        put(d + "/infiniband/" + ib + "/.keep", "");
        put("/sys/class/infiniband/" + ib + "/ports/1/state", "4: ACTIVE\n");
      }
    }
  }
};

// Codes of the findings of one severity, over the machine and every pair, as "code subject".
std::set<std::string> faults(const DoctorReport& r) {
  std::set<std::string> out;
  auto add = [&](const DoctorFinding& f) {
    if (f.severity == Severity::Fault) out.insert(f.code + " " + f.subject);
  };
  for (const DoctorFinding& f : r.findings) add(f);
  for (const DoctorPair& p : r.pairs)
    for (const DoctorFinding& f : p.findings) add(f);
  return out;
}

bool hasFault(const DoctorReport& r, const std::string& code, const std::string& subjectPrefix) {
  for (const std::string& f : faults(r))
    if (f.rfind(code + " " + subjectPrefix, 0) == 0) return true;
  return false;
}

const DoctorPair* findPair(const DoctorReport& r, const Topology& t, const std::string& a,
                           const std::string& b) {
  for (const DoctorPair& p : r.pairs)
    if (t.node(p.a).name == a && t.node(p.b).name == b) return &p;
  return nullptr;
}

TEST(Doctor, HealthyMachinesHaveNoFaults) {
  for (const char* preset : {"dgx-h100", "dgx-a100", "pcie-8gpu-2socket", "cross-rc"}) {
    Fixture m(preset);
    const DoctorReport r = m.doctor();
    EXPECT_FALSE(r.pairs.empty()) << preset;
    EXPECT_TRUE(faults(r).empty()) << preset << ": " << doctorText(r, m.t, false);
    const DoctorPair* p = findPair(r, m.t, "GPU0", "NIC0");
    ASSERT_NE(p, nullptr) << preset;
    EXPECT_EQ(p->rung, "gpu-doorbell") << preset;
  }
}

TEST(Doctor, HealthyMachineFactsSayWhatWasFound) {
  Fixture m("dgx-h100");
  const std::string text = doctorText(m.doctor(false), m.t, false);
  EXPECT_NE(text.find("550.54.15 (open kernel module)"), std::string::npos) << text;
  EXPECT_NE(text.find("nvidia-peermem loaded; dma-buf possible"), std::string::npos) << text;
  EXPECT_NE(text.find("iommu=pt"), std::string::npos) << text;
  EXPECT_NE(text.find("GPU0 - NIC0  PIX"), std::string::npos) << text;
  EXPECT_NE(text.find("0 faults"), std::string::npos) << text;
}

TEST(Doctor, CrossRootComplexIsALimitNotAFault) {
  Fixture m("cross-rc");
  const DoctorReport r = m.doctor();
  const DoctorPair* p = findPair(r, m.t, "GPU0", "NIC0");
  ASSERT_NE(p, nullptr);
  ASSERT_FALSE(p->findings.empty());
  EXPECT_EQ(p->findings[0].code, "path-through-cpu");
  EXPECT_EQ(p->findings[0].severity, Severity::Limit);
  EXPECT_NE(p->findings[0].text.find("NCCL would not use GPUDirect RDMA"), std::string::npos);
  EXPECT_EQ(p->advisorChoice, "gdr-write");
}

TEST(Doctor, DowntrainedLinkWidth) {
  Fixture m("dgx-h100");
  m.put(m.pci("GPU0") + "/current_link_width", "8\n");
  const DoctorReport r = m.doctor();
  EXPECT_TRUE(hasFault(r, "link-downtrained", "GPU0 ")) << doctorText(r, m.t, false);
  EXPECT_EQ(faults(r).size(), 1u) << doctorText(r, m.t, false);  // one link, named once per pair kind
  const DoctorPair* p = findPair(r, m.t, "GPU0", "NIC0");
  ASSERT_NE(p, nullptr);
  ASSERT_FALSE(p->findings.empty());
  EXPECT_NE(p->findings[0].text.find("32 GT/s x8, both ends can do x16: 50%"), std::string::npos)
      << p->findings[0].text;
}

TEST(Doctor, DowntrainedNicSpeedIsAFaultButAnIdleGpuIsANote) {
  Fixture m("dgx-h100");
  m.put(m.pci("NIC0") + "/current_link_speed", "16.0 GT/s PCIe\n");
  m.put(m.pci("GPU1") + "/current_link_speed", "2.5 GT/s PCIe\n");
  const DoctorReport r = m.doctor();
  EXPECT_TRUE(hasFault(r, "link-downtrained", "NIC0 ")) << doctorText(r, m.t, false);
  EXPECT_FALSE(hasFault(r, "link-downtrained", "GPU1 ")) << doctorText(r, m.t, false);
  EXPECT_NE(doctorText(r, m.t, false).find("idle GPUs lower their link speed"), std::string::npos);
}

TEST(Doctor, AcsRedirectOnTheSwitch) {
  Fixture m("dgx-h100");
  m.put(m.parentPci("GPU0") + "/config", m.config(0x0c));  // request and completion redirect
  const DoctorReport r = m.doctor();
  const std::string port = m.t.node(m.t.node(m.t.find("GPU0")).parent).name;
  EXPECT_TRUE(hasFault(r, "acs-redirect", port)) << doctorText(r, m.t, false);
  EXPECT_EQ(faults(r).size(), 1u) << doctorText(r, m.t, false);
}

TEST(Doctor, AcsUnreadableWithoutRootIsANote) {
  Fixture m("dgx-h100");
  m.put(m.parentPci("GPU0") + "/config", std::string(64, '\0'));
  const DoctorReport r = m.doctor();
  EXPECT_TRUE(faults(r).empty());
  EXPECT_NE(doctorText(r, m.t, false).find("acs-unknown"), std::string::npos);
}

TEST(Doctor, NoPeermemAndNoDmabuf) {
  Fixture m("dgx-h100");
  m.put("/proc/modules", "nvidia 56827904 0 - Live 0x0000000000000000 (POE)\n");
  m.put("/proc/driver/nvidia/version",
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.161.07  Sat Feb 17\n");
  const DoctorReport r = m.doctor(false);
  EXPECT_TRUE(hasFault(r, "no-gpu-memory-registration", "NIC0 ")) << doctorText(r, m.t, false);
  EXPECT_NE(doctorText(r, m.t, false).find("needs the open kernel module"), std::string::npos);
  const DoctorPair* p = findPair(r, m.t, "GPU0", "NIC0");
  ASSERT_NE(p, nullptr);
  EXPECT_NE(p->advisorChoice, "gdr-read");  // the NIC cannot read GPU memory
}

TEST(Doctor, OldKernelWithoutPeermemHasNoDmabuf) {
  Fixture m("dgx-h100");
  m.put("/proc/modules", "nvidia 56827904 0 - Live 0x0000000000000000 (OE)\n");
  m.put("/proc/sys/kernel/osrelease", "5.4.0-150-generic\n");
  const DoctorReport r = m.doctor(false);
  EXPECT_TRUE(hasFault(r, "no-gpu-memory-registration", "NIC0 ")) << doctorText(r, m.t, false);
  EXPECT_NE(doctorText(r, m.t, false).find("needs kernel 5.12 or newer"), std::string::npos);
}

TEST(Doctor, DmabufAloneIsEnough) {
  Fixture m("dgx-h100");
  m.put("/proc/modules", "nvidia 56827904 0 - Live 0x0000000000000000 (OE)\n");
  EXPECT_TRUE(faults(m.doctor()).empty());
}

TEST(Doctor, NonRdmaNic) {
  Fixture m("dgx-h100");
  m.remove(m.pci("NIC0") + "/infiniband");
  m.put(m.pci("NIC0") + "/net/eth0/.keep", "");
  m.put("/sys/class/net/eth0/operstate", "up\n");
  const DoctorReport r = m.doctor(false);
  EXPECT_TRUE(hasFault(r, "nic-not-rdma", "NIC0 ")) << doctorText(r, m.t, false);
  EXPECT_EQ(faults(r).size(), 1u) << doctorText(r, m.t, false);
  const DoctorPair* p = findPair(r, m.t, "GPU0", "NIC0");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->rung, "host-staged");
}

TEST(Doctor, NicPortDown) {
  Fixture m("dgx-h100");
  m.put("/sys/class/infiniband/mlx5_3/ports/1/state", "1: DOWN\n");
  const DoctorReport r = m.doctor(false);
  EXPECT_TRUE(hasFault(r, "nic-link-down", "NIC3 ")) << doctorText(r, m.t, false);
  EXPECT_NE(doctorText(r, m.t, false).find("mlx5_3 port 1: DOWN"), std::string::npos);
}

TEST(Doctor, IommuTranslating) {
  Fixture m("pcie-8gpu-2socket");
  m.put(m.pci("GPU1") + "/iommu_group/type", "DMA-FQ\n");
  const DoctorReport r = m.doctor();
  EXPECT_TRUE(hasFault(r, "iommu-translating", "GPU1 ")) << doctorText(r, m.t, false);
  EXPECT_EQ(faults(r).size(), 1u);
}

TEST(Doctor, SmallBar1) {
  Fixture m("pcie-8gpu-2socket");
  m.put(m.pci("GPU2") + "/resource",
        "0x00000000a0000000 0x00000000a0ffffff 0x0000000000040200\n"
        "0x00000000b0000000 0x00000000bfffffff 0x000000000014220c\n");
  const DoctorReport r = m.doctor();
  EXPECT_TRUE(hasFault(r, "small-bar1", "GPU2 ")) << doctorText(r, m.t, false);
  EXPECT_NE(doctorText(r, m.t, false).find("BAR1 is 256 MiB"), std::string::npos);
}

TEST(Doctor, NoPeerMappingOverrideTakesTheCpuDoorbell) {
  Fixture m("cross-rc");
  m.put("/proc/driver/nvidia/params", "RegistryDwords: \"\"\n");
  const DoctorReport r = m.doctor();
  EXPECT_TRUE(hasFault(r, "no-gpu-doorbell", "NIC0 ")) << doctorText(r, m.t, false);
  const DoctorPair* p = findPair(r, m.t, "GPU0", "NIC0");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->rung, "cpu-doorbell");
}

TEST(Doctor, ProcessOnTheOtherSocket) {
  Fixture m("dgx-h100");
  m.put("/proc/self/status", "Cpus_allowed_list:\t56-111\n");
  const DoctorReport r = m.doctor(false);
  EXPECT_TRUE(hasFault(r, "numa-remote", "GPU0 ")) << doctorText(r, m.t, false);
  EXPECT_FALSE(hasFault(r, "numa-remote", "GPU7 ")) << doctorText(r, m.t, false);
}

TEST(Doctor, NoDriverWithGpus) {
  Fixture m("dgx-a100");
  m.remove("/proc/driver/nvidia");
  EXPECT_TRUE(hasFault(m.doctor(false), "no-nvidia-driver", "machine"));
}

TEST(Doctor, RecordedRunReplaysToTheSameReport) {
  Fixture m("dgx-a100");
  m.put(m.pci("GPU3") + "/current_link_width", "4\n");
  m.put("/sys/class/infiniband/mlx5_5/ports/1/state", "1: DOWN\n");
  char tmpl[] = "/tmp/ridge-doctor-rec-XXXXXX";
  const char* rec = mkdtemp(tmpl);
  ASSERT_NE(rec, nullptr);
  DoctorOptions all;
  all.allPairs = true;
  const std::string first = doctorJson(runDoctor(m.t, SysRoot(m.dir, rec), all), m.t);
  const std::string replay = doctorJson(runDoctor(m.t, SysRoot(rec), all), m.t);
  std::error_code ec;
  fs::remove_all(rec, ec);
  EXPECT_EQ(first, replay);
  EXPECT_NE(first.find("link-downtrained"), std::string::npos);
  EXPECT_NE(first.find("nic-link-down"), std::string::npos);
}

TEST(Doctor, WithoutKernelFilesOnlyPaths) {
  Topology t;
  ASSERT_TRUE(loadPreset("cross-rc", &t).isOk());
  const DoctorReport r = runDoctor(t, SysRoot("/nonexistent-ridge-root"), DoctorOptions{});
  EXPECT_EQ(r.count(Severity::Fault), 0);
  EXPECT_GT(r.count(Severity::Limit), 0);
  ASSERT_EQ(r.facts.size(), 1u);
  EXPECT_EQ(r.facts[0].first, "kernel files");
}

}  // namespace
}  // namespace ridge::topo
