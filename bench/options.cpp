// ridge-bench: command line.
#include <ridge/version.h>

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "bench.h"

namespace rbench {

namespace {

struct CollName {
  Coll coll;
  const char* name;
};
constexpr CollName kColls[] = {
    {Coll::AllReduce, "allreduce"}, {Coll::Broadcast, "broadcast"},         {Coll::Reduce, "reduce"},
    {Coll::AllGather, "allgather"}, {Coll::ReduceScatter, "reducescatter"}, {Coll::AlltoAll, "alltoall"},
    {Coll::SendRecv, "sendrecv"},
};

bool parseInt(const std::string& s, long lo, long hi, int* out) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi) return false;
  *out = static_cast<int>(v);
  return true;
}

}  // namespace

const char* collName(Coll c) {
  for (const auto& e : kColls)
    if (e.coll == c) return e.name;
  return "?";
}

bool parseColl(const std::string& s, Coll* out) {
  for (const auto& e : kColls) {
    if (s == e.name) {
      *out = e.coll;
      return true;
    }
  }
  // Accept the nccl-tests spellings too.
  if (s == "all_reduce") return *out = Coll::AllReduce, true;
  if (s == "all_gather") return *out = Coll::AllGather, true;
  if (s == "reduce_scatter") return *out = Coll::ReduceScatter, true;
  if (s == "alltoallv" || s == "all_to_all") return *out = Coll::AlltoAll, true;
  if (s == "send_recv") return *out = Coll::SendRecv, true;
  if (s == "bcast") return *out = Coll::Broadcast, true;
  return false;
}

double busBwFactor(Coll c, int n) {
  switch (c) {
    case Coll::AllReduce: return 2.0 * (n - 1) / n;
    case Coll::ReduceScatter:
    case Coll::AllGather:
    case Coll::AlltoAll: return double(n - 1) / n;
    case Coll::Broadcast:
    case Coll::Reduce:
    case Coll::SendRecv: return 1.0;
  }
  return 1.0;
}

double boundTrafficFactor(Coll c, int n) {
  // Reductions: every input read once, every output written once. Copies: every output
  // byte copied once from wherever it lives (a read and a write), as a single-copy
  // algorithm does; the root's own copy of an out-of-place broadcast included.
  switch (c) {
    case Coll::AllReduce: return 2.0 * n;
    case Coll::Reduce:
    case Coll::ReduceScatter: return n + 1.0;
    case Coll::Broadcast:
    case Coll::AllGather:
    case Coll::AlltoAll:
    case Coll::SendRecv: return 2.0 * n;
  }
  return 2.0 * n;
}

bool collHasOp(Coll c) {
  return c == Coll::AllReduce || c == Coll::Reduce || c == Coll::ReduceScatter;
}
bool collHasRoot(Coll c) {
  return c == Coll::Broadcast || c == Coll::Reduce;
}

bool parseSize(const std::string& s, size_t* out) {
  if (s.empty() || !(s[0] >= '0' && s[0] <= '9')) return false;
  errno = 0;
  char* end = nullptr;
  unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (errno != 0) return false;
  unsigned shift = 0;
  switch (*end) {
    case '\0': break;
    case 'k':
    case 'K':
      shift = 10;
      ++end;
      break;
    case 'm':
    case 'M':
      shift = 20;
      ++end;
      break;
    case 'g':
    case 'G':
      shift = 30;
      ++end;
      break;
    case 't':
    case 'T':
      shift = 40;
      ++end;
      break;
    default: break;
  }
  if (*end == 'B' || *end == 'b') ++end;
  if (*end != '\0') return false;
  if (shift && v > (ULLONG_MAX >> shift)) return false;
  *out = static_cast<size_t>(v << shift);
  return true;
}

