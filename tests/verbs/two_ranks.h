// Two ranks of one communicator as threads of this process, for the verbs tests: one allreduce
// over the transport the settings select.
#pragma once

#include <string>
#include <thread>
#include <vector>

#include "ridge/ridge.h"
#include "scoped_env.h"

namespace ridge {
namespace verbs_test {

using ridgetest::ScopedEnv;

// Two ranks as threads, one allreduce of `count` floats with RIDGE_NET=`net` and RIDGE_SHM=`shm`;
// returns "" on success, or the first error text.
inline std::string allreduceOverNet(const char* net, const char* shmSetting = "0", size_t count = 1024) {
  ScopedEnv n("RIDGE_NET", net);
  ScopedEnv shm("RIDGE_SHM", shmSetting);
  ScopedEnv ifname("RIDGE_SOCKET_IFNAME", "lo");
  ScopedEnv timeout("RIDGE_TIMEOUT", "30");
  ridgeUniqueId id;
  if (ridgeGetUniqueId(&id) != ridgeSuccess)
    return std::string("ridgeGetUniqueId: ") + ridgeGetLastError(nullptr);
  std::string errors[2];
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      ridgeComm_t comm = nullptr;
      if (ridgeCommInitRank(&comm, 2, id, r) != ridgeSuccess) {
        errors[r] = ridgeGetLastError(nullptr);
        if (errors[r].empty()) errors[r] = "ridgeCommInitRank failed";
        return;
      }
      std::vector<float> in(count), out(count, -1.0f);
      for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i * (r + 1));
      if (ridgeAllReduce(in.data(), out.data(), in.size(), ridgeFloat, ridgeSum, comm, nullptr) !=
          ridgeSuccess)
        errors[r] = ridgeGetLastError(comm);
      for (size_t i = 0; errors[r].empty() && i < out.size(); ++i)
        if (out[i] != static_cast<float>(3 * i)) errors[r] = "wrong sum at " + std::to_string(i);
      ridgeCommDestroy(comm);
    });
  }
  for (auto& t : ranks) t.join();
  return errors[0].empty() ? errors[1] : errors[0];
}

}  // namespace verbs_test
}  // namespace ridge
