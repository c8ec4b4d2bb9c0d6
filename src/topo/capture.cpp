// `ridge-topo capture DIR` (doctor.h): this machine's topology and every kernel file the
// doctor reads, in one folder a user can attach to a bug report and anyone can replay with
// `ridge-topo doctor --input DIR`.
#include <sys/utsname.h>

#include <ctime>

#include "topo/discover.h"
#include "topo/doctor.h"
#include "topo/load.h"
#include "topo/topo_json.h"

namespace ridge::topo {

Status captureMachine(const std::string& dir, std::string* summary) {
  if (!makeDirs(dir)) return makeError(ridgeSystemError, "capture: cannot create %s", dir.c_str());
  Topology t;
  RIDGE_TRY(discoverThisMachine(&t));
  std::vector<std::string> written;
  auto write = [&](const std::string& name, const std::string& text) -> Status {
    if (!writeFile(dir + "/" + name, text))
      return makeError(ridgeSystemError, "capture: cannot write %s/%s", dir.c_str(), name.c_str());
    written.push_back(name);
    return Status::ok();
  };
  RIDGE_TRY(write("topology.json", topologyToJson(t)));
  std::string xml, version;
  if (exportHwlocXml(&xml, &version).isOk()) RIDGE_TRY(write("hwloc.xml", xml));

  // Run the doctor over every pair while recording what it reads, then the attributes of
  // every PCI function and NIC port it did not need, so the folder also serves a reader.
  const SysRoot recorder("", dir);
  DoctorOptions all;
  all.allPairs = true;
  (void)runDoctor(t, recorder, all);
  std::string ignored;
  for (const Node& n : t.nodes()) {
    if (n.busId.size() != 12) continue;
    for (const char* attr : {"class", "vendor", "device", "numa_node", "local_cpulist", "current_link_speed",
                             "max_link_speed", "current_link_width", "max_link_width", "resource", "config"})
      recorder.bytes("/sys/bus/pci/devices/" + n.busId + "/" + attr, &ignored);
    for (const std::string& ib : recorder.list("/sys/bus/pci/devices/" + n.busId + "/infiniband"))
      for (const std::string& port : recorder.list("/sys/class/infiniband/" + ib + "/ports"))
        for (const char* attr : {"state", "phys_state", "rate", "link_layer"})
          recorder.bytes("/sys/class/infiniband/" + ib + "/ports/" + port + "/" + attr, &ignored);
    for (const std::string& ifname : recorder.list("/sys/bus/pci/devices/" + n.busId + "/net"))
      for (const char* attr : {"operstate", "speed", "type", "mtu"})
        recorder.bytes("/sys/class/net/" + ifname + "/" + attr, &ignored);
  }
  for (const std::string& node : recorder.list("/sys/devices/system/node"))
    if (node.rfind("node", 0) == 0) recorder.bytes("/sys/devices/system/node/" + node + "/cpulist", &ignored);
  for (const char* f : {"/proc/version", "/proc/cpuinfo"}) recorder.bytes(f, &ignored);

  utsname u{};
  uname(&u);
  const std::time_t now = std::time(nullptr);
  char when[64];
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
  RIDGE_TRY(
      write("README.txt", format("Captured by ridge-topo capture on %s (%s %s) at %s.\n"
                                 "topology.json  the machine as Ridge sees it (ridge-topo --input FILE)\n"
                                 "hwloc.xml      lstopo's view, when Ridge was built with hwloc\n"
                                 "sys/, proc/    the kernel files ridge-topo doctor reads, same paths\n\n"
                                 "Replay: ridge-topo doctor --input THIS_FOLDER\n",
                                 u.nodename, u.sysname, u.release, when)));
  *summary = format("captured %s (%zu GPUs, %zu NICs) into %s: ", t.name.c_str(), t.gpus().size(),
                    t.nics().size(), dir.c_str());
  for (size_t i = 0; i < written.size(); ++i) *summary += (i ? ", " : "") + written[i];
  *summary += ", sys/, proc/";
  return Status::ok();
}

Status loadCapturedTopology(const std::string& dir, Topology* t) {
  RIDGE_TRY(loadTopologyFile(dir + "/topology.json", t));
  t->source = "captured in " + dir + ": " + t->source;
  return Status::ok();
}

}  // namespace ridge::topo
