// ridge-topo: looks at a machine the way Ridge does (this one, a file describing one, or a
// built-in preset), and lists Ridge's settings.
//
//   ridge-topo tree      [WHICH] [--json | --dot | --svg FILE | --png FILE]   the PCIe tree
//   ridge-topo matrix    [WHICH] [--nccl] [--json]       path classes, like nvidia-smi topo -m
//   ridge-topo paths     [WHICH] A [B] [--json]          hops between two devices
//   ridge-topo gdr       [WHICH] [GPU NIC] [--all] [--constants FILE] [--json]   GDR advisor
//   ridge-topo draw      [WHICH] [--dot | --svg FILE | --png FILE]   the drawing (dot source)
//   ridge-topo plan / simulate [WHICH] ...              the planner (tools/topo_commands.h)
//   ridge-topo doctor    [WHICH] [A B] [--all] [--json]  what stands between pairs and full speed
//   ridge-topo capture DIR                               this machine into a folder (--input DIR)
//   ridge-topo export-nccl [WHICH] FILE                  an NCCL topology file (NCCL_TOPO_FILE)
//   ridge-topo presets                                   the built-in machines
//   ridge-topo summary [WHICH] [--compact]               packages, NUMA nodes, cores, GPUs, NICs
//   ridge-topo settings [--markdown]                     every RIDGE_* variable
//   ridge-topo help [SUBCOMMAND]
//
// WHICH is --input FILE (hwloc XML, NCCL topology XML or Ridge JSON, told apart by content),
// --input DIR (a capture) or --preset NAME; without either, this machine is discovered. These options may
// also come before the subcommand. Each subcommand is one row of kCommands: a name, a synopsis, a paragraph
// of help and a handler that receives the remaining arguments through ArgList. Exit status: 0 success, 1 the
// command failed, 2 bad usage.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/json.h"
#include "core/settings.h"
#include "ridge/version.h"
#include "topo/discover.h"
#include "topo/doctor.h"
#include "topo/export_nccl.h"
#include "topo/gdr_advisor.h"
#include "topo/gdr_placement.h"
#include "topo/load.h"
#include "topo/model.h"
#include "topo/presets.h"
#include "topo/render.h"
#include "topo/summary.h"
#include "topo/topo_json.h"
#include "topo_commands.h"
#include "transports/verbs/verbs.h"

namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

using ridge::Status;
namespace topo = ridge::topo;
namespace json = ridge::json;

// The arguments after the subcommand. Handlers take the options they know; finish() then
// rejects whatever is left, so every subcommand reports unknown options the same way.
class ArgList {
 public:
  ArgList(const char* command, std::vector<std::string> args)
      : command_(command), args_(std::move(args)), used_(args_.size(), false) {}

  // True when `name` is present (and consumes it).
  bool flag(const char* name) {
    bool found = false;
    for (size_t i = 0; i < args_.size(); ++i) {
      if (!used_[i] && args_[i] == name) used_[i] = found = true;
    }
    return found;
  }

  // "--name VALUE" or "--name=VALUE"; false when absent. A missing value is a usage error.
  bool option(const char* name, std::string* value) {
    const size_t len = std::strlen(name);
    for (size_t i = 0; i < args_.size(); ++i) {
      if (used_[i]) continue;
      if (args_[i] == name) {
        used_[i] = true;
        if (i + 1 >= args_.size() || used_[i + 1]) {
          error_ = std::string(name) + " needs a value";
          return false;
        }
        used_[i + 1] = true;
        *value = args_[i + 1];
        return true;
      }
      if (args_[i].compare(0, len, name) == 0 && args_[i].size() > len && args_[i][len] == '=') {
        used_[i] = true;
        *value = args_[i].substr(len + 1);
        return true;
      }
    }
    return false;
  }

  // "--name [VALUE]": true when present; the next argument is its value unless it is an
  // option (or absent), as in "plan --dot FILE" and "plan --dot".
  bool optionalValue(const char* name, std::string* value) {
    for (size_t i = 0; i < args_.size(); ++i) {
      if (used_[i] || args_[i] != name) continue;
      used_[i] = true;
      if (i + 1 < args_.size() && !used_[i + 1] && !args_[i + 1].empty() && args_[i + 1][0] != '-') {
        used_[i + 1] = true;
        *value = args_[i + 1];
      }
      return true;
    }
    return false;
  }

  // Positional (non-option) arguments not consumed yet, in order; consumes them.
  std::vector<std::string> positionals() {
    std::vector<std::string> out;
    for (size_t i = 0; i < args_.size(); ++i) {
      if (!used_[i] && (args_[i].empty() || args_[i][0] != '-')) {
        used_[i] = true;
        out.push_back(args_[i]);
      }
    }
    return out;
  }

  // Every argument not consumed yet, in order; consumes them (for subcommands that parse
  // their own options, such as plan and simulate).
  std::vector<std::string> rest() {
    std::vector<std::string> out;
    for (size_t i = 0; i < args_.size(); ++i) {
      if (!used_[i]) {
        used_[i] = true;
        out.push_back(args_[i]);
      }
    }
    return out;
  }

  // True when -h or --help is among the arguments.
  bool wantsHelp() const {
    for (size_t i = 0; i < args_.size(); ++i)
      if (!used_[i] && (args_[i] == "-h" || args_[i] == "--help")) return true;
    return false;
  }

  // False (after printing why) when an option was malformed or an argument is left over.
  bool finish() {
    for (size_t i = 0; i < args_.size() && error_.empty(); ++i) {
      if (!used_[i]) error_ = "unexpected argument '" + args_[i] + "'";
    }
    if (error_.empty()) return true;
    std::fprintf(stderr, "ridge-topo %s: %s (see 'ridge-topo help %s')\n", command_, error_.c_str(),
                 command_);
    return false;
  }

 private:
  const char* command_;
  std::vector<std::string> args_;
  std::vector<bool> used_;
  std::string error_;
};

struct Command {
  const char* name;
  const char* synopsis;
  const char* help;
  int (*run)(ArgList& args);
};

int runTree(ArgList& args);
int runMatrix(ArgList& args);
int runPaths(ArgList& args);
int runGdr(ArgList& args);
int runDraw(ArgList& args);
int runPlan(ArgList& args);
int runSimulate(ArgList& args);
int runDoctor(ArgList& args);
int runCapture(ArgList& args);
int runExportNccl(ArgList& args);
int runPresets(ArgList& args);
int runSummary(ArgList& args);
int runSettings(ArgList& args);
int runHelp(ArgList& args);

