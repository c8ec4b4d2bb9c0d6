// Chaos: garbage in every RIDGE_* setting. Table-driven over the settings registry
// (src/core/settings.def): for each declared setting, values no rule may accept fail
// communicator init with ridgeInvalidArgument and a message naming the variable and what it
// accepts; the setting's own default, set explicitly, passes; free-text settings (paths,
// interface lists, rule strings) name who checks them, and garbage there still gives a clean
// result (success or an error), never a crash or a hang. A one-rank communicator is enough:
// validation runs before anything connects.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <string>
#include <vector>

#include "chaos_record.h"
#include "core/settings.h"
#include "ridge/ridge.h"

namespace {

using ridge::Setting;
using ridge::SettingRuleKind;
using ridge::chaos::Outcome;

std::string envName(Setting s) {
  return std::string("RIDGE_") + ridge::settingInfo(s).name;
}

// Sets one variable for the scope; the previous value comes back after.
class ScopedSetting {
 public:
  ScopedSetting(const std::string& name, const std::string& value) : name_(name) {
    const char* old = getenv(name.c_str());
    if (old) {
      had_ = true;
      old_ = old;
    }
    setenv(name.c_str(), value.c_str(), 1);
  }
  ~ScopedSetting() {
    if (had_)
      setenv(name_.c_str(), old_.c_str(), 1);
    else
      unsetenv(name_.c_str());
  }

