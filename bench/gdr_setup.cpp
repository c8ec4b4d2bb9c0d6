// ridge-bench: --gdr-mode, the environment that makes every pair of ranks go through the gdr
// transport over a NIC (docs/gdr-write.md), and how the report labels its figures.
//
// The library reads its settings from the environment at communicator set-up, so this runs
// in main() before any rank exists: forked ranks and an mpirun re-exec inherit what is set
// here. What ridge-bench set and what it found already set is kept for the header, so a
// reader of the output knows which path the figures measure.
#include <cstdlib>
#include <cstring>

#include "bench.h"

namespace rbench {

namespace {

std::string envOr(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return (v && *v) ? std::string(v) : std::string(fallback);
}

bool envSet(const char* name) {
  const char* v = std::getenv(name);
  return v && *v;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  return s;
}

}  // namespace

bool gdrModeKnown(const std::string& mode) {
  return mode == "read" || mode == "write" || mode == "staged" || mode == "auto";
}

bool prepareGdr(const Options& o, bool oneHost, GdrSetup* out, std::string* err) {
  GdrSetup g;
  const std::string envMode = lower(envOr("RIDGE_GDR_MODE", "off"));
  std::string mode = o.gdrMode;
  if (mode.empty()) {
    // Without the option the bench changes nothing, but a gdr run set up by hand through the
    // environment still gets its figures labeled.
    if (envMode == "off") {
      *out = g;
      return true;
    }
    mode = envMode;
  } else if (envMode != "off" && envMode != mode) {
    *err = "--gdr-mode " + mode + " contradicts RIDGE_GDR_MODE=" + envOr("RIDGE_GDR_MODE", "") +
           " in the environment; unset one of them";
    return false;
  }
  g.active = true;
  g.mode = mode;

  const std::string net = lower(envOr("RIDGE_NET", "auto"));
  if (net == "socket") {
    *err =
        "--gdr-mode needs a NIC: RIDGE_NET=softnic or verbs (RIDGE_NET=socket is set; the gdr "
        "transport does not run over TCP)";
    return false;
  }
  if (net != "auto" && net != "softnic" && net != "verbs") {
    *err = "--gdr-mode: RIDGE_NET=" + envOr("RIDGE_NET", "") + " names no NIC provider (softnic or verbs)";
    return false;
  }
  const std::string model = envOr("RIDGE_SOFTNIC_PCIE_MODEL", "");
  if (net == "verbs" && !model.empty()) {
    *err =
        "RIDGE_SOFTNIC_PCIE_MODEL paces the software NIC, but RIDGE_NET=verbs uses a real one: "
        "its figures would be neither measured nor modeled; unset one of them";
    return false;
  }
  const bool shmOn = envSet("RIDGE_SHM") && std::strtol(envOr("RIDGE_SHM", "1").c_str(), nullptr, 10) != 0;
  if (oneHost && shmOn) {
    *err = "--gdr-mode with RIDGE_SHM=" + envOr("RIDGE_SHM", "") +
           ": the ranks of this run share a host, so shared memory would carry every pair and the "
           "gdr transport none; unset RIDGE_SHM (ridge-bench then sets 0)";
    return false;
  }

  if (!o.gdrMode.empty()) setenv("RIDGE_GDR_MODE", mode.c_str(), 1);
  g.notes.push_back("gdr: RIDGE_GDR_MODE=" + mode +
                    (o.gdrMode.empty() ? " (from the environment)" : " (--gdr-mode)"));
  if (net == "auto") {
    setenv("RIDGE_NET", "softnic", 1);
    g.notes.push_back("gdr: RIDGE_NET=softnic (set by ridge-bench: the software NIC)");
  } else {
    g.notes.push_back("gdr: RIDGE_NET=" + net + " (from the environment)");
  }
  if (!envSet("RIDGE_SHM")) {
    setenv("RIDGE_SHM", "0", 1);
    g.notes.push_back("gdr: RIDGE_SHM=0 (set by ridge-bench: ranks of one host talk through the NIC too)");
  } else {
    const std::string shm = envOr("RIDGE_SHM", "");
    g.notes.push_back("gdr: RIDGE_SHM=" + shm +
                      (shm == "0" ? " (from the environment: ranks of one host talk through the NIC too)"
                                  : " (from the environment: pairs on one host use shared memory, only "
                                    "pairs between hosts go through the NIC)"));
  }
  if (!model.empty()) {
    g.modeled = true;
    const long scale = std::strtol(envOr("RIDGE_GDR_PACE_SCALE", "1").c_str(), nullptr, 10);
    g.paceScale = scale < 1 ? 1 : scale > 1000 ? 1000 : static_cast<int>(scale);
    std::string line = "gdr: RIDGE_SOFTNIC_PCIE_MODEL=" + model +
                       ": the software NIC is paced by the PCIe model, so every time and bandwidth "
                       "below is MODELED, not measured on a PCIe bus";
    if (g.paceScale > 1)
      line += "; modeled times were multiplied by RIDGE_GDR_PACE_SCALE=" + std::to_string(g.paceScale) +
              " in the data path and are divided back here (the emulation's own cost is divided too)";
    g.notes.push_back(line);
  }
  g.notes.push_back(
      "gdr: RIDGE_DEBUG=INFO shows each rank's mode and staging tier at set-up and its gdr "
      "counters (slots written, credit stalls, stagedLost) when the communicator is destroyed");
  *out = g;
  return true;
}

}  // namespace rbench