const Command kCommands[] = {
    {"tree", "tree [WHICH] [--json | --dot | --svg FILE | --png FILE]",
     "The PCIe tree: packages, NUMA nodes, host bridges, PCIe switches, GPUs, NICs with their\n"
     "ports, NVMe drives, each with the link it hangs from (generation, width, GB/s); root\n"
     "ports and switch ports are folded into their host bridge or switch, and branches with\n"
     "nothing but other PCI functions are counted in one line. Then the NVSwitch fabric and\n"
     "the socket links. --json prints the whole topology in Ridge's JSON format (readable\n"
     "with --input); --dot, --svg and --png draw it (see 'draw').\n\n"
     "  ridge-topo tree\n"
     "  ridge-topo tree --preset dgx-h100\n"
     "  ridge-topo tree --input machine.xml --json > machine.json",
     runTree},
    {"matrix", "matrix [WHICH] [--nccl] [--json]",
     "GPUs and NICs in rows and columns with the class of the path between each pair, in\n"
     "nvidia-smi topo -m's words (X, NV#, PIX, PXB, PHB, NODE, SYS) or with --nccl in NCCL's\n"
     "(LOC, NVL, NVB, PIX, PXB, PHB, SYS), then the socket and NUMA node of each row, a\n"
     "legend and the NICs' OS names. --json adds the bottleneck bandwidth of every pair.\n\n"
     "  ridge-topo matrix --preset dgx-a100\n"
     "  ridge-topo matrix --nccl --input /var/run/nccl_topo.xml",
     runMatrix},
    {"paths", "paths [WHICH] A [B] [--json]",
     "The route from device A to device B, hop by hop: each link's kind, PCIe generation and\n"
     "width or NVLink lanes, bandwidth and latency; then the bottleneck, the total latency\n"
     "and both classes. With only A, one line per GPU and NIC reachable from A. Devices are\n"
     "named as in the tree (GPU3, NIC0), by OS name (mlx5_0, cuda1, eth0) or by bus id.\n\n"
     "  ridge-topo paths --preset cross-rc GPU0 NIC0\n"
     "  ridge-topo paths GPU0",
     runPaths},
    {"gdr", "gdr [WHICH] [GPU NIC] [--all] [--constants FILE] [--json | --dot | --svg FILE | --png FILE]",
     "The GDR advisor: how a GPU's data should reach a NIC (gdr-read: the NIC reads GPU\n"
     "memory; gdr-write: the GPU writes into staging memory next to the NIC; host-staged:\n"
     "a copy to host memory and a CPU proxy), with the PCIe model's latency and bandwidth\n"
     "for each. Without GPU NIC: one line per GPU for the NIC the advisor recommends (every\n"
     "pair with --all). --constants reads PCIe model constants (key = value) over the\n"
     "defaults of src/topo/pcie_constants.def.\n\n"
     "  ridge-topo gdr --preset cross-rc\n"
     "  ridge-topo gdr --preset dgx-h100 GPU0 NIC4",
     runGdr},
    {"draw", "draw [WHICH] [--dot | --svg FILE | --png FILE]",
     "Draws the tree with Graphviz: one cluster per socket, GPUs (green boxes), NICs (blue\n"
     "ellipses), PCIe switches (yellow hexagons), host bridges, CPUs and NVMe drives told\n"
     "apart by shape and colour, links labelled with their speeds, the socket link, the\n"
     "NVSwitch fabric summarized as one node with an edge per GPU, and the route from each\n"
     "GPU to the NIC the GDR advisor recommends drawn in red. Without an option prints the\n"
     "dot source; --svg and --png run Graphviz's 'dot' (Debian: apt-get install graphviz).\n\n"
     "  ridge-topo draw --preset dgx-h100 --svg dgx-h100.svg\n"
     "  ridge-topo draw | dot -Tpdf -o machine.pdf",
     runDraw},
    {"plan",
     "plan [WHICH] -n RANKS [--nodes N] [--ranks-per-node K] [--network SPEC] [--max-channels C] [--full] "
     "[--json | --dot [FILE] | --svg FILE | --png FILE]",
     "Builds Ridge's collective plan (rings, trees, a transport per hop) for N nodes of the\n"
     "machine. --network: comma-separated rails=R, nic=400G, tiers=NAME:RADIX:SPEED[:OVERSUB][:LAT]\n"
     "(repeated, leaf first), latency=1us, transport=rdma|tcp (docs/planner.md, \"Simulator\").\n"
     "Network sends take the GDR advisor's mode for each GPU-NIC pair; RIDGE_GDR_MODE=read,\n"
     "write or staged forces one on every pair. --json prints what a communicator of N ranks\n"
     "on GPUs 0..N-1 of one machine (with RIDGE_TOPO_FILE=FILE for --input FILE) runs and\n"
     "writes to RIDGE_PLAN_DUMP, byte for byte (docs/planner.md, \"A communicator's plan\").\n\n"
     "  ridge-topo --preset dgx-h100 plan -n 16 --nodes 2 --network rails=8,nic=400G",
     runPlan},
    {"simulate",
     "simulate [WHICH] [plan options] [--collective LIST] [-b MIN] [-e MAX] [-f FACTOR] [--algo RULES] "
     "[--links N] [--compare] [--json]",
     "Predicts time, algbw and busbw per collective and size for the machine's plan (the\n"
     "plan options as for 'plan'), then the busiest resources at the largest size.\n\n"
     "  ridge-topo --preset dgx-h100 simulate --nodes 4 --ranks-per-node 8 -b 8 -e 1G",
     runSimulate},
    {"doctor", "doctor [WHICH] [A B] [--all] [--json]",
     "For each GPU-GPU pair and each GPU with its nearest NICs (--all: every NIC; A B: one\n"
     "pair), what stands between it and full speed, in words: the path class; PCIe links\n"
     "trained below what both ends can do; ACS redirecting peer traffic on a switch of the\n"
     "path (needs root to read); IOMMU translation; BAR1 size; the process's NUMA placement;\n"
     "for NICs RDMA capability and link state, GPU memory registration (nvidia-peermem or\n"
     "dma-buf) and GPU doorbells (PeerMappingOverride), the GDR-write ladder rung and the\n"
     "GDR advisor's choice. Faults are fixable, limits are where the devices sit. Reads this\n"
     "machine's /sys and /proc, or a folder 'ridge-topo capture' wrote (--input DIR).\n\n"
     "  ridge-topo doctor\n"
     "  ridge-topo doctor GPU0 NIC0\n"
     "  ridge-topo doctor --input ./capture-node17 --json",
     runDoctor},
    {"capture", "capture DIR",
     "Writes this machine into DIR for a bug report: topology.json (Ridge's format),\n"
     "hwloc.xml, and every /sys and /proc file the doctor reads (PCIe link attributes and\n"
     "config space of the devices on the paths, InfiniBand and network ports, IOMMU groups,\n"
     "/proc/modules, kernel version and command line, the NVIDIA driver's version and\n"
     "parameters, the process's CPUs). Any subcommand reads it back with --input DIR. Run as\n"
     "root to include the PCIe extended config space (ACS).\n\n"
     "  sudo ridge-topo capture node17 && tar czf node17.tgz node17\n"
     "  ridge-topo doctor --input node17",
     runCapture},
    {"export-nccl", "export-nccl [WHICH] FILE",
     "Writes the machine as an NCCL topology file (NCCL_TOPO_FILE, <system version=\"1\">): a\n"
     "<cpu> per NUMA node with its CPU affinity, nested <pci> switches, GPUs with their NVLinks\n"
     "and NICs with their ports. Give it to NCCL where its own detection sees less than Ridge\n"
     "does (in a VM, NCCL_TOPO_FILE=FILE). FILE '-' writes to stdout.\n\n"
     "  ridge-topo export-nccl /etc/nccl-topo.xml\n"
     "  ridge-topo export-nccl --preset dgx-h100 -",
     runExportNccl},
    {"presets", "presets", "Lists the built-in machines that --preset accepts.", runPresets},
    {"summary", "summary [WHICH] [--compact]",
     "Counts packages, NUMA nodes, cores, hardware threads (PUs), GPUs and NICs, and lists\n"
     "the GPUs and NICs with their PCI address and link. Without WHICH it describes this\n"
     "machine (hwloc when built in, else /proc and /sys). --input reads an hwloc XML file\n"
     "(lstopo --of xml), an NCCL topology file, Ridge JSON or a captured folder (--xml FILE\n"
     "is the older spelling for the XML files); --preset a built-in machine (cores unknown).\n"
     "--compact prints the one-line form that ranks exchange at bootstrap.",
     runSummary},
    {"settings", "settings [--markdown]",
     "Lists every RIDGE_* environment variable with its type, default, current value and\n"
     "description. --markdown prints the page kept as docs/settings.md instead.",
     runSettings},
    {"help", "help [SUBCOMMAND]", "Shows this text, or the help of one subcommand.", runHelp},
};

