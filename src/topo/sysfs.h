// Small readers for /proc and /sys, shared by the host summary (summary.cpp) and live
// discovery (discover.cpp).
#pragma once

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

}  // namespace ridge::topo
