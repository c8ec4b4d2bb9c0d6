// ridge-bench --plot: busbw and time against size through a plotting program, never drawn
// by hand. gnuplot (Debian: gnuplot-nox) first; else /usr/bin/python3 with matplotlib
// (Debian: python3-matplotlib). The data goes inline in the script, so one temporary file
// holds everything and the picture can be re-made from it by hand when something fails.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench.h"

namespace rbench {

namespace {

constexpr const char* kPython = "/usr/bin/python3";

// Runs argv with stdin from /dev/null and stdout+stderr into `output`; the exit status,
// or -1 when it could not start.
int runQuiet(const std::vector<std::string>& argv, std::string* output) {
  char logName[] = "/tmp/ridge-bench-plotlog-XXXXXX";
  const int logFd = mkstemp(logName);
  if (logFd < 0) return -1;
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) {
    close(logFd);
    unlink(logName);
    return -1;
  }
  if (pid == 0) {
    const int devNull = open("/dev/null", O_RDONLY);
    if (devNull >= 0) dup2(devNull, 0);
    dup2(logFd, 1);
    dup2(logFd, 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (output) {
    output->clear();
    char buf[4096];
    lseek(logFd, 0, SEEK_SET);
    for (int reads = 0; reads < 64; ++reads) {  // the first 256 KiB say enough
      const ssize_t got = read(logFd, buf, sizeof buf);
      if (got <= 0) break;
      output->append(buf, size_t(got));
    }
  }
  close(logFd);
  unlink(logName);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

bool onPath(const char* program) {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    const std::string dir = dirs.substr(start, end - start);
    if (!dir.empty() && access((dir + "/" + program).c_str(), X_OK) == 0) return true;
    start = end + 1;
  }
  return false;
}

bool haveGnuplot() {
  return onPath("gnuplot");
}

bool haveMatplotlib() {
  if (access(kPython, X_OK) != 0) return false;
  return runQuiet({kPython, "-c", "import matplotlib"}, nullptr) == 0;
}

// Which plotter: RIDGE_BENCH_PLOTTER=gnuplot|matplotlib picks one, else the first present.
std::string chosenPlotter() {
  const char* forced = std::getenv("RIDGE_BENCH_PLOTTER");
  if (forced && *forced) return forced;
  if (haveGnuplot()) return "gnuplot";
  if (haveMatplotlib()) return "matplotlib";
  return "";
}

bool endsWith(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

std::string quoteFor(char q, const std::string& s) {
  std::string out(1, q);
  for (char c : s) {
    if (c == q || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out + q;
}

// "8", "4K", "16M": a size with a 1024-based suffix when it is a whole multiple.
std::string sizeLabel(double bytes) {
  static const char* const kSuffix[] = {"", "K", "M", "G", "T"};
  int k = 0;
  while (k < 4 && bytes >= 1024 && std::fmod(bytes, 1024) == 0) bytes /= 1024, ++k;
  char b[32];
  std::snprintf(b, sizeof b, "%.0f%s", bytes, kSuffix[k]);
  return b;
}

// Size ticks at powers of two, every second or fourth one when there would be too many.
std::vector<double> sizeTicks(double lo, double hi) {
  std::vector<double> all;
  for (double t = 1; t <= hi * 1.0001; t *= 2)
    if (t >= lo * 0.9999) all.push_back(t);
  size_t stride = 1;
  while (all.size() / stride > 12) stride *= 2;
  std::vector<double> out;
  for (size_t i = 0; i < all.size(); i += stride) out.push_back(all[i]);
  return out;
}

std::string gnuplotScript(const std::string& path, const std::string& title,
                          const std::vector<PlotSeries>& series) {
  std::string s;
  char b[256];
  // Data blocks first: $s0 .. $sN, one "bytes busbw time" line per size.
  for (size_t i = 0; i < series.size(); ++i) {
    s += "$s" + std::to_string(i) + " << EOD\n";
    for (size_t k = 0; k < series[i].bytes.size(); ++k) {
      std::snprintf(b, sizeof b, "%.0f %.9g %.9g\n", series[i].bytes[k], series[i].busbw[k],
                    series[i].timeUs[k]);
      s += b;
    }
    s += "EOD\n";
  }
  if (endsWith(path, ".png"))
    s += "set terminal pngcairo size 1400,560 enhanced font 'sans,10'\n";
  else
    s += "set terminal svg size 1400,560 enhanced font 'sans,10' background rgb 'white'\n";
  s += "set output " + quoteFor('\'', path) + "\n";
  s += "set multiplot layout 1,2 title " + quoteFor('"', title) + " noenhanced\n";
  s += "set logscale xy\nset format y '%g'\nset grid xtics ytics mxtics mytics lc rgb '#dddddd'\n";
  double lo = 0, hi = 0;
  for (const auto& ser : series)
    for (double x : ser.bytes) {
      lo = lo == 0 ? x : std::min(lo, x);
      hi = std::max(hi, x);
    }
  std::snprintf(b, sizeof b, "set xrange [%.6g:%.6g]\n", lo / 1.25, hi * 1.25);
  s += b;
  s += "set xtics (";
  const auto ticks = sizeTicks(lo, hi);
  for (size_t i = 0; i < ticks.size(); ++i) {
    std::snprintf(b, sizeof b, "%s'%s' %.0f", i ? ", " : "", sizeLabel(ticks[i]).c_str(), ticks[i]);
    s += b;
  }
  s += ")\nset xlabel 'message size (bytes; K, M, G = 1024-based)'\n";
  s += "set key top left noenhanced box opaque\n";
  auto plotColumn = [&](int column) {
    std::string p = "plot ";
    for (size_t i = 0; i < series.size(); ++i) {
      if (i) p += ", ";
      // Zero (too small to show in this format) cannot sit on a log axis: left out.
      p += "$s" + std::to_string(i) + " using 1:($" + std::to_string(column) + " > 0 ? $" +
           std::to_string(column) + " : NaN) with linespoints lw 2 pt " + std::to_string(int(i % 12) + 1) +
           " title " + quoteFor('"', series[i].label);
    }
    return p + "\n";
  };
  s += "set ylabel 'busbw (GB/s)'\nset title 'bus bandwidth (higher is better)'\n" + plotColumn(2);
  s += "set ylabel 'time (us)'\nset title 'time per call (lower is better)'\nset key top left\n" +
       plotColumn(3);
  s += "unset multiplot\n";
  return s;
}

std::string pythonScript(const std::string& path, const std::string& title,
                         const std::vector<PlotSeries>& series) {
  std::string s = "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\nseries = [\n";
  char b[128];
  for (const auto& ser : series) {
    s += "  (" + quoteFor('\'', ser.label) + ", [";
    for (size_t k = 0; k < ser.bytes.size(); ++k) {
      std::snprintf(b, sizeof b, "%s(%.0f, %.9g, %.9g)", k ? ", " : "", ser.bytes[k], ser.busbw[k],
                    ser.timeUs[k]);
      s += b;
    }
    s += "]),\n";
  }
  s += "]\n";
  s += "import matplotlib.ticker\n"
       "def size_label(x, pos):\n"
       "    for suffix in ('', 'K', 'M', 'G'):\n"
       "        if x < 1024 or x % 1024:\n"
       "            return '%g%s' % (x, suffix)\n"
       "        x /= 1024\n"
       "    return '%gT' % x\n";
  s += "fig, (bw, tm) = plt.subplots(1, 2, figsize=(14, 5.6))\n";
  s += "fig.suptitle(" + quoteFor('\'', title) + ")\n";
  s += "for label, pts in series:\n"
       "    pos = [p for p in pts if p[1] > 0]\n"
       "    bw.plot([p[0] for p in pos], [p[1] for p in pos], marker='o', label=label)\n"
       "    tm.plot([p[0] for p in pts], [p[2] for p in pts], marker='o', label=label)\n"
       "for ax, name, what in ((bw, 'busbw (GB/s)', 'bus bandwidth (higher is better)'),\n"
       "                       (tm, 'time (us)', 'time per call (lower is better)')):\n"
       "    ax.set_xscale('log', base=2)\n"
       "    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(size_label))\n"
       "    ax.set_yscale('log')\n"
       "    ax.set_xlabel('message size (bytes; K, M, G = 1024-based)')\n"
       "    ax.set_ylabel(name)\n"
       "    ax.set_title(what)\n"
       "    ax.grid(True, which='both', color='#dddddd')\n"
       "    ax.legend(loc='upper left', fontsize=8)\n"
       "fig.tight_layout()\n";
  s += "fig.savefig(" + quoteFor('\'', path) + ", dpi=100)\n";
  return s;
}

}  // namespace

std::string plotterMissing() {
  const std::string p = chosenPlotter();
  if (p == "gnuplot") return haveGnuplot() ? "" : "RIDGE_BENCH_PLOTTER=gnuplot, but gnuplot is not on PATH";
  if (p == "matplotlib")
    return haveMatplotlib() ? ""
                            : "RIDGE_BENCH_PLOTTER=matplotlib, but /usr/bin/python3 cannot import matplotlib";
  if (!p.empty()) return "RIDGE_BENCH_PLOTTER=" + p + " is neither gnuplot nor matplotlib";
  return "no plotter found: install gnuplot (apt-get install gnuplot-nox) or python3-matplotlib";
}

std::string drawPlot(const std::string& path, const std::string& title,
                     const std::vector<PlotSeries>& series) {
  if (series.empty()) return "no measured rows to draw";
  const std::string plotter = chosenPlotter();
  const bool gnuplot = plotter == "gnuplot";
  const std::string script = gnuplot ? gnuplotScript(path, title, series) : pythonScript(path, title, series);
  char scriptName[] = "/tmp/ridge-bench-plot-XXXXXX";
  const int fd = mkstemp(scriptName);
  if (fd < 0) return std::string("mkstemp: ") + std::strerror(errno);
  const bool written = write(fd, script.data(), script.size()) == ssize_t(script.size());
  close(fd);
  if (!written) {
    unlink(scriptName);
    return "cannot write the plot script";
  }
  std::string output;
  unlink(path.c_str());  // so that an old picture cannot pass for a new one
  const int rc =
      gnuplot ? runQuiet({"gnuplot", scriptName}, &output) : runQuiet({kPython, scriptName}, &output);
  // gnuplot reports some problems (a bad terminal, an unwritable file) and still exits 0.
  const bool wrote = access(path.c_str(), R_OK) == 0;
  if (rc != 0 || !wrote) {
    while (!output.empty() && (output.back() == '\n' || output.back() == ' ')) output.pop_back();
    const size_t nl = output.rfind('\n');
    std::string last = nl == std::string::npos ? output : output.substr(nl + 1);
    std::string err = (gnuplot ? std::string("gnuplot") : std::string(kPython)) + " exited with status " +
                      std::to_string(rc) + (wrote ? "" : " and wrote no file") +
                      (last.empty() ? "" : ": " + last) + " (script kept in " + scriptName + ")";
    return err;
  }
  unlink(scriptName);
  return {};
}

}  // namespace rbench
