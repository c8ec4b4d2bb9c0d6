// ridge-bench's command line: every option of nccl-tests 2.19 (common.cu's getopt string
// "t:g:b:e:i:f:n:m:w:N:p:I:K:c:o:d:r:z:y:T:hG:C:a:R:x:D:V:J:S:M:u:", and the long names)
// and ridge-bench's own, each with a value it accepts (and what that sets) and a value it
// refuses (and the words of the refusal). The parser is the one ridge-bench runs
// (bench/options.cpp), compiled into this test.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "bench.h"

namespace rbench {
namespace {

struct Parsed {
  Parse result;
  Options o;
  std::string err;
};

Parsed parse(std::vector<std::string> args) {
  args.insert(args.begin(), "ridge-bench");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  Parsed p;
  p.result = parseOptions(int(argv.size()), argv.data(), &p.o, &p.err);
  return p;
}

// One accepted spelling and what it must set.
struct Accepted {
  std::vector<std::string> args;  // after the collective
  std::function<bool(const Options&)> holds;
  const char* what;
};

// The options whose value lands in a field: each spelling of nccl-tests' letters and long
// names, the attached ("-b8") and "=" forms.
const std::vector<Accepted>& acceptedCases() {
  static const std::vector<Accepted> cases = {
      {{"-b", "8"}, [](const Options& o) { return o.minBytes == 8; }, "-b"},
      {{"--minbytes=1K"}, [](const Options& o) { return o.minBytes == 1024; }, "--minbytes="},
      {{"-b64"}, [](const Options& o) { return o.minBytes == 64; }, "-b64 (attached)"},
      {{"-e", "64K"}, [](const Options& o) { return o.maxBytes == 65536; }, "-e"},
      {{"--maxbytes", "1M"}, [](const Options& o) { return o.maxBytes == (1u << 20); }, "--maxbytes"},
      {{"-i", "4K"}, [](const Options& o) { return o.increment == 4096; }, "-i alone: increments"},
      {{"-f", "2", "-i", "8"},
       [](const Options& o) { return o.increment == 0 && o.factor == 2; },
       "-f 2 beats -i"},
      {{"-f", "1", "-i", "4K"}, [](const Options& o) { return o.increment == 4096; }, "-f 1 -i: increments"},
      {{"-f", "1"}, [](const Options& o) { return o.increment == (1u << 20); }, "-f 1: nccl-tests' 1M step"},
      {{"--stepbytes", "8"}, [](const Options& o) { return o.increment == 8; }, "--stepbytes"},
      {{"-f", "8"}, [](const Options& o) { return o.factor == 8 && o.increment == 0; }, "-f"},
      {{"--stepfactor", "1.5"}, [](const Options& o) { return o.factor == 1.5; }, "--stepfactor"},
      {{"-n", "7"}, [](const Options& o) { return o.iters == 7; }, "-n"},
      {{"--iters", "3"}, [](const Options& o) { return o.iters == 3; }, "--iters"},
      {{"-m", "4"}, [](const Options& o) { return o.aggIters == 4; }, "-m"},
      {{"--agg_iters", "2"}, [](const Options& o) { return o.aggIters == 2; }, "--agg_iters"},
      {{"-w", "0"}, [](const Options& o) { return o.warmup == 0; }, "-w"},
      {{"--warmup_iters", "9"}, [](const Options& o) { return o.warmup == 9; }, "--warmup_iters"},
      {{"-N", "0"}, [](const Options& o) { return o.runCycles == 0; }, "-N 0"},
      {{"--run_cycles", "3"}, [](const Options& o) { return o.runCycles == 3; }, "--run_cycles"},
      {{"-p", "1"}, [](const Options& o) { return o.parallelInit == 1 && !o.notes.empty(); }, "-p 1 (noted)"},
      {{"--parallel_init", "0"}, [](const Options& o) { return o.parallelInit == 0; }, "--parallel_init"},
      {{"-I", "1"}, [](const Options& o) { return o.perIterTiming == 1; }, "-I"},
      {{"--per_iter_timing", "1", "-K", "2"}, [](const Options& o) { return o.perIterSkip == 2; }, "-K"},
      {{"-I", "1", "--per_iter_skip", "1"},
       [](const Options& o) { return o.perIterSkip == 1; },
       "--per_iter_skip"},
      {{"-c", "0"}, [](const Options& o) { return o.checkIters == 0; }, "-c 0"},
      {{"--check", "5"}, [](const Options& o) { return o.checkIters == 5; }, "--check 5"},
      {{"-o", "max"}, [](const Options& o) { return o.ops == std::vector<ridgeRedOp_t>{ridgeMax}; }, "-o"},
      {{"--op", "all"}, [](const Options& o) { return o.ops.size() == 5; }, "-o all"},
      {{"-d", "bf16"},
       [](const Options& o) { return o.dtypes == std::vector<ridgeDataType_t>{ridgeBfloat16}; },
       "-d"},
      {{"--datatype", "all"}, [](const Options& o) { return o.dtypes.size() == 10; }, "-d all"},
      {{"-r", "3"}, [](const Options& o) { return o.root == 3; }, "-r"},
      {{"--root", "all"}, [](const Options& o) { return o.root == -1; }, "-r all"},
      {{"-r", "-1"}, [](const Options& o) { return o.root == -1; }, "-r -1"},
      {{"-z", "3"}, [](const Options& o) { return o.blocking == 3; }, "-z"},
      {{"--blocking", "1"}, [](const Options& o) { return o.blocking == 1; }, "--blocking"},
      {{"-y", "1"}, [](const Options& o) { return o.streamNull == 1; }, "-y"},
      {{"--stream_null", "0"}, [](const Options& o) { return o.streamNull == 0; }, "--stream_null"},
      {{"-T", "30"}, [](const Options& o) { return o.stepTimeoutSec == 30; }, "-T"},
      {{"--timeout", "0"}, [](const Options& o) { return o.stepTimeoutSec == 0; }, "--timeout"},
      {{"-G", "4"}, [](const Options& o) { return o.graphLaunches == 4; }, "-G"},
      {{"--cudagraph", "0"}, [](const Options& o) { return o.graphLaunches == 0; }, "--cudagraph"},
      {{"-C", "1"}, [](const Options& o) { return o.reportCputime; }, "-C"},
      {{"--report_cputime", "0"}, [](const Options& o) { return !o.reportCputime; }, "--report_cputime"},
      {{"-S", "1"}, [](const Options& o) { return o.reportTimestamps; }, "-S"},
      {{"--report_timestamps", "1"},
       [](const Options& o) { return o.reportTimestamps; },
       "--report_timestamps"},
      {{"-J", "out.json"}, [](const Options& o) { return o.jsonPath == "out.json"; }, "-J .json"},
      {{"--output_file", "a/b.csv"}, [](const Options& o) { return o.csvPath == "a/b.csv"; }, "-J .csv"},
      {{"-F", "x.json"}, [](const Options& o) { return o.jsonPath == "x.json"; }, "-F (alias of -J)"},
      {{"-a", "0"}, [](const Options& o) { return o.average == 0; }, "-a 0"},
      {{"--average", "1"}, [](const Options& o) { return o.average == 1; }, "-a 1"},
      {{"-a", "2"}, [](const Options& o) { return o.average == 2; }, "-a 2"},
      {{}, [](const Options& o) { return o.average == 3; }, "-a default (max)"},
      {{"-R", "1"}, [](const Options& o) { return o.localRegister == 1; }, "-R"},
      {{"--local_register", "2"}, [](const Options& o) { return o.localRegister == 2; }, "--local_register"},
      {{"-x", "-1"}, [](const Options& o) { return o.ctaPolicy == -1; }, "-x -1"},
      {{"--cta_policy", "-1"}, [](const Options& o) { return o.ctaPolicy == -1; }, "--cta_policy -1"},
      {{"-D", "0"}, [](const Options& o) { return o.deviceImpl == 0; }, "-D 0"},
      {{"--device_implementation", "0"},
       [](const Options& o) { return o.deviceImpl == 0; },
       "--device_impl 0"},
      {{"-V", "16"}, [](const Options& o) { return o.deviceCtaCount == 16; }, "-V 16"},
      {{"--device_cta_count", "16"},
       [](const Options& o) { return o.deviceCtaCount == 16; },
       "--device_cta_count"},
      {{"-M", "1"}, [](const Options& o) { return o.memoryReport == 1; }, "-M"},
      {{"--memory", "0"}, [](const Options& o) { return o.memoryReport == 0; }, "--memory"},
      {{"-u", "3"}, [](const Options& o) { return o.unalign == 3; }, "-u"},
      {{"--unalign", "0"}, [](const Options& o) { return o.unalign == 0; }, "--unalign"},
      {{"-t", "1"}, [](const Options& o) { return o.nthreads == 1; }, "-t 1"},
      {{"--nthreads", "1"}, [](const Options& o) { return o.nthreads == 1; }, "--nthreads 1"},
      {{"-g", "1"}, [](const Options& o) { return o.ngpus == 1; }, "-g 1"},
      {{"--ngpus", "2"},
       [](const Options& o) { return o.ngpus == 2; },
       "-g 2 parses (refused by unsupportedHere)"},
      {{"-np", "4"}, [](const Options& o) { return o.np == 4; }, "-np"},
      {{"--np=3"}, [](const Options& o) { return o.np == 3; }, "--np="},
      {{"--peer", "gloo"}, [](const Options& o) { return o.peerGloo; }, "--peer gloo"},
      {{"--peer", "mpi"}, [](const Options& o) { return o.peerMpi; }, "--peer mpi"},
      {{"--peer", "nccl"}, [](const Options& o) { return o.peerNccl; }, "--peer nccl"},
      {{"--nccl-lib", "/x/libnccl.so.2"},
       [](const Options& o) { return o.ncclLib == "/x/libnccl.so.2"; },
       "--nccl-lib"},
      {{"--ridge-buffers", "device"}, [](const Options& o) { return o.ridgeOnDevice; }, "--ridge-buffers"},
      {{"--json", "-"}, [](const Options& o) { return o.jsonPath == "-"; }, "--json"},
      {{"--csv=r.csv"}, [](const Options& o) { return o.csvPath == "r.csv"; }, "--csv="},
      {{"--plot", "p.svg"}, [](const Options& o) { return o.plotPath == "p.svg"; }, "--plot svg"},
      {{"--plot", "p.png"}, [](const Options& o) { return o.plotPath == "p.png"; }, "--plot png"},
      {{"--algo", "ring"}, [](const Options& o) { return o.algo == "ring"; }, "--algo"},
      {{"--gdr-mode", "write"}, [](const Options& o) { return o.gdrMode == "write"; }, "--gdr-mode"},
      {{"--run-timeout", "60"}, [](const Options& o) { return o.runTimeoutSec == 60; }, "--run-timeout"},
      {{"--progress", "0.5"}, [](const Options& o) { return o.progressSec == 0.5; }, "--progress"},
      {{"-q"}, [](const Options& o) { return o.quiet; }, "-q"},
      {{"--quiet"}, [](const Options& o) { return o.quiet; }, "--quiet"},
  };
  return cases;
}

TEST(BenchOptions, EveryOptionSetsItsField) {
  for (const Accepted& c : acceptedCases()) {
    std::vector<std::string> args = {"allreduce"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    Parsed p = parse(args);
    EXPECT_EQ(p.result, Parse::Ok) << c.what << ": " << p.err;
    EXPECT_TRUE(p.o.args.size() == args.size() + 1) << c.what << ": the command line is kept for the records";
    if (p.result == Parse::Ok) {
      EXPECT_TRUE(c.holds(p.o)) << c.what;
    }
  }
}

// One refused value and the words the one-line refusal must contain.
struct Refused {
  std::vector<std::string> args;
  const char* says;
};

TEST(BenchOptions, RefusalsSayWhy) {
  const std::vector<Refused> cases = {
      {{"-t", "2"},
       "-t 2 is refused: ridge-bench runs one rank per process, not per thread; for 2 ranks use -np 2"},
      {{"-x", "1"}, "-x 1 is refused: Ridge's kernels have no CTA policy"},
      {{"-D", "1"}, "-D 1 is refused: Ridge has no device-API implementations"},
      {{"-V", "8"}, "-V 8 is refused: it only applies with -D > 0"},
      {{"-o", "mulsum"}, "-o mulsum is refused: Ridge has no pre-multiplied sum"},
      {{"-d", "f8e4m3"}, "-d f8e4m3 is refused: Ridge has no 8-bit float types"},
      {{"-J", "out.txt"}, "bad value 'out.txt' for -J (a file name ending in .json or .csv"},
      {{"-b", "12Q"}, "bad value '12Q' for -b"},
      {{"-z", "4"}, "bad value '4' for -z (0, 1, 2 or 3)"},
      {{"-a", "4"}, "bad value '4' for -a (0 (rank 0), 1 (mean), 2 (min) or 3 (max))"},
      {{"-R", "3"}, "bad value '3' for -R"},
      {{"-c", "-1"}, "bad value '-1' for -c"},
      {{"-n", "0"}, "bad value '0' for -n"},
      {{"-f", "0.5"}, "bad value '0.5' for -f (a number >= 1)"},
      {{"-y", "2"}, "bad value '2' for -y (0 or 1)"},
      {{"-g", "0"}, "bad value '0' for -g"},
      {{"--plot", "p.jpg"}, "bad value 'p.jpg' for --plot (a file name ending in .svg or .png)"},
      {{"--progress", "-1"}, "bad value '-1' for --progress"},
      {{"--peer", "ucc"}, "bad value 'ucc' for --peer"},
      {{"-K", "1"}, "-K (per_iter_skip) needs -I 1"},
      {{"-I", "1", "-K", "20"}, "-K 20 leaves no iteration of -n 20"},
      {{"-I", "1", "-G", "1"}, "-I (per-iteration timing) and -G (CUDA graphs) exclude each other"},
      {{"-z", "3", "-G", "1"}, "-z 3 and -G (CUDA graphs) exclude each other"},
      {{"-z", "1", "-G", "1"}, "-z 1 and -G (CUDA graphs) exclude each other: the waits cannot be captured"},
      {{"-y", "1", "-G", "1"}, "-G (CUDA graphs) cannot capture the legacy default stream"},
      {{"-b", "2K", "-e", "1K"}, "-b (minbytes) is larger than -e (maxbytes)"},
      {{"--json", "-", "--csv", "-"}, "cannot both write to stdout"},
      {{"-q", "1"}, "unexpected argument '1'"},
      {{"--quiet=1"}, "option --quiet takes no value"},
      {{"-n"}, "option -n needs a value"},
      {{"--bogus"}, "unknown option '--bogus'"},
      {{"-X", "1"}, "unknown option '-X'"},
  };
  for (const Refused& c : cases) {
    std::vector<std::string> args = {"allreduce"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    Parsed p = parse(args);
    EXPECT_EQ(p.result, Parse::Error) << c.args.front();
    EXPECT_NE(p.err.find(c.says), std::string::npos) << "got: " << p.err << "\nwant: " << c.says;
    EXPECT_EQ(p.err.find('\n'), std::string::npos) << "one line: " << p.err;
  }
}

// What depends on the build: -g beyond one GPU per rank, -G without CUDA or device buffers.
TEST(BenchOptions, RefusedByTheBuildWithTheReason) {
  Parsed g2 = parse({"allreduce", "-g", "2"});
  ASSERT_EQ(g2.result, Parse::Ok);
  EXPECT_NE(unsupportedHere(g2.o, false).find("-g 2 is refused: this ridge-bench was built without CUDA"),
            std::string::npos);
  EXPECT_NE(unsupportedHere(g2.o, true)
                .find("a ridge-bench rank is one process with one GPU; for 2 ranks use -np 2"),
            std::string::npos);
  Parsed graph = parse({"allreduce", "-G", "2"});
  ASSERT_EQ(graph.result, Parse::Ok);
  EXPECT_NE(unsupportedHere(graph.o, false).find("-G (CUDA graphs) needs a CUDA build"), std::string::npos);
  EXPECT_NE(unsupportedHere(graph.o, true).find("give --ridge-buffers device or --peer nccl"),
            std::string::npos);
  Parsed graphDevice = parse({"allreduce", "-G", "2", "--ridge-buffers", "device"});
  EXPECT_EQ(unsupportedHere(graphDevice.o, true), "");
  Parsed plain =
      parse({"allreduce", "-g", "1", "-t", "1", "-c", "1", "-a", "3", "-z", "0", "-d", "all", "-o", "all"});
  ASSERT_EQ(plain.result, Parse::Ok) << plain.err;
  EXPECT_EQ(unsupportedHere(plain.o, false), "");
}

TEST(BenchOptions, HelpAndVersionStopParsing) {
  EXPECT_EQ(parse({"-h"}).result, Parse::Help);
  EXPECT_EQ(parse({"allreduce", "--help"}).result, Parse::Help);
  EXPECT_EQ(parse({"--version"}).result, Parse::Version);
  EXPECT_EQ(versionLine().rfind("ridge-bench ", 0), 0u) << versionLine();
  EXPECT_NE(versionLine().find("Ridge library"), std::string::npos);
}

TEST(BenchOptions, NcclTestsSpellingsOfCollectives) {
  for (const char* name : {"all_reduce", "all_gather", "reduce_scatter", "alltoall", "sendrecv", "bcast"})
    EXPECT_EQ(parse({name}).result, Parse::Ok) << name;
  EXPECT_EQ(parse({}).err, "missing the collective");
}

// Every short option of nccl-tests 2.19's getopt string is known to the parser: none of
// them may be "unknown option".
TEST(BenchOptions, EveryNcclTestsLetterIsKnown) {
  const std::string letters = "tgbeifnmwNpIKcodrzyTGCaRxDVJSMu";
  for (char l : letters) {
    Parsed p = parse({"allreduce", std::string("-") + l, "1"});
    EXPECT_EQ(p.err.find("unknown option"), std::string::npos) << "-" << l << ": " << p.err;
  }
  for (const char* name : {"--nthreads",
                           "--ngpus",
                           "--minbytes",
                           "--maxbytes",
                           "--stepbytes",
                           "--stepfactor",
                           "--iters",
                           "--agg_iters",
                           "--warmup_iters",
                           "--run_cycles",
                           "--parallel_init",
                           "--check",
                           "--op",
                           "--datatype",
                           "--root",
                           "--blocking",
                           "--stream_null",
                           "--timeout",
                           "--cudagraph",
                           "--report_cputime",
                           "--report_timestamps",
                           "--output_file",
                           "--average",
                           "--local_register",
                           "--cta_policy",
                           "--device_implementation",
                           "--device_cta_count",
                           "--memory",
                           "--unalign",
                           "--per_iter_timing",
                           "--per_iter_skip"}) {
    Parsed p = parse({"allreduce", name, "1"});
    EXPECT_EQ(p.err.find("unknown option"), std::string::npos) << name << ": " << p.err;
  }
}

}  // namespace
}  // namespace rbench
