// Small readers for /proc and /sys, shared by the host summary (summary.cpp) and live
// discovery (discover.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ridge::topo {

/// The first line of a file, without its line ending or trailing spaces; false when the file
/// cannot be opened or is empty.
bool readFirstLine(const std::string& path, std::string* out);

/// The entries of a directory except those starting with '.', sorted; empty when it cannot
/// be opened.
std::vector<std::string> listDir(const std::string& path);

/// Parses a kernel CPU list such as "0-3,8,10-11" (stops at the first malformed part).
std::vector<int> parseCpuList(const std::string& text);

/// The kernel's list syntax for ascending CPU numbers: {0,1,2,3,8} -> "0-3,8"; "" for none.
std::string formatCpuList(const std::vector<int>& cpus);

/// Parses a kernel CPU mask ("00000000,ffffffff": 32-bit hex words, most significant first,
/// as in /sys/.../local_cpus and NCCL's affinity attribute) into ascending CPU numbers;
/// false when malformed.
bool parseCpuMask(const std::string& text, std::vector<int>* cpus);

/// The mask form of ascending CPU numbers (at least one word).
std::string formatCpuMask(const std::vector<int>& cpus);

/// Where /sys and /proc are read: this machine ("" root) or a folder that `ridge-topo capture`
/// filled with the same layout below it, so that one piece of code (the doctor) reads both.
/// With a record folder, every file read and every directory listed is also copied there:
/// running the doctor live while recording yields exactly the tree it needs to run again
/// from the folder, which is what `capture` does.
class SysRoot {
 public:
  explicit SysRoot(std::string root = "", std::string recordTo = "");

  /// First line (as readFirstLine) of the file at absolute path `path` below the root.
  bool line(const std::string& path, std::string* out) const;
  /// Whole file, at most `maxBytes`; false when it cannot be read.
  bool bytes(const std::string& path, std::string* out, size_t maxBytes = size_t{1} << 20) const;
  /// Entries of a directory (as listDir); recorded as empty folders for those that are one.
  std::vector<std::string> list(const std::string& path) const;

  const std::string& root() const { return root_; }
  bool live() const { return root_.empty(); }

 private:
  void record(const std::string& path, const std::string& content) const;
  std::string root_, recordTo_;
};

/// Creates `dir` and its missing parents; false (errno set) on failure.
bool makeDirs(const std::string& dir);

/// Writes `content` to `path` (replacing it); false on failure.
bool writeFile(const std::string& path, const std::string& content);

}  // namespace ridge::topo
