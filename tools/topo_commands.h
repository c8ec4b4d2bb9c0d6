// Subcommands of ridge-topo that live in their own files. ridge-topo.cpp parses the common
// options (which machine: this one, --input FILE or --preset NAME; output format), loads
// the node topology and hands it over with the remaining arguments.
#pragma once

#include <string>
#include <vector>

#include "topo/model.h"

namespace ridge::tools {

/// Output format chosen by the common options.
enum class OutputFormat { Text, Json, Dot, Svg, Png };

struct CommonOptions {
  OutputFormat format = OutputFormat::Text;
  std::string outputPath;  ///< --svg/--png/--dot FILE; "" = stdout where that makes sense
  bool color = false;      ///< text output to a terminal
};

/// `ridge-topo plan -n RANKS [--nodes N] [--network SPEC] [--collective C] ...`: builds the
/// plan for `node` and prints it. `args` are the arguments after the subcommand. Returns the
/// process exit code (0 ok, 1 runtime error, 2 usage error).
int runPlanCommand(const topo::Topology& node, const CommonOptions& common,
                   const std::vector<std::string>& args);

/// `ridge-topo simulate ...`: predicts time, algbw and busbw per collective and size.
int runSimulateCommand(const topo::Topology& node, const CommonOptions& common,
                       const std::vector<std::string>& args);

}  // namespace ridge::tools