const Command* findCommand(const std::string& name) {
  for (const Command& c : kCommands) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

void printUsage(FILE* f) {
  std::fprintf(f, "usage: ridge-topo SUBCOMMAND [WHICH] [OPTIONS]\n\nsubcommands:\n");
  for (const Command& c : kCommands) std::fprintf(f, "  %s\n", c.synopsis);
  std::fprintf(f,
               "\nWHICH machine (before or after the subcommand):\n"
               "  (nothing)          this machine, discovered live\n"
               "  --input FILE|DIR   hwloc XML, NCCL topology XML or Ridge JSON (told apart by content),\n"
               "                     or a folder written by 'ridge-topo capture'\n"
               "  --preset NAME      a built-in machine: ");
  const std::vector<std::string> names = topo::presetNames();
  for (size_t i = 0; i < names.size(); ++i) std::fprintf(f, "%s%s", i ? ", " : "", names[i].c_str());
  std::fprintf(f,
               "\n\nOutput: text (coloured on a terminal unless NO_COLOR is set), --json, --dot, or a\n"
               "picture with --svg FILE / --png FILE (needs Graphviz's dot).\n\n"
               "examples:\n"
               "  ridge-topo matrix\n"
               "  ridge-topo --preset dgx-h100 tree\n"
               "  ridge-topo paths --preset cross-rc GPU0 NIC0\n"
               "  ridge-topo draw --preset dgx-a100 --svg dgx-a100.svg\n\n"
               "ridge-topo --version prints the version.\n\n"
               "exit status: 0 success, 1 the command failed (unreadable file, unknown preset or\n"
               "device, Graphviz missing), 2 bad usage.\n\n"
               "'ridge-topo help SUBCOMMAND' describes one of them.\n");
}

// ---- common options: which machine, output format --------------------------------------

struct Common {
  std::string input, preset;
  bool json = false, dot = false;
  std::string svg, png;
  ridge::tools::CommonOptions out;
};

// Consumes --input, --preset and the output options. False on a usage error (printed).
bool parseCommon(const char* cmd, ArgList& args, Common* c, bool drawingAllowed) {
  const bool haveInput = args.option("--input", &c->input);
  const bool havePreset = args.option("--preset", &c->preset);
  c->json = args.flag("--json");
  c->dot = args.flag("--dot");
  args.option("--svg", &c->svg);
  args.option("--png", &c->png);
  if (haveInput && havePreset) {
    std::fprintf(stderr, "ridge-topo %s: --input and --preset are alternatives; give one\n", cmd);
    return false;
  }
  // A FIFO, device or socket is refused before anything opens it (opening a FIFO blocks).
  if (haveInput) {
    if (Status st = topo::checkInputPath(c->input, /*allowDirectory=*/true); !st.isOk()) {
      std::fprintf(stderr, "ridge-topo %s: --input %s\n", cmd, st.message().c_str());
      return false;
    }
  }
  const int formats = int(c->json) + int(c->dot) + int(!c->svg.empty()) + int(!c->png.empty());
  if (formats > 1) {
    std::fprintf(stderr, "ridge-topo %s: choose one of --json, --dot, --svg, --png\n", cmd);
    return false;
  }
  if (!drawingAllowed && (c->dot || !c->svg.empty() || !c->png.empty())) {
    std::fprintf(stderr, "ridge-topo %s: no drawing for this view; use 'ridge-topo draw'\n", cmd);
    return false;
  }
  using ridge::tools::OutputFormat;
  c->out.format = c->json           ? OutputFormat::Json
                  : c->dot          ? OutputFormat::Dot
                  : !c->svg.empty() ? OutputFormat::Svg
                  : !c->png.empty() ? OutputFormat::Png
                                    : OutputFormat::Text;
  c->out.outputPath = !c->svg.empty() ? c->svg : c->png;
  const char* noColor = std::getenv("NO_COLOR");
  c->out.color = c->out.format == OutputFormat::Text && isatty(STDOUT_FILENO) && !(noColor && *noColor);
  return true;
}

bool isDirectory(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Loads the machine the options name. Returns an exit status (kExitOk on success).
int loadTopology(const char* cmd, const Common& c, topo::Topology* t) {
  Status st = !c.preset.empty()      ? topo::loadPreset(c.preset, t)
              : isDirectory(c.input) ? topo::loadCapturedTopology(c.input, t)
              : !c.input.empty()     ? topo::loadTopologyFile(c.input, t)
                                     : topo::discoverThisMachine(t);
  if (!st.isOk()) {
    std::fprintf(stderr, "ridge-topo %s: %s\n", cmd, st.message().c_str());
    return kExitFailed;
  }
  return kExitOk;
}

topo::RenderOptions renderOptions(const Common& c, bool nccl = false) {
  topo::RenderOptions o;
  o.color = c.out.color;
  o.nccl = nccl;
  return o;
}

// Full path of `program` in PATH, "" if absent.
std::string findInPath(const char* program) {
  const char* path = std::getenv("PATH");
  if (!path) return "";
  std::string dirs = path;
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    // Appending in place (not dir + "/" + program) avoids a GCC 12 -Wrestrict false positive.
    std::string full = end > start ? dirs.substr(start, end - start) : std::string(".");
    full.append("/").append(program);
    if (access(full.c_str(), X_OK) == 0) return full;
    start = end + 1;
  }
  return "";
}

// Runs Graphviz's dot as a child with the source on its stdin, writing `path`.
int runGraphviz(const char* cmd, const std::string& source, const char* format, const std::string& path) {
  const std::string dot = findInPath("dot");
  if (dot.empty()) {
    std::fprintf(stderr,
                 "ridge-topo %s: Graphviz's 'dot' is not in PATH; it is needed for --%s "
                 "(Debian/Ubuntu: apt-get install graphviz). --dot prints the source instead.\n",
                 cmd, format);
    return kExitFailed;
  }
  int fds[2];
  if (pipe(fds) != 0) {
    std::perror("ridge-topo: pipe");
    return kExitFailed;
  }
  const std::string typeArg = std::string("-T") + format;
  const pid_t pid = fork();
  if (pid < 0) {
    std::perror("ridge-topo: fork");
    return kExitFailed;
  }
  if (pid == 0) {
    dup2(fds[0], STDIN_FILENO);
    close(fds[0]);
    close(fds[1]);
    execl(dot.c_str(), "dot", typeArg.c_str(), "-o", path.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[0]);
  // A dot that dies early must not kill us with SIGPIPE: its exit status says what happened.
  struct sigaction ignore {
  }, previous{};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ignore, &previous);
  size_t done = 0;
  while (done < source.size()) {
    const ssize_t n = write(fds[1], source.data() + done, source.size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  close(fds[1]);
  sigaction(SIGPIPE, &previous, nullptr);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "ridge-topo %s: '%s -T%s -o %s' failed (%s %d)\n", cmd, dot.c_str(), format,
                 path.c_str(), WIFEXITED(status) ? "exit status" : "signal",
                 WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    return kExitFailed;
  }
  return kExitOk;
}

// The route each GPU's sends should take: for every GPU the NIC whose recommended option
// (GDR advisor) has the highest large-message bandwidth, then the lowest small-message
// latency, then the better path class; noted with the option's name.
std::vector<topo::DataPathMark> recommendedRoutes(const topo::Topology& t,
                                                  const topo::PcieConstants& constants) {
  std::vector<topo::DataPathMark> marks;
  for (int g : t.gpus()) {
    topo::DataPathMark best;
    double bestBw = -1, bestLat = 0;
    topo::SmiClass bestClass = topo::SmiClass::SYS;
    for (int n : t.rdmaNicsOrAll()) {
      topo::GdrPlacement placement;
      if (!topo::gdrPlacementFor(t, g, n, &placement).isOk()) continue;
      const topo::GdrAdvice a = topo::adviseGdr(placement, constants);
      const topo::GdrOptionEstimate& e = a.estimate(a.chosen);
      const double bw = e.possible ? e.largeBandwidthGBs : 0;
      const double lat = e.latencyNs.empty() ? 0 : e.latencyNs.front();
      const topo::SmiClass cls = t.path(g, n).smi;
      // Within 1% counts as a tie: the model's figures are not that precise.
      const bool better =
          best.nic < 0 || bw > bestBw * 1.01 ||
          (bw >= bestBw * 0.99 && (lat < bestLat * 0.99 || (lat <= bestLat * 1.01 && cls < bestClass)));
      if (better) {
        best = {
            g, n,
            std::string(topo::gdrOptionName(a.chosen)) + " (" + topo::placementClassName(a.pathClass) + ")"};
        bestBw = bw;
        bestLat = lat;
        bestClass = cls;
      }
    }
    if (best.nic >= 0) marks.push_back(best);
  }
  return marks;
}

// Writes a drawing in the format the options chose (dot source to stdout by default).
int draw(const char* cmd, const Common& c, const topo::Topology& t, const topo::PcieConstants& constants) {
  const std::string source = topo::renderDot(t, recommendedRoutes(t, constants));
  if (!c.svg.empty()) return runGraphviz(cmd, source, "svg", c.svg);
  if (!c.png.empty()) return runGraphviz(cmd, source, "png", c.png);
  std::fputs(source.c_str(), stdout);
  return kExitOk;
}

// Prints rows with every column padded to its widest cell; columns listed in `right` are
// right-aligned (numbers).
void printRows(const std::vector<std::vector<std::string>>& rows, const std::vector<size_t>& right = {}) {
  std::vector<size_t> width;
  for (const auto& r : rows) {
    width.resize(std::max(width.size(), r.size()), 0);
    for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  }
  for (const auto& r : rows) {
    std::string line;
    for (size_t i = 0; i < r.size(); ++i) {
      std::string cell = r[i];
      const bool numeric = std::find(right.begin(), right.end(), i) != right.end();
      const std::string pad(width[i] - cell.size(), ' ');
      cell = numeric ? pad + cell : cell + pad;
      line += (i ? "  " : "") + cell;
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::printf("%s\n", line.c_str());
  }
}

std::string sizeLabelHeader(const topo::GdrAdvice& a) {
  return (a.smallSizes.empty() ? std::string("small") : topo::sizeLabel(a.smallSizes.front())) + " us";
}

// ---- tree, draw ---------------------------------------------------------------------------

int runTree(ArgList& args) {
  Common c;
  if (!parseCommon("tree", args, &c, true) || !args.finish()) return kExitUsage;
  topo::Topology t;
  if (int rc = loadTopology("tree", c, &t)) return rc;
  if (c.json) {
    std::fputs(topo::topologyToJson(t).c_str(), stdout);
    return kExitOk;
  }
  if (c.dot || !c.svg.empty() || !c.png.empty()) return draw("tree", c, t, topo::PcieConstants{});
  std::fputs(topo::renderTree(t, renderOptions(c)).c_str(), stdout);
  return kExitOk;
}

int runDraw(ArgList& args) {
  Common c;
  if (!parseCommon("draw", args, &c, true) || !args.finish()) return kExitUsage;
  if (c.json) {
    std::fprintf(stderr, "ridge-topo draw: --json is not a drawing; use 'ridge-topo tree --json'\n");
    return kExitUsage;
  }
  topo::Topology t;
  if (int rc = loadTopology("draw", c, &t)) return rc;
  return draw("draw", c, t, topo::PcieConstants{});
}

// ---- matrix -------------------------------------------------------------------------------

int runMatrix(ArgList& args) {
  Common c;
  const bool nccl = args.flag("--nccl");
  if (!parseCommon("matrix", args, &c, false) || !args.finish()) return kExitUsage;
  topo::Topology t;
  if (int rc = loadTopology("matrix", c, &t)) return rc;
  std::fputs((c.json ? topo::matrixJson(t) : topo::renderMatrix(t, renderOptions(c, nccl))).c_str(), stdout);
  return kExitOk;
}

// ---- paths --------------------------------------------------------------------------------

// Resolves a device name; prints what exists when it does not.
int findDevice(const char* cmd, const topo::Topology& t, const std::string& what) {
  const int id = t.find(what);
  if (id >= 0) return id;
  std::string known;
  for (int g : t.gpus()) known += (known.empty() ? "" : ", ") + t.node(g).name;
  for (int n : t.nics()) known += (known.empty() ? "" : ", ") + t.node(n).name;
  std::fprintf(stderr,
               "ridge-topo %s: no device '%s' in %s (GPUs and NICs: %s; OS names and bus ids work too)\n",
               cmd, what.c_str(), t.name.c_str(), known.empty() ? "none" : known.c_str());
  return -1;
}

int runPaths(ArgList& args) {
  Common c;
  if (!parseCommon("paths", args, &c, false)) return kExitUsage;
  const std::vector<std::string> names = args.positionals();
  if (!args.finish()) return kExitUsage;
  if (names.empty() || names.size() > 2) {
    std::fprintf(stderr, "ridge-topo paths: give one or two devices (see 'ridge-topo help paths')\n");
    return kExitUsage;
  }
  topo::Topology t;
  if (int rc = loadTopology("paths", c, &t)) return rc;
  const int a = findDevice("paths", t, names[0]);
  if (a < 0) return kExitFailed;
  if (names.size() == 2) {
    const int b = findDevice("paths", t, names[1]);
    if (b < 0) return kExitFailed;
    std::fputs((c.json ? topo::pathJson(t, a, b) : topo::renderPath(t, a, b, renderOptions(c))).c_str(),
               stdout);
    return kExitOk;
  }
  std::vector<int> targets = t.gpus();
  for (int n : t.nics()) targets.push_back(n);
  if (c.json) {
    json::Value all = json::Value::array();
    for (int b : targets) {
      json::Value v;
      Status st = json::parse(topo::pathJson(t, a, b), "path", &v);
      if (st.isOk()) all.push(std::move(v));
    }
    std::printf("%s\n", json::write(all).c_str());
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows{{"from", "to", "smi", "nccl", "GB/s", "ns", "hops"}};
  for (int b : targets) {
    if (b == a) continue;
    const topo::Path p = t.path(a, b);
    rows.push_back({t.node(a).name, t.node(b).name, topo::smiClassName(p.smi, p.nvlinks),
                    topo::ncclClassName(p.nccl), topo::number(p.bandwidthGBs), topo::number(p.latencyNs),
                    std::to_string(p.links.size())});
  }
  printRows(rows, {4, 5, 6});
  return kExitOk;
}

// ---- gdr ----------------------------------------------------------------------------------

int runGdr(ArgList& args) {
  Common c;
  std::string constantsFile;
  const bool haveConstants = args.option("--constants", &constantsFile);
  const bool all = args.flag("--all");
  if (!parseCommon("gdr", args, &c, true)) return kExitUsage;
  const std::vector<std::string> names = args.positionals();
  if (!args.finish()) return kExitUsage;
  if (names.size() == 1 || names.size() > 2) {
    std::fprintf(stderr, "ridge-topo gdr: give a GPU and a NIC, or neither (see 'ridge-topo help gdr')\n");
    return kExitUsage;
  }
  topo::PcieConstants constants;
  if (haveConstants) {
    Status st = topo::loadPcieConstants(constantsFile, &constants);
    if (!st.isOk()) {
      std::fprintf(stderr, "ridge-topo gdr: %s\n", st.message().c_str());
      return kExitFailed;
    }
  }
  topo::Topology t;
  if (int rc = loadTopology("gdr", c, &t)) return rc;
  if (c.dot || !c.svg.empty() || !c.png.empty()) return draw("gdr", c, t, constants);

  std::vector<std::pair<int, int>> pairs;
  if (names.size() == 2) {
    const int g = findDevice("gdr", t, names[0]);
    const int n = g < 0 ? -1 : findDevice("gdr", t, names[1]);
    if (g < 0 || n < 0) return kExitFailed;
    if (t.node(g).kind != topo::NodeKind::Gpu || t.node(n).kind != topo::NodeKind::Nic) {
      std::fprintf(stderr, "ridge-topo gdr: '%s' must be a GPU and '%s' a NIC\n", names[0].c_str(),
                   names[1].c_str());
      return kExitFailed;
    }
    pairs.push_back({g, n});
  } else if (all) {
    for (int g : t.gpus())
      for (int n : t.nics()) pairs.push_back({g, n});
  } else {
    for (const topo::DataPathMark& m : recommendedRoutes(t, constants)) pairs.push_back({m.gpu, m.nic});
  }
  if (pairs.empty()) {
    if (c.json)
      std::printf("[]\n");
    else
      std::printf("no GPU-NIC pair in %s (%zu GPUs, %zu NICs): nothing to advise\n", t.name.c_str(),
                  t.gpus().size(), t.nics().size());
    return kExitOk;
  }
  std::vector<topo::GdrAdvice> advice;
  // The GDR-write ladder a real NIC would take (RIDGE_NET=verbs): predicted from the NIC and,
  // for this machine, from whether rdma-core loads here; init decides and logs the rest.
  std::vector<ridge::verbs::GdrLadderDecision> ladder;
  const bool thisHost = c.input.empty() && c.preset.empty();
  for (auto [g, n] : pairs) {
    topo::GdrPlacement placement;
    Status st = topo::gdrPlacementFor(t, g, n, &placement);
    if (!st.isOk()) {
      std::fprintf(stderr, "ridge-topo gdr: %s\n", st.message().c_str());
      return kExitFailed;
    }
    advice.push_back(topo::adviseGdr(placement, constants));
    ladder.push_back(ridge::verbs::decideGdrLadder(
        ridge::verbs::predictGdrLadderFacts(t.node(n).osNames, t.node(n).model, thisHost)));
  }
  if (c.json) {
    json::Value out = json::Value::array();
    for (size_t i = 0; i < advice.size(); ++i) {
      json::Value v;
      Status st = json::parse(topo::gdrAdviceJson(advice[i]), "gdr advice", &v);
      if (!st.isOk()) {
        std::fprintf(stderr, "ridge-topo gdr: %s\n", st.message().c_str());
        return kExitFailed;
      }
      json::Value l = json::Value::object();
      l.set("rung", ridge::verbs::gdrRungName(ladder[i].rung));
      l.set("predicted", ladder[i].predicted);
      l.set("reason", ladder[i].reason);
      v.set("writeLadder", std::move(l));
      out.push(std::move(v));
    }
    std::printf("%s\n", json::write(names.size() == 2 ? out.items()[0] : out).c_str());
    return kExitOk;
  }
  if (names.size() == 2) {
    std::fputs(topo::gdrAdviceText(advice[0]).c_str(), stdout);
    std::printf("\ngdr-write ladder on a real NIC (RIDGE_NET=verbs): %s\n",
                ridge::verbs::gdrLadderLine(ladder[0]).c_str());
    return kExitOk;
  }
  // One line per pair: the choice and its figures; 'gdr GPU NIC' shows every option.
  std::vector<std::vector<std::string>> rows{
      {"GPU", "NIC", "class", "chosen", sizeLabelHeader(advice[0]), "GB/s", "decided by", "reason"}};
  for (const topo::GdrAdvice& a : advice) {
    const topo::GdrOptionEstimate& e = a.estimate(a.chosen);
    rows.push_back({a.gpu, a.nic, topo::placementClassName(a.pathClass), topo::gdrOptionName(a.chosen),
                    e.latencyNs.empty() ? "-" : ridge::format("%.2f", e.latencyNs.front() / 1000),
                    topo::number(e.largeBandwidthGBs), a.decidedBy, a.reason});
  }
  printRows(rows, {4, 5});
  std::printf(
      "\ngdr-write ladder on a real NIC (RIDGE_NET=verbs; init decides, RIDGE_DEBUG=INFO logs it):\n");
  for (size_t i = 0; i < advice.size(); ++i)
    std::printf("  %s-%s: %s\n", advice[i].gpu.c_str(), advice[i].nic.c_str(),
                ridge::verbs::gdrLadderLine(ladder[i]).c_str());
  std::printf("\n'ridge-topo gdr GPU NIC' shows every option for one pair%s.\n",
              all ? "" : "; --all lists every GPU-NIC pair");
  return kExitOk;
}

// ---- doctor, capture -----------------------------------------------------------------------

int runDoctor(ArgList& args) {
  Common c;
  const bool all = args.flag("--all");
  if (!parseCommon("doctor", args, &c, false)) return kExitUsage;
  const std::vector<std::string> names = args.positionals();
  if (!args.finish()) return kExitUsage;
  if (names.size() == 1 || names.size() > 2) {
    std::fprintf(stderr, "ridge-topo doctor: give two devices, or none (see 'ridge-topo help doctor')\n");
    return kExitUsage;
  }
  topo::Topology t;
  if (int rc = loadTopology("doctor", c, &t)) return rc;
  topo::DoctorOptions options;
  options.allPairs = all;
  if (names.size() == 2) {
    options.onlyA = findDevice("doctor", t, names[0]);
    options.onlyB = options.onlyA < 0 ? -1 : findDevice("doctor", t, names[1]);
    if (options.onlyA < 0 || options.onlyB < 0) return kExitFailed;
    if (t.node(options.onlyA).kind != topo::NodeKind::Gpu) std::swap(options.onlyA, options.onlyB);
    if (t.node(options.onlyA).kind != topo::NodeKind::Gpu ||
        (t.node(options.onlyB).kind != topo::NodeKind::Gpu &&
         t.node(options.onlyB).kind != topo::NodeKind::Nic)) {
      std::fprintf(stderr, "ridge-topo doctor: '%s' and '%s' must be two GPUs or a GPU and a NIC\n",
                   names[0].c_str(), names[1].c_str());
      return kExitFailed;
    }
  }
  // A preset or a topology file has no kernel files: only the path classes are examined.
  const bool captured = !c.input.empty() && isDirectory(c.input);
  const topo::SysRoot root(captured ? c.input : c.preset.empty() && c.input.empty() ? "" : "/nonexistent");
  const topo::DoctorReport r = topo::runDoctor(t, root, options);
  std::fputs((c.json ? topo::doctorJson(r, t) : topo::doctorText(r, t, c.out.color)).c_str(), stdout);
  return kExitOk;
}

int runCapture(ArgList& args) {
  const std::vector<std::string> dirs = args.positionals();
  if (!args.finish()) return kExitUsage;
  if (dirs.size() != 1) {
    std::fprintf(stderr, "ridge-topo capture: give one folder to write (see 'ridge-topo help capture')\n");
    return kExitUsage;
  }
  std::string summary;
  Status st = topo::captureMachine(dirs[0], &summary);
  if (!st.isOk()) {
    std::fprintf(stderr, "ridge-topo capture: %s\n", st.message().c_str());
    return kExitFailed;
  }
  std::printf("%s\n", summary.c_str());
  return kExitOk;
}

int runExportNccl(ArgList& args) {
  Common c;
  if (!parseCommon("export-nccl", args, &c, false)) return kExitUsage;
  // "-" looks like an option to positionals(); take it first.
  const bool toStdout = args.flag("-");
  std::vector<std::string> files = args.positionals();
  if (!args.finish()) return kExitUsage;
  if (toStdout) files.push_back("-");
  if (files.size() != 1 || c.json) {
    std::fprintf(
        stderr, "ridge-topo export-nccl: give one FILE to write, or - (see 'ridge-topo help export-nccl')\n");
    return kExitUsage;
  }
  topo::Topology t;
  if (int rc = loadTopology("export-nccl", c, &t)) return rc;
  const std::string xml = topo::topologyToNcclXml(t);
  if (files[0] == "-") {
    std::fputs(xml.c_str(), stdout);
    return kExitOk;
  }
  if (!topo::writeFile(files[0], xml)) {
    std::fprintf(stderr, "ridge-topo export-nccl: cannot write %s: %s\n", files[0].c_str(),
                 std::strerror(errno));
    return kExitFailed;
  }
  std::printf("wrote %s: %zu GPUs, %zu NICs of %s as an NCCL topology file (NCCL_TOPO_FILE=%s)\n",
              files[0].c_str(), t.gpus().size(), t.nics().size(), t.name.c_str(), files[0].c_str());
  return kExitOk;
}

// ---- plan, simulate -----------------------------------------------------------------------

// The planner's subcommands live in tools/topo_plan_commands.cpp; they get the loaded machine
// and every argument this file does not own.
int runPlanner(const char* cmd, ArgList& args, bool simulate) {
  Common c;
  // plan's --dot takes an optional FILE (the usage says so); the other views' --dot has none.
  std::string dotFile;
  const bool dot = args.optionalValue("--dot", &dotFile);
  if (!parseCommon(cmd, args, &c, true)) return kExitUsage;
  if (dot && (c.json || !c.svg.empty() || !c.png.empty())) {
    std::fprintf(stderr, "ridge-topo %s: choose one of --json, --dot, --svg, --png\n", cmd);
    return kExitUsage;
  }
  const bool picture = !c.svg.empty() || !c.png.empty();
  if (simulate && (dot || c.dot || picture)) {
    std::fprintf(stderr, "ridge-topo simulate: no drawing for this view; use 'ridge-topo plan'\n");
    return kExitUsage;
  }
  if (dot) {
    c.dot = true;
    c.out.format = ridge::tools::OutputFormat::Dot;
    c.out.outputPath = dotFile;
    c.out.color = false;
  }
  const std::vector<std::string> rest = args.rest();
#ifdef RIDGE_TOPO_HAVE_PLANNER
  topo::Topology t;
  if (int rc = loadTopology(cmd, c, &t)) return rc;
  if (simulate) return ridge::tools::runSimulateCommand(t, c.out, rest);
  if (!picture) return ridge::tools::runPlanCommand(t, c.out, rest);
  // --svg/--png: the plan's dot source through a scratch file, then Graphviz.
  char scratch[] = "/tmp/ridge-topo-plan-XXXXXX";
  const int fd = mkstemp(scratch);
  if (fd < 0) {
    std::fprintf(stderr, "ridge-topo plan: cannot create a scratch file: %s\n", std::strerror(errno));
    return kExitFailed;
  }
  close(fd);
  ridge::tools::CommonOptions dotOut = c.out;
  dotOut.format = ridge::tools::OutputFormat::Dot;
  dotOut.outputPath = scratch;
  int rc = ridge::tools::runPlanCommand(t, dotOut, rest);
  std::string source;
  if (rc == kExitOk && !topo::SysRoot().bytes(scratch, &source, size_t{64} << 20)) rc = kExitFailed;
  unlink(scratch);
  if (rc != kExitOk) return rc;
  return runGraphviz("plan", source, c.svg.empty() ? "png" : "svg", c.svg.empty() ? c.png : c.svg);
#else
  (void)rest;
  (void)simulate;
  std::fprintf(stderr,
               "ridge-topo %s: planner not built (tools/topo_plan_commands.cpp is not in this build)\n", cmd);
  return kExitFailed;
#endif
}

int runPlan(ArgList& args) {
  return runPlanner("plan", args, false);
}
int runSimulate(ArgList& args) {
  return runPlanner("simulate", args, true);
}

// ---- presets ------------------------------------------------------------------------------

int runPresets(ArgList& args) {
  if (!args.finish()) return kExitUsage;
  std::vector<std::vector<std::string>> rows;
  for (const std::string& n : topo::presetNames()) rows.push_back({n, topo::presetDescription(n)});
  printRows(rows);
  return kExitOk;
}

// ---- summary ------------------------------------------------------------------------------

// Whether a file holds XML (hwloc or NCCL), which the summary reads itself (cores and PUs
// included), rather than Ridge JSON.
bool isXmlFile(const std::string& path) {
  std::string head;
  if (!topo::SysRoot().bytes(path, &head, 256)) return false;
  const size_t first = head.find_first_not_of(" \t\r\n");
  return first != std::string::npos && head[first] == '<';
}

int runSummary(ArgList& args) {
  std::string xml;
  bool haveXml = args.option("--xml", &xml);  // the older spelling of --input FILE
  if (haveXml) {
    if (Status st = topo::checkInputPath(xml, /*allowDirectory=*/false); !st.isOk()) {
      std::fprintf(stderr, "ridge-topo summary: --xml %s\n", st.message().c_str());
      return kExitUsage;
    }
  }
  bool compact = args.flag("--compact");
  Common c;
  if (!parseCommon("summary", args, &c, false) || !args.finish()) return kExitUsage;
  if (c.json || (haveXml && (!c.input.empty() || !c.preset.empty()))) {
    std::fprintf(
        stderr, "ridge-topo summary: %s\n",
        c.json ? "no --json for this view" : "--xml, --input and --preset are alternatives; give one");
    return kExitUsage;
  }
  if (!c.input.empty() && !isDirectory(c.input) && isXmlFile(c.input)) {
    xml = c.input;
    haveXml = true;
  }
  ridge::HostSummary s;
  ridge::Status st;
  if (haveXml) {
    st = ridge::summarizeHwlocXml(xml, &s);
  } else if (!c.input.empty() || !c.preset.empty()) {
    topo::Topology t;
    if (int rc = loadTopology("summary", c, &t)) return rc;
    s = ridge::summarizeTopology(t);
  } else {
    st = ridge::summarizeThisHost(&s);
  }
  if (!st.isOk()) {
    std::fprintf(stderr, "ridge-topo summary: %s\n", st.message().c_str());
    return kExitFailed;
  }
  std::printf("%s\n", (compact ? ridge::summaryToCompactString(s) : ridge::formatSummary(s)).c_str());
  return kExitOk;
}

// ---- settings -----------------------------------------------------------------------------

std::string markdownCell(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '|')
      out += "\\|";
    else if (c == '\n')
      out += ' ';
    else
      out += c;
  }
  return out;
}

void printSettingsMarkdown() {
  std::printf(
      "# Ridge settings\n\n"
      "Ridge is configured through the `RIDGE_*` environment variables below, read when a\n"
      "communicator is created. Sizes take 1024-based `K`, `M` and `G` suffixes. Every value set\n"
      "is checked when a communicator is created: one outside what the Accepted column says\n"
      "fails init with ridgeInvalidArgument, naming the variable and the accepted values (free\n"
      "text is checked by the part that reads it, as the column says). `RIDGE_DEBUG=INFO` prints\n"
      "every value and where it came from. This page is generated from `src/core/settings.def`\n"
      "and the rules in `src/core/settings.cpp` by `ridge-topo settings --markdown`; a test fails\n"
      "when the two differ.\n\n"
      "| Variable | Type | Default | Accepted | Description |\n"
      "| --- | --- | --- | --- | --- |\n");
  for (size_t i = 0; i < ridge::allSettings().size(); ++i) {
    const ridge::SettingInfo& s = ridge::allSettings()[i];
    const std::string accepted = ridge::settingAcceptedValues(static_cast<ridge::Setting>(i));
    const std::string def = *s.defaultValue ? "`" + markdownCell(s.defaultValue) + "`" : std::string("(empty)");
    std::printf("| `RIDGE_%s` | %s | %s | %s | %s |\n", s.name, s.type, def.c_str(), markdownCell(accepted).c_str(),
                markdownCell(s.doc).c_str());
  }
}

// Wraps `text` at about `width` columns, each line indented by `indent` spaces.
void printWrapped(const std::string& text, size_t indent, size_t width) {
  size_t col = 0;
  size_t p = 0;
  while (p < text.size()) {
    size_t e = text.find(' ', p);
    if (e == std::string::npos) e = text.size();
    std::string word = text.substr(p, e - p);
    p = e + 1;
    if (col > 0 && col + 1 + word.size() > width) {
      std::printf("\n");
      col = 0;
    }
    if (col == 0) {
      std::printf("%*s%s", static_cast<int>(indent), "", word.c_str());
      col = indent + word.size();
    } else {
      std::printf(" %s", word.c_str());
      col += 1 + word.size();
    }
  }
  std::printf("\n");
}

void printSettingsText() {
  for (size_t i = 0; i < ridge::allSettings().size(); ++i) {
    const auto setting = static_cast<ridge::Setting>(i);
    const ridge::SettingInfo& s = ridge::allSettings()[i];
    bool set = ridge::settingIsSet(setting);
    std::string value = ridge::settingString(setting);
    std::printf("RIDGE_%s (%s)\n", s.name, s.type);
    std::printf("    default: \"%s\"   current: \"%s\" (%s)\n", s.defaultValue, value.c_str(),
                set ? "from the environment" : "default");
    std::printf("    accepted: %s\n", ridge::settingAcceptedValues(setting).c_str());
    printWrapped(s.doc, 4, 88);
  }
}

int runSettings(ArgList& args) {
  bool markdown = args.flag("--markdown");
  if (!args.finish()) return kExitUsage;
  if (markdown)
    printSettingsMarkdown();
  else
    printSettingsText();
  return kExitOk;
}

// ---- help ---------------------------------------------------------------------------------

void printCommandHelp(const Command& c) {
  std::printf("usage: ridge-topo %s\n\n%s\n", c.synopsis, c.help);
}

int runHelp(ArgList& args) {
  std::vector<std::string> topics = args.positionals();
  if (!args.finish()) return kExitUsage;
  if (topics.empty()) {
    printUsage(stdout);
    return kExitOk;
  }
  int rc = kExitOk;
  for (const std::string& t : topics) {
    const Command* c = findCommand(t);
    if (!c) {
      std::fprintf(stderr, "ridge-topo help: no subcommand '%s'\n", t.c_str());
      rc = kExitUsage;
      continue;
    }
    printCommandHelp(*c);
  }
  return rc;
}

// Options that take a value, so that "--preset dgx-h100 tree" finds "tree" as the subcommand.
bool takesValue(const std::string& arg) {
  for (const char* o : {"--input", "--preset", "--svg", "--png", "--xml", "--constants"})
    if (arg == o) return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  // The subcommand is the first argument that is neither an option nor an option's value;
  // the machine options may come before it.
  std::vector<std::string> rest;
  std::string name;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (name.empty() && !a.empty() && a[0] != '-') {
      name = a;
      continue;
    }
    rest.push_back(a);
    if (name.empty() && takesValue(a) && i + 1 < argc) rest.push_back(argv[++i]);
  }
  if (name.empty() && rest.size() == 1 && (rest[0] == "--version" || rest[0] == "-V")) {
    std::printf("ridge-topo (Ridge) %d.%d.%d\n", RIDGE_MAJOR, RIDGE_MINOR, RIDGE_PATCH);
    return kExitOk;
  }
  if (name.empty()) {
    const bool help = !rest.empty() && (rest[0] == "-h" || rest[0] == "--help");
    printUsage(help ? stdout : stderr);
    return help ? kExitOk : kExitUsage;
  }
  const Command* c = findCommand(name);
  if (!c) {
    std::fprintf(stderr, "ridge-topo: unknown subcommand '%s'\n\n", name.c_str());
    printUsage(stderr);
    return kExitUsage;
  }
  ArgList args(c->name, rest);
  // plan and simulate document their own options; everything else answers --help here.
  if (args.wantsHelp() && c->run != runPlan && c->run != runSimulate) {
    printCommandHelp(*c);
    return kExitOk;
  }
  return c->run(args);
}
