// ridge-topo: looks at the machine (or a file describing one) the way Ridge does, and lists
// Ridge's settings.
//
//   ridge-topo summary [--xml FILE]    packages, NUMA nodes, cores, GPUs, NICs
//   ridge-topo settings [--markdown]   every RIDGE_* variable (the table in docs/settings.md)
//   ridge-topo help [SUBCOMMAND]
//
// Each subcommand is one row of kCommands: a name, a synopsis, a paragraph of help and a
// handler that receives the remaining arguments through ArgList. Adding one (matrix, tree,
// gdr, plan, simulate, draw) means writing its handler and adding its row. Exit status: 0
// success, 1 the command failed, 2 bad usage.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/settings.h"
#include "topo/summary.h"

namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

// The arguments after the subcommand. Handlers take the options they know; finish() then
// rejects whatever is left, so every subcommand reports unknown options the same way.
class ArgList {
 public:
  ArgList(const char* command, std::vector<std::string> args)
      : command_(command), args_(std::move(args)), used_(args_.size(), false) {}

  // True when `name` is present (and consumes it).
  bool flag(const char* name) {
    bool found = false;
    for (size_t i = 0; i < args_.size(); ++i) {
      if (!used_[i] && args_[i] == name) used_[i] = found = true;
    }
    return found;
  }

  // "--name VALUE" or "--name=VALUE"; false when absent. A missing value is a usage error.
  bool option(const char* name, std::string* value) {
    const size_t len = std::strlen(name);
    for (size_t i = 0; i < args_.size(); ++i) {
      if (used_[i]) continue;
      if (args_[i] == name) {
        used_[i] = true;
        if (i + 1 >= args_.size() || used_[i + 1]) {
          error_ = std::string(name) + " needs a value";
          return false;
        }
        used_[i + 1] = true;
        *value = args_[i + 1];
        return true;
      }
      if (args_[i].compare(0, len, name) == 0 && args_[i].size() > len && args_[i][len] == '=') {
        used_[i] = true;
        *value = args_[i].substr(len + 1);
        return true;
      }
    }
    return false;
  }

  // Positional (non-option) arguments not consumed yet, in order; consumes them.
  std::vector<std::string> positionals() {
    std::vector<std::string> out;
    for (size_t i = 0; i < args_.size(); ++i) {
      if (!used_[i] && (args_[i].empty() || args_[i][0] != '-')) {
        used_[i] = true;
        out.push_back(args_[i]);
      }
    }
    return out;
  }

  // False (after printing why) when an option was malformed or an argument is left over.
  bool finish() {
    for (size_t i = 0; i < args_.size() && error_.empty(); ++i) {
      if (!used_[i]) error_ = "unexpected argument '" + args_[i] + "'";
    }
    if (error_.empty()) return true;
    std::fprintf(stderr, "ridge-topo %s: %s (see 'ridge-topo help %s')\n", command_, error_.c_str(),
                 command_);
    return false;
  }

 private:
  const char* command_;
  std::vector<std::string> args_;
  std::vector<bool> used_;
  std::string error_;
};

struct Command {
  const char* name;
  const char* synopsis;
  const char* help;
  int (*run)(ArgList& args);
};

int runSummary(ArgList& args);
int runSettings(ArgList& args);
int runHelp(ArgList& args);

const Command kCommands[] = {
    {"summary", "summary [--xml FILE] [--compact]",
     "Counts packages, NUMA nodes, cores, hardware threads (PUs), GPUs and NICs, and lists\n"
     "the GPUs and NICs with their PCI address and link. Without --xml it describes this\n"
     "machine (hwloc when built in, else /proc and /sys). --xml reads an hwloc XML file\n"
     "(lstopo --of xml) or an NCCL topology file (NCCL_TOPO_FILE format). --compact prints\n"
     "the one-line form that ranks exchange at bootstrap.",
     runSummary},
    {"settings", "settings [--markdown]",
     "Lists every RIDGE_* environment variable with its type, default, current value and\n"
     "description. --markdown prints the page kept as docs/settings.md instead.",
     runSettings},
    {"help", "help [SUBCOMMAND]", "Shows this text, or the help of one subcommand.", runHelp},
};