 private:
  std::string name_, old_;
  bool had_ = false;
};

struct InitOutcome {
  ridgeResult_t result;
  std::string message;
  double seconds;
};

// A one-rank communicator with the environment as it is; destroyed again when it came up.
InitOutcome initOneRank() {
  const auto start = std::chrono::steady_clock::now();
  ridgeUniqueId id;
  InitOutcome out{ridgeGetUniqueId(&id), "", 0};
  if (out.result == ridgeSuccess) {
    ridgeComm_t comm = nullptr;
    out.result = ridgeCommInitRank(&comm, 1, id, 0);
    if (comm) ridgeCommDestroy(comm);
  }
  out.message = ridgeGetLastError(nullptr);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

class EverySetting : public ::testing::TestWithParam<size_t> {
 protected:
  void SetUp() override {
    setenv("RIDGE_SOCKET_IFNAME", "lo", 1);
    setenv("RIDGE_TIMEOUT", "5", 1);
  }
};

TEST_P(EverySetting, GarbageFailsInitNamingTheVariable) {
  const auto s = static_cast<Setting>(GetParam());
  const std::string name = envName(s);
  const ridge::SettingRule* rule = ridge::settingRule(s);
  ASSERT_NE(rule, nullptr) << name << " has no rule in src/core/settings.cpp: declare what it accepts";

  // Its own default, set explicitly, must be accepted (an empty default means unset).
  const std::string def = ridge::settingInfo(s).defaultValue;
  if (!def.empty()) {
    std::string why;
    EXPECT_TRUE(ridge::settingValueValid(s, def, &why)) << name << "'s default is refused: " << why;
  }

  long wrong = 0;
  std::vector<std::string> tried;
  if (rule->kind == SettingRuleKind::FreeText) {
    // Free text: who checks it must be said, and garbage still ends cleanly.
    ASSERT_NE(rule->checkedBy, nullptr);
    EXPECT_GT(std::string(rule->checkedBy).size(), 10u) << name;
    {
      ScopedSetting g(name, "\x01garbage//..\x7f");
      InitOutcome o = initOneRank();
      EXPECT_LT(o.seconds, 30.0) << name << ": init took " << o.seconds << " s";
      if (o.result != ridgeSuccess) EXPECT_FALSE(o.message.empty()) << name << ": an error without a message";
    }
    ridge::chaos::record("settings", name + "=<control bytes and slashes> (free text, " + rule->checkedBy + ")",
                         Outcome::kCleanError, 0);
    return;
  }
  // Values that no rule of these kinds accepts.
  std::vector<std::string> garbage = {"bogus", "\x01\x02", "1 2", "99999999999999999999999"};
  if (rule->kind == SettingRuleKind::IntRange || rule->kind == SettingRuleKind::SizeRange) {
    garbage.push_back(std::to_string(rule->min - 1));
    garbage.push_back(std::to_string(rule->max) + "0");
    garbage.push_back("1.5");
    garbage.push_back("0x10");
  }
  if (rule->kind == SettingRuleKind::Bool) garbage.insert(garbage.end(), {"2", "-1", "yes"});
  if (rule->kind == SettingRuleKind::HostPort) garbage.insert(garbage.end(), {"host", "host:0", "host:65536", "::1:80"});
  for (const std::string& value : garbage) {
    ScopedSetting g(name, value);
    InitOutcome o = initOneRank();
    tried.push_back(value);
    if (o.result != ridgeInvalidArgument) {
      ++wrong;
      ADD_FAILURE() << name << "=" << value << ": init returned " << o.result << " (" << o.message << ")";
      continue;
    }
    EXPECT_NE(o.message.find(name + "="), std::string::npos) << o.message;
    EXPECT_NE(o.message.find("expected"), std::string::npos) << o.message;
    EXPECT_LT(o.seconds, 5.0) << name << "=" << value;
  }
  ridge::chaos::record("settings",
                       name + " set to " + std::to_string(tried.size()) + " garbage values (" +
                           ridge::settingAcceptedValues(s) + " accepted)",
                       Outcome::kCleanError, wrong);
}

INSTANTIATE_TEST_SUITE_P(Registry, EverySetting, ::testing::Range<size_t>(0, ridge::allSettings().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return std::string(ridge::allSettings()[info.param].name);
                         });

// The values the issue names, with the message a user sees.
struct Named {
  const char* variable;
  const char* value;
  const char* mustMention;  // part of the accepted values
};

class NamedGarbage : public ::testing::TestWithParam<Named> {};

TEST_P(NamedGarbage, FailsInitWithTheAcceptedValues) {
  const Named& n = GetParam();
  setenv("RIDGE_SOCKET_IFNAME", "lo", 1);
  ScopedSetting g(n.variable, n.value);
  InitOutcome o = initOneRank();
  EXPECT_EQ(o.result, ridgeInvalidArgument) << o.message;
  const std::string shown = std::string(n.variable) + "=" + n.value;
  EXPECT_NE(o.message.find(shown), std::string::npos) << o.message;
  EXPECT_NE(o.message.find(n.mustMention), std::string::npos) << o.message;
  ridge::chaos::record("settings", shown, Outcome::kCleanError, o.result == ridgeInvalidArgument ? 0 : 1);
}

INSTANTIATE_TEST_SUITE_P(Issue19, NamedGarbage,
                         ::testing::Values(Named{"RIDGE_TIMEOUT", "0", "from 1 to"},
                                           Named{"RIDGE_TIMEOUT", "-1", "from 1 to"},
                                           Named{"RIDGE_NET", "bogus", "socket, softnic or verbs"},
                                           Named{"RIDGE_CMA", "bogus", "AUTO, 0 or 1"},
                                           Named{"RIDGE_DEBUG", "bogus", "NONE, WARN, INFO or TRACE"}),
                         [](const ::testing::TestParamInfo<Named>& info) {
                           std::string n = std::string(info.param.variable).substr(6) + "_" + info.param.value;
                           for (char& c : n)
                             if (c == '-') c = 'm';
                           return n;
                         });

// Several bad variables at once: one error naming all of them.
TEST(SettingsValidation, EveryBadVariableIsNamed) {
  setenv("RIDGE_SOCKET_IFNAME", "lo", 1);
  ScopedSetting a("RIDGE_SHM_SLOTS", "1");
  ScopedSetting b("RIDGE_SOCKET_CHUNK", "12Q");
  InitOutcome o = initOneRank();
  EXPECT_EQ(o.result, ridgeInvalidArgument);
  EXPECT_NE(o.message.find("RIDGE_SHM_SLOTS=1"), std::string::npos) << o.message;
  EXPECT_NE(o.message.find("RIDGE_SOCKET_CHUNK=12Q"), std::string::npos) << o.message;
  ridge::chaos::record("settings", "two bad variables at once", Outcome::kCleanError, 0);
}

// A misspelled variable is not a setting: init goes on (the value is not used), but says so
// once, with the setting it is closest to.
TEST(SettingsValidation, MisspelledVariablesAreNamed) {
  setenv("RIDGE_SOCKET_IFNAME", "lo", 1);
  ScopedSetting typo("RIDGE_TIMOUT", "0");
  ScopedSetting far("RIDGE_FROBNICATE", "1");
  ScopedSetting test("RIDGE_TEST_SOMETHING", "1");
  std::string closest, farClosest;
  bool sawTypo = false, sawFar = false, sawTest = false;
  for (const auto& [name, near] : ridge::unknownSettingNames()) {
    if (name == "RIDGE_TIMOUT") sawTypo = true, closest = near;
    if (name == "RIDGE_FROBNICATE") sawFar = true, farClosest = near;
    if (name == "RIDGE_TEST_SOMETHING") sawTest = true;
  }
  EXPECT_TRUE(sawTypo);
  EXPECT_EQ(closest, "RIDGE_TIMEOUT");
  EXPECT_TRUE(sawFar);
  EXPECT_EQ(farClosest, "");
  EXPECT_FALSE(sawTest);
  InitOutcome o = initOneRank();
  EXPECT_EQ(o.result, ridgeSuccess) << o.message;
  ridge::chaos::record("settings", "RIDGE_TIMOUT=0 (a misspelled variable): warned, with RIDGE_TIMEOUT suggested",
                       Outcome::kRanCorrectly, (sawTypo && closest == "RIDGE_TIMEOUT") ? 0 : 1);
}

}  // namespace
