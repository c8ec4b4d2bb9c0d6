// Typed access to the RIDGE_* settings declared in settings.def.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ridge {

enum class Setting {
#define RIDGE_SETTING(name, type, def, doc) name,
#include "settings.def"
#undef RIDGE_SETTING
  Count
};

struct SettingInfo {
  const char* name;  // without the RIDGE_ prefix
  const char* type;  // Int, Size, String, Bool
  const char* defaultValue;
  const char* doc;
};

const std::vector<SettingInfo>& allSettings();
const SettingInfo& settingInfo(Setting s);

// Value from the environment, or the declared default. Malformed numbers fall back to
// the default with a WARN line naming the variable.
std::string settingString(Setting s);
int64_t settingInt(Setting s);
// Size with 1024-based K/M/G suffix.
int64_t settingSize(Setting s);
// True when the variable is set in the environment (empty counts as unset).
bool settingIsSet(Setting s);

// A FIFO slot count: 2 to maxSlots (one slot would let a ring deadlock: a rank holding a
// received slot waits for a free send slot its successor frees only after the same wait),
// and a power of two, rounded down with a WARN otherwise. FIFO positions are 32-bit
// sequence numbers modulo the count; a count that does not divide 2^32 would map the last
// sequence number before the wrap and the first after it to the same slot. Out of range:
// `fallback`, with a WARN.
uint32_t settingSlotCount(Setting s, uint32_t maxSlots, uint32_t fallback);

// Parses "64K", "1M", "3G", "123" (1024-based). Returns false on garbage.
bool parseSize(const std::string& text, int64_t* out);

// Logs every setting with its value and source at INFO.
void logSettings();

}  // namespace ridge
