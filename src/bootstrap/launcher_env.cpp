#include "bootstrap/launcher_env.h"

#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "bootstrap/auth.h"
#include "core/log.h"
#include "core/settings.h"

namespace ridge {

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

bool parseInt(const std::string& text, long* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  *out = std::strtol(text.c_str(), &end, 10);
  return *end == 0;
}

}  // namespace

Status launcherPlace(LauncherPlace* out) {
  static const struct {
    const char* rank;
    const char* size;
    const char* launcher;
  } kSources[] = {
      {"RIDGE_RANK", "RIDGE_WORLD_SIZE", "Ridge"},
      {"RANK", "WORLD_SIZE", "torchrun"},
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI"},
      {"PMI_RANK", "PMI_SIZE", "PMI"},
      {"SLURM_PROCID", "SLURM_NTASKS", "Slurm"},
  };
  std::string rankText, sizeText;
  for (const auto& s : kSources) {
    rankText = env(s.rank);
    sizeText = env(s.size);
    if (rankText.empty() || sizeText.empty()) continue;
    out->source = std::string(s.rank) + "/" + s.size + " (" + s.launcher + ")";
    break;
  }
  out->rootAddr = env("RIDGE_ROOT_ADDR");
  if (out->rootAddr.empty()) {
    const std::string host = env("MASTER_ADDR"), port = env("MASTER_PORT");
    if (!host.empty() && !port.empty())
      out->rootAddr = (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + port;
  }
  if (out->source.empty() || out->rootAddr.empty())
    return makeError(
        ridgeInvalidUsage,
        "%s: rank and world size from RIDGE_RANK/RIDGE_WORLD_SIZE, RANK/WORLD_SIZE, "
        "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE, PMI_RANK/PMI_SIZE or SLURM_PROCID/SLURM_NTASKS, "
        "and the root's host:port in RIDGE_ROOT_ADDR (or MASTER_ADDR and MASTER_PORT): %s",
        "ridgeCommInitFromEnv",
        out->source.empty() ? "no rank and world size found" : "no root address found");
  long rank = -1, size = 0;
  if (!parseInt(rankText, &rank) || !parseInt(sizeText, &size) || size < 1 || size > INT_MAX || rank < 0 ||
      rank >= size)
    return makeError(ridgeInvalidArgument,
                     "ridgeCommInitFromEnv: rank '%s' / world size '%s' from %s are not valid",
                     rankText.c_str(), sizeText.c_str(), out->source.c_str());
  out->rank = static_cast<int>(rank);
  out->worldSize = static_cast<int>(size);
  return Status::ok();
}

uint64_t envJobSecret(const LauncherPlace& place, std::string* source) {
  std::string material, from;
  if (settingIsSet(Setting::JOB_KEY)) {
    material = "key=" + settingString(Setting::JOB_KEY);
    from = "RIDGE_JOB_KEY";
  } else {
    // Launchers' job ids: the same on every rank of one job, different between jobs.
    static const char* const kJobIds[] = {"SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "PMIX_NAMESPACE",
                                          "OMPI_MCA_ess_base_jobid"};
    for (const char* name : kJobIds) {
      const std::string v = env(name);
      if (v.empty()) continue;
      material = "job:";
      material.append(name).append("=").append(v);
      from = name;
      if (std::strcmp(name, "SLURM_JOB_ID") == 0) material.append(".").append(env("SLURM_STEP_ID"));
      break;
    }
  }
  if (from.empty()) {
    from = "the root address alone";
    static std::once_flag warned;
    std::call_once(warned, [&] {
      RIDGE_WARN(
          "ridgeCommInitFromEnv: no RIDGE_JOB_KEY and no launcher job id: any process that can reach %s can "
          "join this job's rendezvous; set RIDGE_JOB_KEY to a random value shared by the ranks "
          "(docs/reliability.md)",
          place.rootAddr.c_str());
    });
  }
  material += "|root=" + place.rootAddr;
  static const auth::Key kEnvKey{0x5269646765456e76ull, 0x4a6f625365637265ull};  // "RidgeEnv", "JobSecre"
  if (source) *source = from;
  return auth::sipHash24(kEnvKey, material.data(), material.size()) | 1;
}

}  // namespace ridge
