// Plans as JSON, replacement of failed nodes in a placed job, and standby
// sizing from a fault trace.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "placement.hpp"

namespace ballast::sched {

// The JSON object `ballast plan --json` prints (and --replace reads).
nlohmann::json plan_to_json(const Plan& p, const Topology& topo, const Job& job);

// A plan read back: its job, shape and nodes (ids in `topo`), in rank order.
struct LoadedPlan {
  Job job;
  std::string topology;  // path recorded in the plan ("" if none)
  std::string algorithm;
  std::vector<std::string> names;  // node names in rank order
};
// Throws InputError naming `source` and the field on malformed plans.
LoadedPlan parse_plan(const std::string& json_text, const std::string& source);

struct Replacement {
  int cell;  // global-rank-order index of the node that changed
  std::string failed, spare;
};
struct ReplaceResult {
  Plan plan;  // the new plan (algorithm "replace")
  std::vector<Replacement> replaced;
};

// Replace the failed nodes of a placed job by spares, changing only the
// failed nodes' cells (their ranks move to the spare; no other rank moves)
// and choosing for each the spare's minipod that keeps the weighted max
// spread lowest. spares empty: every free node of `state` outside the plan.
// Throws InputError when a failed node is not in the plan, a spare is not
// in the topology or is in the plan, or there are too few spares.
ReplaceResult replace_nodes(const Topology& topo, const std::vector<NodeState>& state, const LoadedPlan& plan,
                            const std::vector<std::string>& failed, const std::vector<std::string>& spares);

struct StandbyResult {
  int spares = 0;        // recommended standby nodes for the job
  int fleet = 0;         // nodes in the traced fleet
  int traced_nodes = 0;  // distinct nodes with faults in the trace
  double days = 0;       // span of the trace
  double mean_down = 0;  // time-averaged fleet nodes affected at once
  int max_down = 0;      // most fleet nodes affected at once
  double expected = 0;   // mean affected nodes of the job
};
// From a fault trace (a JSON list of {node_id, event_time (days),
// event_type fault_start|fault_end}, the InfiniteHBD format), how many of
// `nodes` nodes are down at once (or fail within `window_hours`) at the
// given percentile of time: the fleet's affected fraction over time, then a
// binomial draw of the job's nodes. Throws InputError on malformed traces.
StandbyResult standby_size(const std::string& trace_json, const std::string& source, int nodes, double percentile,
                           double window_hours, int fleet);

}  // namespace ballast::sched
