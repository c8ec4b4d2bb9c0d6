// ridge-bench: command line.
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

bool knownOption(const std::string& a) {
  static const char* const kNames[] = {
      "-b",    "--minbytes",  "-e",        "--maxbytes", "-f",         "--stepfactor",
      "-i",    "--stepbytes", "-n",        "--iters",    "-w",         "--warmup_iters",
      "-c",    "--check",     "-d",        "--datatype", "-o",         "--op",
      "-r",    "--root",      "-np",       "--np",       "--peer",     "--json",
      "--csv", "--algo",      "--timeout", "--gdr-mode", "--nccl-lib", "--ridge-buffers"};
  for (const char* n : kNames)
    if (a == n) return true;
  return false;
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
  std::fprintf(f,
               "Usage: ridge-bench <collective> [options]\n"
               "  collective: allreduce broadcast reduce allgather reducescatter alltoall sendrecv\n"
               "              (sendrecv: ring shift, rank r sends to r+1 and receives from r-1)\n"
               "Options (sizes take 1024-based K/M/G suffixes):\n"
               "  -b BYTES     smallest size (default 8)\n"
               "  -e BYTES     largest size (default 32M)\n"
               "  -f FACTOR    multiply the size by FACTOR between rows (default 2)\n"
               "  -i BYTES     add BYTES between rows instead of multiplying\n"
               "  -n ITERS     timed iterations per size (default 20)\n"
               "  -w ITERS     warm-up iterations per size (default 5)\n"
               "  -c 0|1       check results (default 1)\n"
               "  -d TYPE      int8 uint8 int32 uint32 int64 uint64 half float double bfloat16\n"
               "               (aliases fp16 bf16 fp32 fp64; default float)\n"
               "  -o OP        sum prod max min avg (default sum)\n"
               "  -r ROOT      root rank of broadcast and reduce (default 0)\n"
               "  -np N        run N ranks as forked processes of this one (default 1)\n"
               "  --peer mpi   also time MPI on the same sizes, interleaved with Ridge; with -np N\n"
               "               outside a launcher ridge-bench re-runs itself under mpirun\n"
               "  --peer gloo  also time Gloo (TCP device) on the same sizes; ranks rendezvous in a\n"
               "               file store (a temporary directory with -np; RIDGE_BENCH_GLOO_STORE\n"
               "               with RIDGE_RANK), on RIDGE_BENCH_GLOO_IFACE or the interface named\n"
               "               by RIDGE_SOCKET_IFNAME (127.0.0.1 when neither names one)\n"
               "  --peer nccl  also time NCCL on device buffers, same sizes, interleaved (CUDA\n"
               "               builds on GPU machines, one GPU per rank); libnccl.so.2 is loaded\n"
               "               at run time\n"
               "  --nccl-lib L the library --peer nccl loads (default libnccl.so.2)\n"
               "  --ridge-buffers host|device  where Ridge's buffers live (default host; device:\n"
               "               cudaMalloc buffers, collectives ordered on a CUDA stream, docs/gpu.md)\n"
               "  --json FILE  write one record per size as JSON (- for stdout; the table then\n"
               "               goes to stderr)\n"
               "  --csv FILE   the same as CSV\n"
               "  --algo STR   set RIDGE_ALGO for the Ridge runs\n"
               "  --timeout S  with -np: seconds to wait for the ranks before killing them (1800)\n"
               "  --gdr-mode M read, write, staged or auto: every pair of ranks through the gdr\n"
               "               transport in that mode (sets RIDGE_GDR_MODE, RIDGE_NET=softnic unless\n"
               "               RIDGE_NET names verbs, RIDGE_SHM=0 unless set); with\n"
               "               RIDGE_SOFTNIC_PCIE_MODEL the figures are modeled and labeled so\n"
               "  -h, --help   this text\n"
               "Launch: under mpirun/srun (MPI build) ranks bootstrap through MPI; with RIDGE_RANK and\n"
               "RIDGE_WORLD_SIZE set they use ridgeCommInitFromEnv; otherwise -np forks the ranks.\n"
               "Exit status: 0 ok, 1 wrong results, 2 usage, 3 a call failed or a rank died.\n");
}