void printUsage(FILE* f) {
  std::fprintf(
      f,
      "Usage: ridge-bench <collective> [options]\n"
      "  collective: allreduce broadcast reduce allgather reducescatter alltoall sendrecv\n"
      "              (sendrecv: ring shift, rank r sends to r+1 and receives from r-1)\n"
      "nccl-tests 2.19 options, same letters and long names (sizes take 1024-based K/M/G):\n"
      "  -b,--minbytes B      smallest size (default 8)\n"
      "  -e,--maxbytes B      largest size (default 32M)\n"
      "  -f,--stepfactor F    multiply the size by F between rows (default 2; 1: step by -i)\n"
      "  -i,--stepbytes B     add B between rows (when -f is not above 1; default 1M then)\n"
      "  -n,--iters N         timed iterations per size (default 20)\n"
      "  -w,--warmup_iters N  warm-up iterations per size (default 5)\n"
      "  -m,--agg_iters N     calls per timed iteration, grouped (ridgeGroupStart/End) (default 1)\n"
      "  -N,--run_cycles N    sweep the sizes N times (default 1; 0: until stopped)\n"
      "  -c,--check N         check N calls after the timed loop (and one before it), per size\n"
      "                       and placement; 0: no check (default 1)\n"
      "  -d,--datatype T|all  int8 uint8 int32 uint32 int64 uint64 half float double bfloat16\n"
      "                       (aliases char int fp16 bf16 fp32 fp64; default float)\n"
      "  -o,--op OP|all       sum prod max min avg (default sum)\n"
      "  -r,--root R|all      root of broadcast and reduce; all (or -1): every rank in turn\n"
      "  -z,--blocking 0..3   0 calls back to back; 1 wait and barrier after each call; 2 wait\n"
      "                       after each call; 3 wait and barrier after each iteration, the\n"
      "                       barrier not timed (default 0)\n"
      "  -a,--average 0..3    time of a row: 0 rank 0's, 1 mean, 2 min, 3 max over ranks\n"
      "                       (default 3; nccl-tests' default is 1)\n"
      "  -T,--timeout S       a rank stuck over S s on one size and placement aborts the run (0 off)\n"
      "  -C,--report_cputime 0|1     time on the host until the last call returns, without the\n"
      "                       final stream wait (the cputime column)\n"
      "  -S,--report_timestamps 0|1  a timestamp at the end of every row\n"
      "  -I,--per_iter_timing 0|1    per-iteration times: i_min i_max i_p99 i_cv%% columns\n"
      "  -K,--per_iter_skip N leading iterations left out of the -I statistics\n"
      "  -J,--output_file F   F.json: the JSON record (--json); F.csv: the CSV (--csv)\n"
      "  -F F                 the same as -J (nccl-tests 2.19 itself has -J only)\n"
      "  -M,--memory 0|1      report the memory the run used\n"
      "  -u,--unalign N       buffers start N elements past their alignment\n"
      "  -y,--stream_null 0|1 device calls on the legacy default stream (device buffers)\n"
      "  -G,--cudagraph N     capture the timed calls in a CUDA graph, launch it N times (CUDA\n"
      "                       builds with device buffers)\n"
      "  -R,--local_register 0..2    register the buffers with the library before timing; 2 also\n"
      "                              allocates host buffers with ridgeMemAlloc (shareable)\n"
      "  -t,--nthreads 1  -g,--ngpus 1  -p,--parallel_init 0|1  -x,--cta_policy -1\n"
      "  -D,--device_implementation 0  -V,--device_cta_count 16\n"
      "                       accepted at these values only: a Ridge rank is one process with\n"
      "                       at most one GPU, ranks always initialise in parallel, and Ridge\n"
      "                       has no CTA policy or device-API implementations\n"
      "ridge-bench's own:\n"
      "  -np N        run N ranks as forked processes of this one (default 1)\n"
      "  --peer mpi   also time MPI on the same sizes, interleaved with Ridge; with -np N\n"
      "               outside a launcher ridge-bench re-runs itself under mpirun\n"
      "  --peer gloo  also time Gloo (TCP device) on the same sizes; Ridge then runs over TCP as\n"
      "               well (RIDGE_SHM=0, RIDGE_NET=socket unless set), so both use one transport\n"
      "               class; ranks rendezvous in a file store (a temporary directory with -np;\n"
      "               RIDGE_BENCH_GLOO_STORE with RIDGE_RANK), on RIDGE_BENCH_GLOO_IFACE or the\n"
      "               interface named by RIDGE_SOCKET_IFNAME (127.0.0.1 when neither names one)\n"
      "  --peer nccl  also time NCCL on device buffers, same sizes, interleaved (CUDA\n"
      "               builds on GPU machines, one GPU per rank); libnccl.so.2 is loaded\n"
      "               at run time\n"
      "  --nccl-lib L the library --peer nccl loads (default libnccl.so.2)\n"
      "  --ridge-buffers host|device  where Ridge's buffers live (default host; device:\n"
      "               cudaMalloc buffers, collectives ordered on a CUDA stream, docs/gpu.md)\n"
      "  --json FILE  write the run (host, version, date, settings, one record per row) as\n"
      "               JSON (- for stdout; the table then goes to stderr)\n"
      "  --csv FILE   one line per row as CSV, with the same facts in columns\n"
      "  --plot FILE  FILE.svg or FILE.png: busbw and time against size, log axes, Ridge and\n"
      "               the peer (gnuplot, else python3-matplotlib; RIDGE_BENCH_PLOTTER=gnuplot or\n"
      "               matplotlib picks one)\n"
      "  --algo STR   set RIDGE_ALGO for the Ridge runs\n"
      "  --run-timeout S  with -np: seconds to wait for the ranks before killing them (1800)\n"
      "  --gdr-mode M read, write, staged or auto: every pair of ranks through the gdr\n"
      "               transport in that mode (sets RIDGE_GDR_MODE, RIDGE_NET=softnic unless\n"
      "               RIDGE_NET names verbs, RIDGE_SHM=0 unless set); with\n"
      "               RIDGE_SOFTNIC_PCIE_MODEL the figures are modeled and labeled so\n"
      "  --progress S a progress line on stderr every S seconds (default 5; 0: one per size)\n"
      "  -q           no progress lines\n"
      "  --version    the version of ridge-bench and of the Ridge library it runs\n"
      "  -h, --help   this text\n"
      "Launch: under mpirun/srun (MPI build) ranks bootstrap through MPI; with RIDGE_RANK and\n"
      "RIDGE_WORLD_SIZE set they use ridgeCommInitFromEnv; otherwise -np forks the ranks.\n"
      "Exit status: 0 ok, 1 wrong results, 2 usage, 3 a call failed or a rank died.\n");
}

