#include "core/settings.h"

#include <bit>
#include <cerrno>
#include <cstdlib>
#include <cstring>

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