Parse parseOptions(int argc, char** argv, Options* o, std::string* err) {
  bool haveColl = false;
  bool sawFactor = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") return Parse::Help;
    if (a.empty() || a[0] != '-') {
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
    // Every remaining option takes a value: "-b 8" or "--json=FILE".
    std::string val;
    auto eq = a.find('=');
    const bool inlineValue = a.rfind("--", 0) == 0 && eq != std::string::npos;
    if (inlineValue) {
      val = a.substr(eq + 1);
      a = a.substr(0, eq);
    }
    if (!knownOption(a)) {
      *err = "unknown option '" + a + "'";
      return Parse::Error;
    }
    if (!inlineValue) {
      if (i + 1 >= argc) {
        *err = "option " + a + " needs a value";
        return Parse::Error;
      }
      val = argv[++i];
    }
    auto bad = [&](const char* what) {
      *err = "bad value '" + val + "' for " + a + " (" + what + ")";
      return Parse::Error;
    };
    if (a == "-b" || a == "--minbytes") {
      if (!parseSize(val, &o->minBytes)) return bad("a size such as 8, 1K, 64M");
    } else if (a == "-e" || a == "--maxbytes") {
      if (!parseSize(val, &o->maxBytes)) return bad("a size such as 8, 1K, 64M");
    } else if (a == "-f" || a == "--stepfactor") {
      char* end = nullptr;
      o->factor = std::strtod(val.c_str(), &end);
      if (*end != '\0' || !(o->factor > 1.0) || !std::isfinite(o->factor))
        return bad("a number greater than 1");
      sawFactor = true;
    } else if (a == "-i" || a == "--stepbytes") {
      if (!parseSize(val, &o->increment) || o->increment == 0) return bad("a size > 0");
    } else if (a == "-n" || a == "--iters") {
      if (!parseInt(val, 1, INT_MAX, &o->iters)) return bad("an integer >= 1");
    } else if (a == "-w" || a == "--warmup_iters") {
      if (!parseInt(val, 0, INT_MAX, &o->warmup)) return bad("an integer >= 0");
    } else if (a == "-c" || a == "--check") {
      int c = 0;
      if (!parseInt(val, 0, 1, &c)) return bad("0 or 1");
      o->check = c != 0;
    } else if (a == "-d" || a == "--datatype") {
      if (!parseType(val, &o->dtype))
        return bad("int8 uint8 int32 uint32 int64 uint64 half float double bfloat16");
    } else if (a == "-o" || a == "--op") {
      if (!parseOp(val, &o->op)) return bad("sum prod max min avg");
    } else if (a == "-r" || a == "--root") {
      if (!parseInt(val, 0, INT_MAX, &o->root)) return bad("a rank >= 0");
    } else if (a == "-np" || a == "--np") {
      if (!parseInt(val, 1, 4096, &o->np)) return bad("a rank count from 1 to 4096");
    } else if (a == "--peer") {
      if (val == "mpi")
        o->peerMpi = true;
      else if (val == "gloo")
        o->peerGloo = true;
      else if (val == "nccl")
        o->peerNccl = true;
      else
        return bad("mpi, gloo or nccl");
    } else if (a == "--nccl-lib") {
      if (val.empty()) return bad("a library name or path");
      o->ncclLib = val;
    } else if (a == "--ridge-buffers") {
      if (val != "host" && val != "device") return bad("host or device");
      o->ridgeOnDevice = val == "device";
    } else if (a == "--json") {
      o->jsonPath = val;
    } else if (a == "--csv") {
      o->csvPath = val;
    } else if (a == "--algo") {
      o->algo = val;
    } else if (a == "--gdr-mode") {
      if (!gdrModeKnown(val)) return bad("read, write, staged or auto");
      o->gdrMode = val;
    } else if (a == "--timeout") {
      if (!parseInt(val, 1, INT_MAX, &o->timeoutSec)) return bad("seconds >= 1");
    } else {
      *err = "unknown option '" + a + "'";
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
  if (sawFactor && o->increment) {
    *err = "give either -f (factor) or -i (increment), not both";
    return Parse::Error;
  }
  if (o->jsonPath == "-" && o->csvPath == "-") {
    *err = "--json - and --csv - cannot both write to stdout";
    return Parse::Error;
  }
  return Parse::Ok;
}

}  // namespace rbench
