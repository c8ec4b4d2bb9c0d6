#include "core/settings.h"

#include <strings.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

#include "core/log.h"

namespace ridge {

const std::vector<SettingInfo>& allSettings() {
  static const std::vector<SettingInfo> list = {
#define RIDGE_SETTING(name, type, def, doc) {#name, #type, def, doc},
#include "settings.def"
#undef RIDGE_SETTING
  };
  return list;
}

const SettingInfo& settingInfo(Setting s) {
  return allSettings()[static_cast<size_t>(s)];
}

static const char* rawValue(Setting s) {
  std::string env = std::string("RIDGE_") + settingInfo(s).name;
  const char* v = std::getenv(env.c_str());
  return (v && *v) ? v : nullptr;
}

bool settingIsSet(Setting s) {
  return rawValue(s) != nullptr;
}

std::string settingString(Setting s) {
  const char* v = rawValue(s);
  return v ? std::string(v) : std::string(settingInfo(s).defaultValue);
}

bool parseSize(const std::string& text, int64_t* out) {
  if (text.empty()) return false;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno || end == text.c_str() || v < 0) return false;
  int64_t mult = 1;
  if (*end) {
    switch (*end) {
      case 'k':
      case 'K': mult = 1LL << 10; break;
      case 'm':
      case 'M': mult = 1LL << 20; break;
      case 'g':
      case 'G': mult = 1LL << 30; break;
      default: return false;
    }
    ++end;
    if (*end == 'B' || *end == 'b') ++end;
    if (*end) return false;
  }
  if (v > INT64_MAX / mult) return false;
  *out = v * mult;
  return true;
}

static int64_t parseOrDefault(Setting s, bool size) {
  const SettingInfo& info = settingInfo(s);
  int64_t def = 0;
  if (size) {
    parseSize(info.defaultValue, &def);
  } else {
    def = std::strtoll(info.defaultValue, nullptr, 10);
  }
  const char* v = rawValue(s);
  if (!v) return def;
  int64_t out = 0;
  if (size) {
    if (parseSize(v, &out)) return out;
  } else {
    errno = 0;
    char* end = nullptr;
    long long x = std::strtoll(v, &end, 10);
    if (!errno && end != v && *end == 0) return x;
  }
  RIDGE_WARN("RIDGE_%s=%s is not a valid %s; using the default %s", info.name, v, size ? "size" : "integer",
             info.defaultValue);
  return def;
}

int64_t settingInt(Setting s) {
  return parseOrDefault(s, false);
}
int64_t settingSize(Setting s) {
  return parseOrDefault(s, true);
}

uint32_t settingSlotCount(Setting s, uint32_t maxSlots, uint32_t fallback) {
  const int64_t v = settingInt(s);
  if (v < 2 || v > static_cast<int64_t>(maxSlots)) {
    RIDGE_WARN("RIDGE_%s=%lld is outside 2..%u; using %u", settingInfo(s).name, static_cast<long long>(v),
               maxSlots, fallback);
    return fallback;
  }
  const uint32_t pow2 = std::bit_floor(static_cast<uint32_t>(v));
  if (pow2 != static_cast<uint32_t>(v))
    RIDGE_WARN("RIDGE_%s=%lld is not a power of two; using %u", settingInfo(s).name,
               static_cast<long long>(v), pow2);
  return pow2;
}

// ---- Validation ------------------------------------------------------------------------------

