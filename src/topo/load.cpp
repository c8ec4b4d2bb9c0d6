#include "topo/load.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "topo/graph_build.h"
#include "topo/topo_json.h"
#include "topo/xml.h"

namespace ridge::topo {

namespace {

using Clock = std::chrono::steady_clock;

double msSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

const char* fileKind(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

// Not through makeError (which also logs a WARN line): the caller reports it, so that
// ridge-topo refuses such a path in one line.
Status refuseKind(const std::string& path, mode_t mode) {
  return Status(ridgeInvalidArgument,
                format("%s is %s, not a topology file: give a regular file (hwloc XML, NCCL topology XML or "
                       "Ridge JSON)%s",
                       path.c_str(), fileKind(mode),
                       S_ISDIR(mode) ? " or a folder 'ridge-topo capture' wrote" : ""));
}

// Reads a whole file, refusing what cannot be a topology description. Errors are
// ridgeInvalidArgument: the caller named a file that is not a usable description. The file is
// opened non-blocking and checked with fstat before any read, so a FIFO or a device named by
// mistake (or swapped in after a stat) is refused at once instead of blocking.
Status readFile(const std::string& path, std::string* text) {
  RIDGE_TRY(checkInputPath(path, /*allowDirectory=*/false));
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0)
    return makeError(ridgeInvalidArgument, "cannot open topology file %s: %s", path.c_str(),
                     std::strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const mode_t mode = st.st_mode;
    ::close(fd);
    return refuseKind(path, mode);
  }
  FILE* f = fdopen(fd, "rb");
  if (!f) {
    ::close(fd);
    return makeError(ridgeInvalidArgument, "cannot read topology file %s: %s", path.c_str(),
                     std::strerror(errno));
  }
  text->clear();
  char buf[65536];
  size_t n;
  bool tooBig = false;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) {
    if (text->size() + n > kMaxTopologyFileBytes) {
      tooBig = true;
      break;
    }
    text->append(buf, n);
  }
  const bool bad = std::ferror(f);
  std::fclose(f);
  if (bad) return makeError(ridgeInvalidArgument, "error reading topology file %s", path.c_str());
  if (tooBig)
    return makeError(ridgeInvalidArgument, "%s is larger than %zu MiB: not a topology description",
                     path.c_str(), kMaxTopologyFileBytes >> 20);
  return Status::ok();
}

enum class Format { HwlocXml, NcclXml, Json, Any };

Status fromText(const std::string& text, const std::string& what, Format want, Topology* out) {
  *out = Topology();
  size_t p = 0;
  if (text.compare(0, 3, "\xEF\xBB\xBF") == 0) p = 3;  // UTF-8 byte order mark
  while (p < text.size() && (text[p] == ' ' || text[p] == '\t' || text[p] == '\n' || text[p] == '\r')) ++p;
  if (p == text.size())
    return makeError(ridgeInvalidArgument, "%s is empty: not a topology description", what.c_str());
  if (text[p] == '{') {
    if (want != Format::Any && want != Format::Json)
      return makeError(ridgeInvalidArgument, "%s is JSON, not %s XML", what.c_str(),
                       want == Format::HwlocXml ? "hwloc" : "NCCL topology");
    return parseTopologyJson(text, what, out);
  }
  XmlElement root;
  RIDGE_TRY(parseXml(text, what, &root));
  if (root.name == "graphs")
    return makeError(ridgeInvalidArgument,
                     "%s is an NCCL graph file (<graphs>): it lists channels, not a machine, so it is not a "
                     "topology; give an hwloc XML (lstopo --of xml) or NCCL topology file (<system>)",
                     what.c_str());
  const bool hwloc = root.name == "topology", nccl = root.name == "system";
  if (!hwloc && !nccl)
    return makeError(ridgeInvalidArgument,
                     "%s:%d: root element <%s> is not a topology (expected <topology> from hwloc or <system> "
                     "from NCCL)",
                     what.c_str(), root.line, root.name.c_str());
  if (want == Format::HwlocXml && !hwloc)
    return makeError(ridgeInvalidArgument, "%s is an NCCL topology file, not hwloc XML", what.c_str());
  if (want == Format::NcclXml && !nccl)
    return makeError(ridgeInvalidArgument, "%s is hwloc XML, not an NCCL topology file", what.c_str());
  Status s = hwloc ? buildFromHwlocXml(root, what, out) : buildFromNcclXml(root, what, out);
  if (!s.isOk()) *out = Topology();
  return s;
}

Status fromFile(const std::string& path, Format want, Topology* out) {
  const auto start = Clock::now();
  std::string text;
  Status s = readFile(path, &text);
  if (s.isOk()) s = fromText(text, path, want, out);
  if (!s.isOk()) {
    *out = Topology();
    return s;
  }
  out->loadMs = msSince(start);
  return s;
}

}  // namespace

Status checkInputPath(const std::string& path, bool allowDirectory) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return Status::ok();  // missing: the reader says so
  if (S_ISREG(st.st_mode) || (allowDirectory && S_ISDIR(st.st_mode))) return Status::ok();
  return refuseKind(path, st.st_mode);
}

Status loadTopologyFile(const std::string& path, Topology* out) {
  return fromFile(path, Format::Any, out);
}
Status loadHwlocXml(const std::string& path, Topology* out) {
  return fromFile(path, Format::HwlocXml, out);
}
Status loadNcclTopologyXml(const std::string& path, Topology* out) {
  return fromFile(path, Format::NcclXml, out);
}

Status loadTopologyText(const std::string& text, const std::string& what, Topology* out) {
  const auto start = Clock::now();
  RIDGE_TRY(fromText(text, what, Format::Any, out));
  out->loadMs = msSince(start);
  return Status::ok();
}
Status parseHwlocXmlText(const std::string& text, const std::string& what, Topology* out) {
  return fromText(text, what, Format::HwlocXml, out);
}
Status parseNcclTopologyXmlText(const std::string& text, const std::string& what, Topology* out) {
  return fromText(text, what, Format::NcclXml, out);
}

}  // namespace ridge::topo
