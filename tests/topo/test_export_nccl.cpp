// ridge-topo export-nccl: the NCCL topology file Ridge writes must read back (through
// Ridge's own NCCL reader) as the same machine in NCCL's terms: the same GPUs and NICs by
// bus id, the same NCCL path class, bottleneck bandwidth and NVLink lanes for every pair,
// the same NUMA nodes and CPU affinity. Checked on every preset and on the real NCCL files
// in ../shared/topo_samples (skipped when absent).
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>

#include "topo/export_nccl.h"
#include "topo/load.h"
#include "topo/presets.h"
#include "topo_samples.h"

namespace ridge::topo {
namespace {

// A device's key across the two graphs: its bus id, else its display name.
std::string keyOf(const Topology& t, int id) {
  return t.node(id).busId.empty() ? t.node(id).name : t.node(id).busId;
}

std::map<std::string, int> devices(const Topology& t) {
  std::map<std::string, int> out;
  for (int g : t.gpus()) out[keyOf(t, g)] = g;
  for (int n : t.nics()) out[keyOf(t, n)] = n;
  return out;
}

void expectSameInNcclTerms(const Topology& a, const std::string& what) {
  const std::string xml = topologyToNcclXml(a);
  Topology b;
  const Status st = loadTopologyText(xml, what + " exported", &b);
  ASSERT_TRUE(st.isOk()) << what << ": " << st.message() << "\n" << xml;
  const std::map<std::string, int> da = devices(a), db = devices(b);
  ASSERT_EQ(da.size(), db.size()) << what << "\n" << xml;
  ASSERT_EQ(a.gpus().size(), b.gpus().size()) << what;
  for (const auto& [key, ida] : da) {
    ASSERT_TRUE(db.count(key)) << what << ": " << key << " lost\n" << xml;
    EXPECT_EQ(a.node(ida).kind, b.node(db.at(key)).kind) << what << " " << key;
    EXPECT_EQ(a.node(ida).smVersion, b.node(db.at(key)).smVersion) << what << " " << key;
  }
  for (const auto& [ka, a1] : da)
    for (const auto& [kb, a2] : da) {
      if (ka >= kb) continue;
      const Path pa = a.path(a1, a2), pb = b.path(db.at(ka), db.at(kb));
      EXPECT_EQ(ncclClassName(pa.nccl), std::string(ncclClassName(pb.nccl)))
          << what << ": " << ka << " - " << kb;
      EXPECT_EQ(pa.nvlinks, pb.nvlinks) << what << ": " << ka << " - " << kb;
      // Each NCCL cpu reads back as a package of its own, so a path between NUMA nodes of
      // one package (SYS in NCCL's terms either way) is priced at the socket link after.
      if (pa.nccl != NcclClass::SYS)
        EXPECT_NEAR(pa.bandwidthGBs, pb.bandwidthGBs, 1e-9) << what << ": " << ka << " - " << kb;
    }
  const std::vector<int> na = a.nodesOfKind(NodeKind::Numa), nb = b.nodesOfKind(NodeKind::Numa);
  ASSERT_EQ(na.size(), nb.size()) << what;
  for (size_t i = 0; i < na.size(); ++i) {
    EXPECT_EQ(a.node(na[i]).index, b.node(nb[i]).index) << what;
    EXPECT_EQ(a.node(na[i]).cpus, b.node(nb[i]).cpus) << what;
  }
  // Exporting the re-read machine gives the same file: nothing drifts on a second trip.
  EXPECT_EQ(topologyToNcclXml(b), xml) << what;
}

TEST(ExportNccl, PresetsReadBackTheSame) {
  for (const std::string& name : presetNames()) {
    Topology t;
    ASSERT_TRUE(loadPreset(name, &t).isOk());
    expectSameInNcclTerms(t, name);
  }
}

TEST(ExportNccl, SchemaAttributesNcclRequires) {
  Topology t;
  ASSERT_TRUE(loadPreset("dgx-a100", &t).isOk());
  const std::string xml = topologyToNcclXml(t);
  EXPECT_EQ(xml.rfind("<system version=\"1\">\n", 0), 0u);
  EXPECT_NE(xml.find("<cpu numaid=\"3\" arch=\"x86_64\" vendor=\"AuthenticAMD\">"), std::string::npos) << xml;
  EXPECT_NE(xml.find("class=\"0x030200\" vendor=\"0x10de\""), std::string::npos) << xml;
  EXPECT_NE(xml.find("link_speed=\"16 GT/s\" link_width=\"16\""), std::string::npos) << xml;
  EXPECT_NE(xml.find("<gpu dev=\"0\" sm=\"80\" rank=\"0\" gdr=\"1\">"), std::string::npos) << xml;
  EXPECT_NE(xml.find("count=\"2\" tclass=\"0x068000\"/>"), std::string::npos) << xml;
  EXPECT_NE(xml.find("<net name=\"mlx5_0\" dev=\"0\" speed=\"200000\" port=\"1\""), std::string::npos) << xml;
  Topology intel;
  ASSERT_TRUE(loadPreset("dgx-h100", &intel).isOk());
  EXPECT_NE(topologyToNcclXml(intel).find("vendor=\"GenuineIntel\" familyid=\"6\" modelid=\"143\""),
            std::string::npos);
}

TEST(ExportNccl, AffinityWrittenAsNcclMask) {
  Topology t;
  ASSERT_TRUE(loadTopologyFile(kData + "/nccl-two-numa.xml", &t).isOk());
  const std::string xml = topologyToNcclXml(t);
  EXPECT_NE(xml.find("<cpu numaid=\"1\" affinity=\"0000ff00\""), std::string::npos) << xml;
  expectSameInNcclTerms(t, "nccl-two-numa.xml");
}

TEST(ExportNccl, RealNcclFilesReadBackTheSame) {
  SKIP_WITHOUT_SAMPLES();
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kSamples + "/nccl")) {
    Topology t;
    if (!loadTopologyFile(entry.path().string(), &t).isOk()) continue;  // the graph file
    expectSameInNcclTerms(t, entry.path().filename().string());
    ++checked;
  }
  EXPECT_GE(checked, 5);
}

TEST(ExportNccl, HwlocSamplesReadBackTheSame) {
  SKIP_WITHOUT_SAMPLES();
  for (const auto& entry : std::filesystem::directory_iterator(kSamples + "/hwloc")) {
    Topology t;
    ASSERT_TRUE(loadTopologyFile(entry.path().string(), &t).isOk()) << entry.path();
    expectSameInNcclTerms(t, entry.path().filename().string());
  }
}

}  // namespace
}  // namespace ridge::topo