namespace {

using K = SettingRuleKind;
constexpr int64_t kKi = 1ll << 10, kMi = 1ll << 20, kGi = 1ll << 30;

SettingRule intRange(Setting s, int64_t min, int64_t max) {
  return {s, K::IntRange, min, max};
}
SettingRule sizeRange(Setting s, int64_t min, int64_t max) {
  return {s, K::SizeRange, min, max};
}
SettingRule boolean(Setting s) {
  return {s, K::Bool};
}
SettingRule oneOf(Setting s, const char* choices, bool anyCase = false) {
  return {s, K::OneOf, 0, 0, choices, anyCase};
}
SettingRule freeText(Setting s, const char* checkedBy) {
  return {s, K::FreeText, 0, 0, nullptr, false, checkedBy};
}

// One rule per declared setting. The ranges are those the reading code accepts (and the
// setting's doc states); a value outside fails init rather than being clamped or replaced by
// the default without a word.
const std::vector<SettingRule>& rules() {
  static const std::vector<SettingRule> list = {
      oneOf(Setting::DEBUG, "NONE|WARN|INFO|TRACE", true),
      intRange(Setting::TIMEOUT, 1, 1 << 24),
      freeText(Setting::SOCKET_IFNAME, "interface selection: a spec that matches no interface fails init"),
      intRange(Setting::RANK, -1, INT_MAX - 1),  // -1: not set (the default)
      intRange(Setting::WORLD_SIZE, -1, INT_MAX),  // -1: not set; 0 is refused below
      {Setting::ROOT_ADDR, K::HostPort},
      freeText(Setting::ALGO, "the algorithm selector at init: a malformed rule fails init"),
      sizeRange(Setting::ALLPAIRS_MAX, 0, 1ll << 40),
      sizeRange(Setting::SHM_SLOT_BYTES, 4 * kKi, kGi),
      intRange(Setting::SHM_SLOTS, 2, 64),
      intRange(Setting::SPIN_US, 0, 10'000'000),
      oneOf(Setting::CMA, "AUTO|auto|0|1"),
      sizeRange(Setting::DIRECT_MIN, 0, 1ll << 40),
      sizeRange(Setting::DIRECT_MAX, 0, 1ll << 40),
      freeText(Setting::HOST_COST, "the host cost model at init: a bad entry is reported (WARN) and the "
                                   "defaults are used, as its doc says"),
      sizeRange(Setting::STREAM_MIN, 0, 1ll << 40),
      oneOf(Setting::NET, "auto|AUTO|socket|softnic|verbs|SOFTNIC|VERBS"),
      boolean(Setting::SHM),
      oneOf(Setting::SOCKET_FAMILY, "auto|AUTO|ipv4|IPV4|4|ipv6|IPV6|6"),
      intRange(Setting::SOCKET_STREAMS, 0, 16),
      sizeRange(Setting::SOCKET_CHUNK, 4 * kKi, 64 * kMi),
      intRange(Setting::SOCKET_SLOTS, 2, 64),
      boolean(Setting::SOCKET_DIRECT),
      sizeRange(Setting::SOCKET_BUFFER, 0, kGi),
      sizeRange(Setting::SOFTNIC_STAGING_BYTES, 4 * kKi, kGi),
      sizeRange(Setting::SOFTNIC_MTU, 256, kMi),
      freeText(Setting::SOFTNIC_FAULTS, "the software NIC's fault parser (only with RIDGE_NET=softnic)"),
      intRange(Setting::SOFTNIC_RTO_US, 50, 10'000'000),
      oneOf(Setting::SOFTNIC_WIRE, "auto|tcp"),
      freeText(Setting::SOFTNIC_TRACE, "a file path: the software NIC fails to start when it cannot open it"),
      sizeRange(Setting::RDMA_SLOT_BYTES, 4 * kKi, 256 * kMi),
      intRange(Setting::RDMA_SLOTS, 2, 64),
      freeText(Setting::VERBS_DEVICE, "the verbs transport: a device name that is not found fails init"),
      oneOf(Setting::GDR_MODE, "off|auto|read|write|staged|gdr-read|gdr-write|host-staged", true),
      oneOf(Setting::NET_DIRECT, "auto|1|0"),
      oneOf(Setting::GDR_FLUSH, "auto|read|off", true),
      intRange(Setting::GDR_STAGING_SLOTS, 1, 64),
      sizeRange(Setting::GDR_SLOT_BYTES, 64, 16 * kMi),
      intRange(Setting::GDR_RECV_SLOTS, 1, 256),
      oneOf(Setting::GDR_STAGING, "auto|AUTO|nic-gpu|nic|host"),
      freeText(Setting::SOFTNIC_PCIE_MODEL, "the gdr transport: an unknown preset or unreadable file fails init"),
      freeText(Setting::GDR_PAIR, "the gdr transport: names not in the model fail init"),
      oneOf(Setting::P2P, "auto|off"),
      oneOf(Setting::GDR_DATA_PATH, "auto|off"),
      sizeRange(Setting::STAGING_BYTES, 64 * kKi, kGi),
      oneOf(Setting::LL, "auto|on|off", true),
      sizeRange(Setting::LL_MAX_BYTES, 8, kMi),
      freeText(Setting::PLAN_FILE, "the plan reader at init: an unusable file fails init"),
      freeText(Setting::PLAN_DUMP, "a file path: rank 0 reports (WARN) when it cannot write it"),
      oneOf(Setting::PLAN_HOST_ORDER, "placement|rank"),
      intRange(Setting::GDR_PACE_SCALE, 1, 1000),
      oneOf(Setting::DEVICE, "auto|emulated", true),
      oneOf(Setting::DEBUG_DUMP, "SIGUSR1|SIGUSR2|USR1|USR2", true),
      freeText(Setting::TOPO_FILE, "the topology loader at init of a communicator whose ranks all serve a "
                                   "GPU: a file that cannot be loaded fails init on every rank"),
      freeText(Setting::JOB_KEY, "the rendezvous: every rank must have the same key (a rank with another "
                                 "one is refused by the root)"),
  };
  return list;
}

std::string sizeText(int64_t v) {
  if (v >= kGi && v % kGi == 0) return std::to_string(v / kGi) + "G";
  if (v >= kMi && v % kMi == 0) return std::to_string(v / kMi) + "M";
  if (v >= kKi && v % kKi == 0) return std::to_string(v / kKi) + "K";
  return std::to_string(v);
}

std::vector<std::string> splitChoices(const char* choices) {
  std::vector<std::string> out;
  std::string cur;
  for (const char* p = choices; *p; ++p) {
    if (*p == '|') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += *p;
    }
  }
  out.push_back(cur);
  return out;
}

