// Plans as text, JSON (RIDGE_PLAN_DUMP, ridge-topo plan --json) and Graphviz dot, and the
// plan file a user may force with RIDGE_PLAN_FILE (docs/planner.md, "Plan files").
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/json.h"
#include "core/status.h"
#include "plan/cost.h"
#include "plan/plan.h"

namespace ridge::plan {

struct PrintOptions {
  bool full = false;        ///< every rank of every channel, every hop's links
  int maxListedRanks = 64;  ///< without `full`, longer rank lists are cut with "..."
};

std::string planText(const Plan& plan, const PrintOptions& opt);
/// `algorithms` (may be empty): the estimates to list under "algorithms".
json::Value planJson(const Plan& plan, const std::vector<Estimate>& algorithms, const PrintOptions& opt);
/// Ranks of the first `maxNodes` nodes, an edge per ring hop coloured by channel and labelled
/// with its transport.
std::string planDot(const Plan& plan, int maxNodes);

/// Shared by planJson (plan_io.cpp, libridge) and the printers planText and planDot
/// (plan_print.cpp, ridge_tooling: ridge-topo only). The name of NIC slot `slot` ("-" for
/// none), and the GPU-NIC pairs the plan sends through, in first-use order.
std::string nicName(const NodeTemplate& t, int slot);
std::vector<std::pair<int, int>> sendPairs(const Plan& p);

/// What a plan file may force on a communicator.
struct ForcedPlan {
  std::vector<std::vector<int>> rings;  ///< ring orders (each a permutation of the ranks)
  std::string algoRules;                ///< RIDGE_ALGO syntax, applied before RIDGE_ALGO itself
};

/// The plan as JSON text, the one writer of both ridge-topo plan --json and a communicator's
/// RIDGE_PLAN_DUMP: the same plan gives the same bytes (no times in it).
std::string planJsonText(const Plan& plan, const PrintOptions& opt = {});

/// What a communicator runs of a plan it built (the "runs" entry of the JSON).
constexpr const char* kPlanRunsText =
    "a device communicator's ring, chain and tree algorithms (the staged and device-network paths) "
    "follow ring channel 0; P2P and LL are all-pairs; the other channels and trees are planned, not "
    "run in parallel yet";

/// What plan files carry in "format" and "version"; files without both are refused.
constexpr const char* kPlanFormat = "ridge-plan";
constexpr int kPlanVersion = 1;

/// Reads a plan file (a dump, or hand-written: {"format": "ridge-plan", "version": 1,
/// "nranks": 4, "channels": [{"kind": "ring", "ranks": [0, 2, 1, 3]}], "algoRules":
/// "allreduce:0-64K:allpairs"}) and checks it against `nranks`: the format and version, at
/// least one ring channel, every ring listing each rank exactly once, well-formed algoRules.
/// A bad file is ridgeInvalidArgument naming the file, the place in it and the problem.
Status readPlanFile(const std::string& path, int nranks, ForcedPlan* out);
Status parsePlanJson(const json::Value& doc, const std::string& what, int nranks, ForcedPlan* out);

/// Writes `text` to `path` (replacing it).
Status writeTextFile(const std::string& path, const std::string& text);

}  // namespace ridge::plan