std::string versionLine() {
  int lib = 0;
  ridgeGetVersion(&lib);
  char b[160];
  std::snprintf(b, sizeof b, "ridge-bench %d.%d.%d (Ridge library %d.%d.%d; nccl-tests 2.19 options)",
                RIDGE_MAJOR, RIDGE_MINOR, RIDGE_PATCH, lib / 10000, lib / 100 % 100, lib % 100);
  return b;
}

namespace {

// One command-line option: its spellings, whether it takes a value, and what it does with
// it. apply() returns "" or what a valid value looks like (for the error line).
struct OptionSpec {
  const char* shortName;  // "-b", or nullptr
  const char* longName;   // "--minbytes", or nullptr
  bool takesValue;
  std::string (*apply)(Options* o, const std::string& v);
};

bool toInt(const std::string& s, long lo, long hi, int* out) {
  return parseInt(s, lo, hi, out);
}

// An option nccl-tests has whose only value Ridge can honour is `only`: other values are
// refused with `why`.
std::string onlyValue(const std::string& v, int only, int* field, const char* why) {
  int x = 0;
  if (!toInt(v, INT_MIN + 1, INT_MAX, &x)) return "an integer";
  if (x != only) return "refused: " + std::string(why);
  *field = x;
  return {};
}

std::string flag01(const std::string& v, int* field) {
  return toInt(v, 0, 1, field) ? std::string() : "0 or 1";
}

const OptionSpec kOptionSpecs[] = {
    {"-b", "--minbytes", true,
     [](Options* o, const std::string& v) {
       return parseSize(v, &o->minBytes) ? std::string() : "a size such as 8, 1K, 64M";
     }},
    {"-e", "--maxbytes", true,
     [](Options* o, const std::string& v) {
       return parseSize(v, &o->maxBytes) ? std::string() : "a size such as 8, 1K, 64M";
     }},
    {"-i", "--stepbytes", true,
     [](Options* o, const std::string& v) {
       return parseSize(v, &o->increment) && o->increment > 0 ? std::string() : "a size > 0";
     }},
    {"-f", "--stepfactor", true,
     [](Options* o, const std::string& v) {
       char* end = nullptr;
       double f = std::strtod(v.c_str(), &end);
       if (v.empty() || *end != '\0' || !std::isfinite(f) || f < 1.0) return std::string("a number >= 1");
       o->factor = f;
       return std::string();
     }},
    {"-n", "--iters", true,
     [](Options* o, const std::string& v) {
       return toInt(v, 1, INT_MAX, &o->iters) ? std::string() : "an integer >= 1";
     }},
    {"-w", "--warmup_iters", true,
     [](Options* o, const std::string& v) {
       return toInt(v, 0, INT_MAX, &o->warmup) ? std::string() : "an integer >= 0";
     }},
    {"-m", "--agg_iters", true,
     [](Options* o, const std::string& v) {
       return toInt(v, 1, 1 << 20, &o->aggIters) ? std::string() : "an integer from 1 to 1048576";
     }},
    {"-N", "--run_cycles", true,
     [](Options* o, const std::string& v) {
       return toInt(v, 0, INT_MAX, &o->runCycles) ? std::string() : "an integer >= 0 (0: until stopped)";
     }},
    {"-c", "--check", true,
     [](Options* o, const std::string& v) {
       return toInt(v, 0, 1 << 20, &o->checkIters) ? std::string() : "a count of checked calls >= 0";
     }},
    {"-d", "--datatype", true,
     [](Options* o, const std::string& v) {
       if (v == "all") {
         o->dtypes = allTypes();
         return std::string();
       }
       ridgeDataType_t t;
       if (v == "f8e4m3" || v == "f8e5m2") return std::string("refused: Ridge has no 8-bit float types");
       if (!parseType(v, &t))
         return std::string("int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 all");
       o->dtypes = {t};
       return std::string();
     }},
    {"-o", "--op", true,
     [](Options* o, const std::string& v) {
       if (v == "all") {
         o->ops = allOps();
         return std::string();
       }
       ridgeRedOp_t op;
       if (v == "mulsum")
         return std::string("refused: Ridge has no pre-multiplied sum (ncclRedOpCreatePreMulSum)");
       if (!parseOp(v, &op)) return std::string("sum prod max min avg all");
       o->ops = {op};
       return std::string();
     }},
    {"-r", "--root", true,
     [](Options* o, const std::string& v) {
       if (v == "all" || v == "-1") {
         o->root = -1;
         return std::string();
       }
       return toInt(v, 0, INT_MAX, &o->root) ? std::string() : "a rank >= 0, or all";
     }},
    {"-z", "--blocking", true,
     [](Options* o, const std::string& v) {
       return toInt(v, 0, 3, &o->blocking) ? std::string() : "0, 1, 2 or 3";
     }},
    {"-a", "--average", true,
     [](Options* o, const std::string& v) {
       return toInt(v, 0, 3, &o->average) ? std::string() : "0 (rank 0), 1 (mean), 2 (min) or 3 (max)";
     }},
    {"-y", "--stream_null", true, [](Options* o, const std::string& v) { return flag01(v, &o->streamNull); }},
    {"-T", "--timeout", true,
     [](Options* o, const std::string& v) {
       return toInt(v, 0, INT_MAX, &o->stepTimeoutSec) ? std::string() : "seconds >= 0 (0: off)";
     }},
    {"-G", "--cudagraph", true,
     [](Options* o, const std::string& v) {
       return toInt(v, 0, 1 << 20, &o->graphLaunches) ? std::string() : "a launch count >= 0";
     }},
    {"-C", "--report_cputime", true,
     [](Options* o, const std::string& v) {
       int x = 0;
       std::string e = flag01(v, &x);
       o->reportCputime = x != 0;
       return e;
     }},
    {"-S", "--report_timestamps", true,
     [](Options* o, const std::string& v) {
       int x = 0;
       std::string e = flag01(v, &x);
       o->reportTimestamps = x != 0;
       return e;
     }},
    {"-J", "--output_file", true, nullptr},  // handled in parseOptions: picks --json or --csv
    {"-F", nullptr, true, nullptr},
    {"-R", "--local_register", true,
     [](Options* o, const std::string& v) {
       return toInt(v, 0, 2, &o->localRegister) ? std::string() : "0 (off), 1 (local) or 2 (symmetric)";
     }},
    {"-M", "--memory", true, [](Options* o, const std::string& v) { return flag01(v, &o->memoryReport); }},
    {"-u", "--unalign", true,
     [](Options* o, const std::string& v) {
       return toInt(v, 0, 4096, &o->unalign) ? std::string() : "an element index from 0 to 4096";
     }},
    {"-I", "--per_iter_timing", true,
     [](Options* o, const std::string& v) { return flag01(v, &o->perIterTiming); }},
    {"-K", "--per_iter_skip", true,
     [](Options* o, const std::string& v) {
       return toInt(v, 0, INT_MAX, &o->perIterSkip) ? std::string() : "an integer >= 0";
     }},
    {"-t", "--nthreads", true,
     [](Options* o, const std::string& v) {
       return onlyValue(
           v, 1, &o->nthreads,
           ("ridge-bench runs one rank per process, not per thread; for " + v + " ranks use -np " + v)
               .c_str());
     }},
    {"-g", "--ngpus", true,
     [](Options* o, const std::string& v) {
       // -g N > 1 is refused by unsupportedHere(), whose reason depends on the build.
       return toInt(v, 1, INT_MAX, &o->ngpus) ? std::string() : "a GPU count >= 1";
     }},
    {"-p", "--parallel_init", true,
     [](Options* o, const std::string& v) { return flag01(v, &o->parallelInit); }},
    {"-x", "--cta_policy", true,
     [](Options* o, const std::string& v) {
       return onlyValue(v, -1, &o->ctaPolicy,
                        "Ridge's kernels have no CTA policy; only -1 (unset) is accepted");
     }},
    {"-D", "--device_implementation", true,
     [](Options* o, const std::string& v) {
       return onlyValue(v, 0, &o->deviceImpl, "Ridge has no device-API implementations; only 0 is accepted");
     }},
    {"-V", "--device_cta_count", true,
     [](Options* o, const std::string& v) {
       return onlyValue(v, 16, &o->deviceCtaCount, "it only applies with -D > 0, which Ridge does not have");
     }},
    {"-np", "--np", true,
     [](Options* o, const std::string& v) {
       return toInt(v, 1, 4096, &o->np) ? std::string() : "a rank count from 1 to 4096";
     }},
    {nullptr, "--peer", true,
     [](Options* o, const std::string& v) {
       if (v == "mpi")
         o->peerMpi = true;
       else if (v == "gloo")
         o->peerGloo = true;
       else if (v == "nccl")
         o->peerNccl = true;
       else
         return std::string("mpi, gloo or nccl");
       return std::string();
     }},
    {nullptr, "--nccl-lib", true,
     [](Options* o, const std::string& v) {
       if (v.empty()) return std::string("a library name or path");
       o->ncclLib = v;
       return std::string();
     }},
    {nullptr, "--ridge-buffers", true,
     [](Options* o, const std::string& v) {
       if (v != "host" && v != "device") return std::string("host or device");
       o->ridgeOnDevice = v == "device";
       return std::string();
     }},
    {nullptr, "--json", true,
     [](Options* o, const std::string& v) {
       o->jsonPath = v;
       return v.empty() ? std::string("a file name or -") : std::string();
     }},
    {nullptr, "--csv", true,
     [](Options* o, const std::string& v) {
       o->csvPath = v;
       return v.empty() ? std::string("a file name or -") : std::string();
     }},
    {nullptr, "--plot", true,
     [](Options* o, const std::string& v) {
       auto ends = [&](const char* suf) {
         const size_t n = std::strlen(suf);
         return v.size() > n && v.compare(v.size() - n, n, suf) == 0;
       };
       if (!ends(".svg") && !ends(".png")) return std::string("a file name ending in .svg or .png");
       o->plotPath = v;
       return std::string();
     }},
    {nullptr, "--algo", true,
     [](Options* o, const std::string& v) {
       o->algo = v;
       return std::string();
     }},
    {nullptr, "--gdr-mode", true,
     [](Options* o, const std::string& v) {
       if (!gdrModeKnown(v)) return std::string("read, write, staged or auto");
       o->gdrMode = v;
       return std::string();
     }},
    {nullptr, "--run-timeout", true,
     [](Options* o, const std::string& v) {
       return toInt(v, 1, INT_MAX, &o->runTimeoutSec) ? std::string() : "seconds >= 1";
     }},
    {nullptr, "--progress", true,
     [](Options* o, const std::string& v) {
       char* end = nullptr;
       double s = std::strtod(v.c_str(), &end);
       if (v.empty() || *end != '\0' || !std::isfinite(s) || s < 0 || s > 86400)
         return std::string("seconds from 0 to 86400");
       o->progressSec = s;
       return std::string();
     }},
    {"-q", "--quiet", false,
     [](Options* o, const std::string&) {
       o->quiet = true;
       return std::string();
     }},
};

const OptionSpec* findOption(const std::string& name) {
  for (const auto& spec : kOptionSpecs)
    if ((spec.shortName && name == spec.shortName) || (spec.longName && name == spec.longName)) return &spec;
  return nullptr;
}

// getopt-style "-b8": a single-letter option with its value attached ("-np" is ridge-bench's
// own two-letter option and stays whole).
bool splitAttached(const std::string& a, std::string* name, std::string* val) {
  if (a.size() <= 2 || a[0] != '-' || a[1] == '-' || a == "-np") return false;
  const OptionSpec* spec = findOption(a.substr(0, 2));
  if (!spec || !spec->takesValue) return false;
  *name = a.substr(0, 2);
  *val = a.substr(2);
  return true;
}

bool endsWith(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

}  // namespace

Parse parseOptions(int argc, char** argv, Options* o, std::string* err) {
  bool haveColl = false;
  bool sawFactor = false;
  for (int i = 0; i < argc; ++i) o->args.emplace_back(argv[i]);
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") return Parse::Help;
    if (a == "--version") return Parse::Version;
    if (a.empty() || a[0] != '-' || a == "-") {
      if (haveColl) {
        *err = "unexpected argument '" + a + "'";
        return Parse::Error;
      }
      if (!parseColl(a, &o->coll)) {
        *err = "unknown collective '" + a + "'";
        return Parse::Error;
      }
      haveColl = true;
      continue;
    }
    // "-b 8", "-b8", "--minbytes 8" or "--minbytes=8".
    std::string name = a, val;
    bool haveValue = false;
    if (a.rfind("--", 0) == 0 && a.find('=') != std::string::npos) {
      name = a.substr(0, a.find('='));
      val = a.substr(a.find('=') + 1);
      haveValue = true;
    } else if (!findOption(a) && splitAttached(a, &name, &val)) {
      haveValue = true;
    }
    const OptionSpec* spec = findOption(name);
    if (!spec) {
      *err = "unknown option '" + name + "'";
      return Parse::Error;
    }
    if (!spec->takesValue && haveValue) {
      *err = "option " + name + " takes no value";
      return Parse::Error;
    }
    if (spec->takesValue && !haveValue) {
      if (i + 1 >= argc) {
        *err = "option " + name + " needs a value";
        return Parse::Error;
      }
      val = argv[++i];
    }
    if (spec->shortName && std::strcmp(spec->shortName, "-f") == 0) sawFactor = true;
    std::string what;
    if (!spec->apply) {  // -J / -F: the suffix picks the format, as nccl-tests infers it
      if (endsWith(val, ".json") && val.size() > 5)
        o->jsonPath = val;
      else if (endsWith(val, ".csv") && val.size() > 4)
        o->csvPath = val;
      else
        what = "a file name ending in .json or .csv: the suffix picks the format";
    } else {
      what = spec->apply(o, val);
    }
    if (!what.empty()) {
      if (what.rfind("refused: ", 0) == 0)
        *err = name + " " + val + " is refused: " + what.substr(9);
      else
        *err = "bad value '" + val + "' for " + name + " (" + what + ")";
      return Parse::Error;
    }
  }
  if (!haveColl) {
    *err = "missing the collective";
    return Parse::Error;
  }
  if (o->minBytes > o->maxBytes) {
    *err = "-b (minbytes) is larger than -e (maxbytes)";
    return Parse::Error;
  }
  // nccl-tests steps by -f when it is above 1, else by -i (default 1M). ridge-bench's default
  // factor is 2, so -i alone means increments, as it does in nccl-tests.
  if (o->increment && !sawFactor) o->factor = 1.0;
  if (o->factor <= 1.0 && o->increment == 0) o->increment = size_t(1) << 20;
  if (o->factor > 1.0) o->increment = 0;
  if (o->jsonPath == "-" && o->csvPath == "-") {
    *err = "--json - and --csv - cannot both write to stdout";
    return Parse::Error;
  }
  if (o->perIterSkip > 0 && !o->perIterTiming) {
    *err = "-K (per_iter_skip) needs -I 1 (per_iter_timing)";
    return Parse::Error;
  }
  if (o->perIterSkip >= o->iters) {
    *err = "-K " + std::to_string(o->perIterSkip) + " leaves no iteration of -n " + std::to_string(o->iters);
    return Parse::Error;
  }
  if (o->graphLaunches > 0 && o->perIterTiming) {
    *err = "-I (per-iteration timing) and -G (CUDA graphs) exclude each other, as in nccl-tests";
    return Parse::Error;
  }
  if (o->graphLaunches > 0 && o->blocking != 0) {
    // -z 3 as in nccl-tests; -z 1 and 2 wait for the stream, which a capturing stream refuses.
    *err = "-z " + std::to_string(o->blocking) +
           " and -G (CUDA graphs) exclude each other: the waits cannot be captured";
    return Parse::Error;
  }
  if (o->graphLaunches > 0 && o->streamNull) {
    *err = "-G (CUDA graphs) cannot capture the legacy default stream of -y 1";
    return Parse::Error;
  }
  if (o->parallelInit)
    o->notes.push_back("-p 1: every rank is its own process, so ranks always initialise in parallel");
  return Parse::Ok;
}

std::string unsupportedHere(const Options& o, bool cudaBuild) {
  const bool device = o.ridgeOnDevice || o.peerNccl;
  if (o.ngpus > 1)
    return "-g " + std::to_string(o.ngpus) + " is refused: " +
           (cudaBuild ? std::string("a ridge-bench rank is one process with one GPU")
                      : std::string("this ridge-bench was built without CUDA, a rank drives no GPU")) +
           "; for " + std::to_string(o.ngpus) + " ranks use -np " + std::to_string(o.ngpus);
  if (o.graphLaunches > 0 && !cudaBuild)
    return "-G (CUDA graphs) needs a CUDA build of ridge-bench (configure with -DRIDGE_WITH_CUDA=ON)";
  if (o.graphLaunches > 0 && !device)
    return "-G captures device work: give --ridge-buffers device or --peer nccl (host buffers run no stream)";
  return {};
}

}  // namespace rbench
