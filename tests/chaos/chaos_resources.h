// What a chaos case counts to tell whether a process leaked: its open file descriptors, its
// threads, and the /dev/shm segments named after the job's processes (Ridge's fallback
// segments are /ridge-<pid>-<hex>; memfd segments leave nothing there).
#pragma once

#include <dirent.h>
#include <sys/types.h>

#include <set>
#include <string>
#include <vector>

namespace ridge::chaos {

// Entries of a /proc directory, less "." and "..".
inline int countDirEntries(const char* dir) {
  int n = 0;
  if (DIR* d = opendir(dir)) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') ++n;
    closedir(d);
  }
  return n;
}

inline int countOpenFds() {
  return countDirEntries("/proc/self/fd") - 1;  // the directory stream's own descriptor
}

inline int countThreads() {
  return countDirEntries("/proc/self/task");
}

// /dev/shm entries that name one of `pids`.
inline std::set<std::string> shmSegmentsOf(const std::vector<pid_t>& pids) {
  std::set<std::string> out;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      for (pid_t p : pids)
        if (name.rfind("ridge-" + std::to_string(p) + "-", 0) == 0) out.insert(name);
    }
    closedir(d);
  }
  return out;
}

}  // namespace ridge::chaos