const Command* findCommand(const std::string& name) {
  for (const Command& c : kCommands) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

void printUsage(FILE* f) {
  std::fprintf(f, "usage: ridge-topo SUBCOMMAND [OPTIONS]\n\nsubcommands:\n");
  for (const Command& c : kCommands) std::fprintf(f, "  %s\n", c.synopsis);
  std::fprintf(f, "\n'ridge-topo help SUBCOMMAND' describes one of them.\n");
}

// ---- summary ------------------------------------------------------------------------------

int runSummary(ArgList& args) {
  std::string xml;
  bool haveXml = args.option("--xml", &xml);
  bool compact = args.flag("--compact");
  if (!args.finish()) return kExitUsage;
  ridge::HostSummary s;
  ridge::Status st = haveXml ? ridge::summarizeHwlocXml(xml, &s) : ridge::summarizeThisHost(&s);
  if (!st.isOk()) {
    std::fprintf(stderr, "ridge-topo summary: %s\n", st.message().c_str());
    return kExitFailed;
  }
  std::printf("%s\n", (compact ? ridge::summaryToCompactString(s) : ridge::formatSummary(s)).c_str());
  return kExitOk;
}

// ---- settings -----------------------------------------------------------------------------

std::string markdownCell(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '|')
      out += "\\|";
    else if (c == '\n')
      out += ' ';
    else
      out += c;
  }
  return out;
}

void printSettingsMarkdown() {
  std::printf(
      "# Ridge settings\n\n"
      "Ridge is configured through the `RIDGE_*` environment variables below, read when a\n"
      "communicator is created. Sizes take 1024-based `K`, `M` and `G` suffixes; a malformed\n"
      "number falls back to the default with a warning. `RIDGE_DEBUG=INFO` prints every value\n"
      "and where it came from. This page is generated from `src/core/settings.def` by\n"
      "`ridge-topo settings --markdown`; a test fails when the two differ.\n\n"
      "| Variable | Type | Default | Description |\n"
      "| --- | --- | --- | --- |\n");
  for (const ridge::SettingInfo& s : ridge::allSettings()) {
    std::string def = "(empty)";
    if (*s.defaultValue) {
      def = "`";
      def += markdownCell(s.defaultValue);
      def += '`';
    }
    std::printf("| `RIDGE_%s` | %s | %s | %s |\n", s.name, s.type, def.c_str(), markdownCell(s.doc).c_str());
  }
}

// Wraps `text` at about `width` columns, each line indented by `indent` spaces.
void printWrapped(const std::string& text, size_t indent, size_t width) {
  size_t col = 0;
  size_t p = 0;
  while (p < text.size()) {
    size_t e = text.find(' ', p);
    if (e == std::string::npos) e = text.size();
    std::string word = text.substr(p, e - p);
    p = e + 1;
    if (col > 0 && col + 1 + word.size() > width) {
      std::printf("\n");
      col = 0;
    }
    if (col == 0) {
      std::printf("%*s%s", static_cast<int>(indent), "", word.c_str());
      col = indent + word.size();
    } else {
      std::printf(" %s", word.c_str());
      col += 1 + word.size();
    }
  }
  std::printf("\n");
}

void printSettingsText() {
  for (size_t i = 0; i < ridge::allSettings().size(); ++i) {
    const auto setting = static_cast<ridge::Setting>(i);
    const ridge::SettingInfo& s = ridge::allSettings()[i];
    bool set = ridge::settingIsSet(setting);
    std::string value = ridge::settingString(setting);
    std::printf("RIDGE_%s (%s)\n", s.name, s.type);
    std::printf("    default: \"%s\"   current: \"%s\" (%s)\n", s.defaultValue, value.c_str(),
                set ? "from the environment" : "default");
    printWrapped(s.doc, 4, 88);
  }
}

int runSettings(ArgList& args) {
  bool markdown = args.flag("--markdown");
  if (!args.finish()) return kExitUsage;
  if (markdown)
    printSettingsMarkdown();
  else
    printSettingsText();
  return kExitOk;
}

// ---- help ---------------------------------------------------------------------------------

int runHelp(ArgList& args) {
  std::vector<std::string> topics = args.positionals();
  if (!args.finish()) return kExitUsage;
  if (topics.empty()) {
    printUsage(stdout);
    return kExitOk;
  }
  int rc = kExitOk;
  for (const std::string& t : topics) {
    const Command* c = findCommand(t);
    if (!c) {
      std::fprintf(stderr, "ridge-topo help: no subcommand '%s'\n", t.c_str());
      rc = kExitUsage;
      continue;
    }
    std::printf("usage: ridge-topo %s\n\n%s\n", c->synopsis, c->help);
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    printUsage(stderr);
    return kExitUsage;
  }
  std::string name = argv[1];
  if (name == "-h" || name == "--help") name = "help";
  const Command* c = findCommand(name);
  if (!c) {
    std::fprintf(stderr, "ridge-topo: unknown subcommand '%s'\n\n", argv[1]);
    printUsage(stderr);
    return kExitUsage;
  }
  ArgList args(c->name, std::vector<std::string>(argv + 2, argv + argc));
  return c->run(args);
}
