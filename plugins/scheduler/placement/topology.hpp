// The cluster as the scheduler sees it: nodes, leaf switches (or blocks),
// minipods, and which nodes are free. Read from Slurm's topology.conf or
// topology.yaml (tree or block) and from a JSON state file.
#pragma once
#include <string>
#include <unordered_map>
#include <vector>

#include "hostlist.hpp"

namespace ballast::sched {

struct Topology {
  std::string source;              // file it came from
  std::string kind;                // "tree" or "block"
  std::vector<std::string> nodes;  // node id -> name, in file order
  std::unordered_map<std::string, int> node_id;
  std::vector<int> node_leaf;         // node id -> leaf switch / base block
  std::vector<int> node_minipod;      // node id -> minipod
  std::vector<std::string> leaves;    // leaf id -> switch or block name
  std::vector<int> leaf_minipod;      // leaf id -> minipod
  std::vector<std::string> minipods;  // minipod id -> name of its top switch or block

  int find(const std::string& name) const {
    auto it = node_id.find(name);
    return it == node_id.end() ? -1 : it->second;
  }
};

struct TopologyOptions {
  int minipod_level = 1;  // tree: depth below the top switch whose subtrees are minipods
  std::string name;       // topology.yaml: which topology (default: cluster_default, else first)
};

// Parse topology.conf text (`source` names it in errors). Throws InputError
// "SOURCE:LINE: message" on malformed lines, bad hostlists, unknown
// switches, cycles, a switch with two parents, a node in two leaves.
Topology parse_topology_conf(const std::string& text, const std::string& source, const TopologyOptions& opt = {});
// Same for topology.yaml; throws InputError also when built without libyaml.
Topology parse_topology_yaml(const std::string& text, const std::string& source, const TopologyOptions& opt = {});
// Read a file and pick the parser by extension (.yaml/.yml) or content.
Topology load_topology(const std::string& path, const TopologyOptions& opt = {});

// Node availability: 0 free, 1 busy, 2 faulty.
enum NodeState : unsigned char { kFree = 0, kBusy = 1, kFaulty = 2 };

// Parse {"busy": [hostlists], "faulty": [hostlists]} (both optional); every
// other node is free. Unknown node names and malformed JSON throw InputError
// naming the source, line and field.
std::vector<NodeState> parse_state(const Topology& topo, const std::string& json_text, const std::string& source);
std::vector<NodeState> load_state(const Topology& topo, const std::string& path);

// Whole file as a string; InputError naming the path when it cannot be read.
std::string read_file(const std::string& path);
// "line L, column C" for a byte offset of text (for JSON parse errors).
std::string line_col(const std::string& text, size_t byte);

}  // namespace ballast::sched