bool parseInteger(const std::string& text, int64_t* out) {
  if (text.empty()) return false;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno || end == text.c_str() || *end) return false;
  *out = v;
  return true;
}

bool validHostPort(const std::string& text) {
  std::string host, port;
  if (!text.empty() && text[0] == '[') {
    const size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') return false;
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string::npos || text.find(':') != colon) return false;
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  int64_t p = 0;
  if (host.empty() || port.size() > 5 || !parseInteger(port, &p) || port[0] == '+' || port[0] == '-')
    return false;
  return p >= 1 && p <= 65535;
}

}  // namespace

const SettingRule* settingRule(Setting s) {
  for (const SettingRule& r : rules())
    if (r.setting == s) return &r;
  return nullptr;
}

std::string settingAcceptedValues(Setting s) {
  const SettingRule* r = settingRule(s);
  if (!r) return "any value (no rule declared)";
  switch (r->kind) {
    case K::IntRange: return format("an integer from %lld to %lld", (long long)r->min, (long long)r->max);
    case K::SizeRange:
      return format("a size from %s to %s (bytes, K/M/G suffixes)", sizeText(r->min).c_str(),
                    sizeText(r->max).c_str());
    case K::Bool: return "0 or 1";
    case K::OneOf: {
      // Show each value once (the list may spell one value in two cases).
      std::vector<std::string> shown;
      for (const std::string& c : splitChoices(r->choices)) {
        bool dup = false;
        for (const std::string& d : shown) dup |= strcasecmp(c.c_str(), d.c_str()) == 0;
        if (!dup) shown.push_back(c);
      }
      std::string out = "one of ";
      for (size_t i = 0; i < shown.size(); ++i) {
        if (i) out += i + 1 == shown.size() ? " or " : ", ";
        out += shown[i];
      }
      return out;
    }
    case K::HostPort: return "host:port or [ipv6]:port with a port from 1 to 65535";
    case K::FreeText: return std::string("free text, checked by ") + r->checkedBy;
  }
  return "?";
}

