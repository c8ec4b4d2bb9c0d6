#include "topo/sysfs.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ridge::topo {

bool readFirstLine(const std::string& path, std::string* out) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return false;
  char buf[512];
  const bool ok = std::fgets(buf, sizeof buf, f) != nullptr;
  std::fclose(f);
  if (!ok) return false;
  size_t n = std::strlen(buf);
  while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ')) --n;
  out->assign(buf, n);
  return true;
}

std::vector<std::string> listDir(const std::string& path) {
  std::vector<std::string> names;
  DIR* d = opendir(path.c_str());
  if (!d) return names;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') names.emplace_back(e->d_name);
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<int> parseCpuList(const std::string& text) {
  std::vector<int> cpus;
  const char* p = text.c_str();
  while (*p) {
    char* end = nullptr;
    const long a = std::strtol(p, &end, 10);
    if (end == p) break;
    long b = a;
    p = end;
    if (*p == '-') {
      b = std::strtol(p + 1, &end, 10);
      p = end;
    }
    for (long c = a; c <= b && c - a < (1 << 20); ++c) cpus.push_back(static_cast<int>(c));
    if (*p != ',') break;
    ++p;
  }
  return cpus;
}

std::string formatCpuList(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    // Appended piece by piece: a concatenation of temporaries trips GCC 12's -Wrestrict.
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) out.append("-").append(std::to_string(cpus[j]));
    i = j + 1;
  }
  return out;
}

bool parseCpuMask(const std::string& text, std::vector<int>* cpus) {
  cpus->clear();
  std::vector<uint32_t> words;  // most significant first
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    std::string word = text.substr(start, comma - start);
    if (word.rfind("0x", 0) == 0) word = word.substr(2);
    if (word.empty() || word.size() > 8 ||
        word.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
      return false;
    words.push_back(static_cast<uint32_t>(std::strtoul(word.c_str(), nullptr, 16)));
    if (words.size() > 4096) return false;
    start = comma + 1;
  }
  for (size_t w = 0; w < words.size(); ++w) {
    const uint32_t bits = words[words.size() - 1 - w];
    for (int b = 0; b < 32; ++b)
      if (bits >> b & 1u) cpus->push_back(static_cast<int>(w * 32 + b));
  }
  return true;
}

std::string formatCpuMask(const std::vector<int>& cpus) {
  const size_t nwords = cpus.empty() ? 1 : static_cast<size_t>(cpus.back()) / 32 + 1;
  std::vector<uint32_t> words(nwords, 0);
  for (int c : cpus)
    if (c >= 0 && static_cast<size_t>(c) / 32 < nwords) words[static_cast<size_t>(c) / 32] |= 1u << (c % 32);
  std::string out;
  char buf[16];
  for (size_t w = nwords; w-- > 0;) {
    std::snprintf(buf, sizeof buf, "%08x", words[w]);
    if (!out.empty()) out += ',';
    out += buf;
  }
  return out;
}

bool makeDirs(const std::string& dir) {
  if (dir.empty()) return true;
  struct stat st;
  if (stat(dir.c_str(), &st) == 0) return S_ISDIR(st.st_mode);
  const size_t slash = dir.find_last_of('/');
  if (slash != std::string::npos && slash > 0 && !makeDirs(dir.substr(0, slash))) return false;
  return mkdir(dir.c_str(), 0755) == 0 || errno == EEXIST;
}

bool writeFile(const std::string& path, const std::string& content) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  const bool ok = std::fwrite(content.data(), 1, content.size(), f) == content.size();
  return std::fclose(f) == 0 && ok;
}

SysRoot::SysRoot(std::string root, std::string recordTo)
    : root_(std::move(root)), recordTo_(std::move(recordTo)) {
  while (!root_.empty() && root_.back() == '/') root_.pop_back();
}

void SysRoot::record(const std::string& path, const std::string& content) const {
  if (recordTo_.empty()) return;
  const std::string dest = recordTo_ + path;
  if (makeDirs(dest.substr(0, dest.find_last_of('/')))) writeFile(dest, content);
}

bool SysRoot::bytes(const std::string& path, std::string* out, size_t maxBytes) const {
  FILE* f = std::fopen((root_ + path).c_str(), "rb");
  if (!f) return false;
  out->clear();
  char buf[4096];
  size_t n = 0;
  // sysfs files report a size of 4096 whatever they hold, so read until EOF.
  while (out->size() < maxBytes &&
         (n = std::fread(buf, 1, std::min(sizeof buf, maxBytes - out->size()), f)) > 0)
    out->append(buf, n);
  const bool ok = !std::ferror(f);
  std::fclose(f);
  if (ok) record(path, *out);
  return ok;
}

bool SysRoot::line(const std::string& path, std::string* out) const {
  std::string all;
  if (!bytes(path, &all, 4096) || all.empty()) return false;
  size_t n = all.find('\n');
  if (n == std::string::npos) n = all.size();
  while (n && (all[n - 1] == '\r' || all[n - 1] == ' ')) --n;
  out->assign(all, 0, n);
  return true;
}

std::vector<std::string> SysRoot::list(const std::string& path) const {
  std::vector<std::string> names = listDir(root_ + path);
  struct stat dirStat;
  if (!recordTo_.empty() && stat((root_ + path).c_str(), &dirStat) == 0 && S_ISDIR(dirStat.st_mode)) {
    makeDirs(recordTo_ + path);
    for (const std::string& n : names) {
      struct stat st;
      if (stat((root_ + path + "/" + n).c_str(), &st) == 0 && S_ISDIR(st.st_mode))
        makeDirs(recordTo_ + path + "/" + n);
    }
  }
  return names;
}

}  // namespace ridge::topo
