// Typed access to the RIDGE_* settings declared in settings.def.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

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

// ---- Validation (checked at every communicator init) ----------------------------------------
// Every setting has one rule in settings.cpp (kRules): the values it accepts and what happens
// to another value. Most settings fail init; a few are free-form text that the layer reading
// them parses and reports on (a path, an interface list, RIDGE_ALGO's rules).
enum class SettingRuleKind {
  IntRange,   // an integer from min to max
  SizeRange,  // a size (K/M/G suffixes) from min to max bytes
  Bool,       // 0 or 1
  OneOf,      // one of `choices` (exact, or any case when caseInsensitive)
  HostPort,   // host:port or [ipv6]:port with a port from 1 to 65535
  FreeText,   // anything; `checkedBy` says who parses it and how a bad value is reported
};

struct SettingRule {
  Setting setting;
  SettingRuleKind kind;
  int64_t min = 0, max = 0;         // IntRange, SizeRange
  const char* choices = nullptr;    // OneOf: '|'-separated accepted values
  bool caseInsensitive = false;     // OneOf
  const char* checkedBy = nullptr;  // FreeText: where a bad value is caught
};

// The rule of `s` (every declared setting has one; a test checks it).
const SettingRule* settingRule(Setting s);
// "an integer from 1 to 16777216", "one of auto, socket, softnic, verbs", ... for messages and
// the settings page.
std::string settingAcceptedValues(Setting s);
// Whether `value` satisfies the rule of `s`; when not, *why says what is accepted, naming the
// variable ("RIDGE_TIMEOUT=0: expected an integer from 1 to 16777216").
bool settingValueValid(Setting s, const std::string& value, std::string* why);
// Checks every RIDGE_* variable set in the environment against its rule. ridgeInvalidArgument
// naming each bad variable, its value and the accepted values; ok otherwise. Also warns (once
// per name and process) about RIDGE_* variables that are not settings (unknownSettingNames).
Status validateSettings();
// RIDGE_* variables in the environment that no setting declares (RIDGE_TEST_* and RIDGE_BENCH_*,
// the tests' and the benchmark's own, excepted), each with the closest setting's name when one
// is within two edits: {"RIDGE_TIMOUT", "RIDGE_TIMEOUT"}. A typo would otherwise be ignored.
std::vector<std::pair<std::string, std::string>> unknownSettingNames();

}  // namespace ridge