bool settingValueValid(Setting s, const std::string& value, std::string* why) {
  const SettingRule* r = settingRule(s);
  bool ok = true;
  if (r) {
    int64_t v = 0;
    switch (r->kind) {
      case K::IntRange: ok = parseInteger(value, &v) && v >= r->min && v <= r->max; break;
      case K::SizeRange: ok = parseSize(value, &v) && v >= r->min && v <= r->max; break;
      case K::Bool: ok = value == "0" || value == "1"; break;
      case K::OneOf:
        ok = false;
        for (const std::string& c : splitChoices(r->choices))
          ok |= r->caseInsensitive ? strcasecmp(c.c_str(), value.c_str()) == 0 : c == value;
        break;
      case K::HostPort: ok = validHostPort(value); break;
      case K::FreeText: ok = true; break;
    }
  }
  if (!ok && why)
    *why = format("RIDGE_%s=%s: expected %s", settingInfo(s).name, value.c_str(),
                  settingAcceptedValues(s).c_str());
  return ok;
}

namespace {

size_t editDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::vector<std::pair<std::string, std::string>> unknownSettingNames() {
  std::vector<std::pair<std::string, std::string>> out;
  for (char** e = environ; e && *e; ++e) {
    const std::string entry = *e;
    const size_t eq = entry.find('=');
    const std::string name = entry.substr(0, eq);
    if (name.rfind("RIDGE_", 0) != 0 || name.rfind("RIDGE_TEST_", 0) == 0 || name.rfind("RIDGE_BENCH_", 0) == 0)
      continue;
    std::string closest;
    size_t best = 3;
    bool declared = false;
    for (const SettingInfo& info : allSettings()) {
      const std::string known = std::string("RIDGE_") + info.name;
      if (known == name) declared = true;
      const size_t d = editDistance(name, known);
      if (d < best) {
        best = d;
        closest = known;
      }
    }
    if (!declared) out.emplace_back(name, closest);
  }
  return out;
}

Status validateSettings() {
  {
    static std::mutex warnedMutex;
    static std::set<std::string> warned;
    for (const auto& [name, closest] : unknownSettingNames()) {
      std::lock_guard<std::mutex> lock(warnedMutex);
      if (!warned.insert(name).second) continue;
      RIDGE_WARN("%s is set but is not a Ridge setting, so it is ignored%s%s%s (docs/settings.md)", name.c_str(),
                 closest.empty() ? "" : " (did you mean ", closest.c_str(), closest.empty() ? "" : "?)");
    }
  }
  std::string problems;
  int bad = 0;
  for (size_t i = 0; i < allSettings().size(); ++i) {
    const auto s = static_cast<Setting>(i);
    const char* v = rawValue(s);
    if (!v) continue;
    std::string why;
    if (settingValueValid(s, v, &why)) continue;
    if (bad++) problems += "; ";
    problems += why;
  }
  if (bad == 0) return Status::ok();
  return makeError(ridgeInvalidArgument, "invalid setting%s: %s (see docs/settings.md)", bad == 1 ? "" : "s",
                   problems.c_str());
}

void logSettings() {
  if (logLevel() < LogLevel::Info) return;
  for (const SettingInfo& info : allSettings()) {
    std::string env = std::string("RIDGE_") + info.name;
    const char* v = std::getenv(env.c_str());
    bool set = v && *v;
    RIDGE_INFO("setting %s=%s (%s)", env.c_str(), set ? v : info.defaultValue,
               set ? "from environment" : "default");
  }
}

}  // namespace ridge