namespace rbench {

namespace {
bool envFalse(const std::string& v) {
  const std::string l = lower(v);
  return l == "0" || l == "false" || l == "off" || l == "no";
}
}  // namespace

TransportSetup prepareTransport(const Options& o, const GdrSetup& gdr) {
  TransportSetup t;
  std::vector<std::string> setHere;
  // Gloo has TCP only: Ridge goes over TCP too, unless the user chose otherwise.
  if (o.peerGloo && !gdr.active) {
    if (!envSet("RIDGE_SHM")) {
      setenv("RIDGE_SHM", "0", 1);
      setHere.push_back("RIDGE_SHM=0");
    }
    if (!envSet("RIDGE_NET")) {
      setenv("RIDGE_NET", "socket", 1);
      setHere.push_back("RIDGE_NET=socket");
    }
  }
  const bool shm = !envFalse(envOr("RIDGE_SHM", "1"));
  const std::string net = lower(envOr("RIDGE_NET", "auto"));
  t.ridge = shm ? "shared memory" : (net == "auto" || net == "socket") ? "tcp" : net;
  std::string how = "RIDGE_SHM=" + envOr("RIDGE_SHM", "1") + ", RIDGE_NET=" + envOr("RIDGE_NET", "auto");
  if (!setHere.empty()) {
    std::string list;
    for (const auto& s : setHere) list += (list.empty() ? "" : " ") + s;
    how += "; " + list + " set by ridge-bench for --peer gloo";
  }
  if (o.peerGloo) {
    t.peer = "tcp";
    t.alike = t.ridge == "tcp";
    if (t.alike)
      t.notes.push_back(
          "transport: like with like: Ridge over TCP sockets (" + how +
          ") and Gloo's tcp device, both through this host's kernel TCP (Gloo has no shared-memory "
          "transport)");
    else
      t.notes.push_back("transport: NOT alike: Ridge over " + t.ridge + " (" + how +
                        ") vs Gloo over TCP: the ratio compares transports as well as libraries");
  } else if (o.peerMpi) {
    t.peer = "mpi";
    t.notes.push_back("transport: Ridge over " + t.ridge + " (" + how +
                      "); MPI over its own choice (on one host "
                      "Open MPI uses shared memory, btl vader)");
  } else {
    t.notes.push_back("transport: Ridge ranks of one host over " + t.ridge + " (" + how + ")");
  }
  return t;
}

}  // namespace rbench
