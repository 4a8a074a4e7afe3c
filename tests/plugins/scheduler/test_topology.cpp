// topology.conf and topology.yaml (tree and block), minipods, the state
// file, and every malformed input with its file and line.
#include <doctest/doctest.h>

#include "topology.hpp"

#include <functional>

using namespace ballast::sched;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "no error";
}

const char* kTree =
    "# a three-level tree: core -> 2 spines -> 4 leaves\n"
    "SwitchName=core Switches=spine[1-2]\n"
    "SwitchName=spine1 Switches=leaf[1-2]\n"
    "SwitchName=spine2 Switches=leaf[3-4] LinkSpeed=100\n"
    "switchname=leaf1 nodes=gpu[001-004]   # keys are case-insensitive\n"
    "SwitchName=leaf2 Nodes=gpu[005-008]\n"
    "SwitchName=leaf3 Nodes=gpu[009-012]\n"
    "SwitchName=leaf4 Nodes=gpu[013-015,120]\n";

}  // namespace

TEST_CASE("topology.conf tree: minipods are the subtrees under the top switch's children") {
  Topology t = parse_topology_conf(kTree, "topo.conf");
  CHECK(t.kind == "tree");
  REQUIRE(t.nodes.size() == 16);
  CHECK(t.minipods == std::vector<std::string>{"spine1", "spine2"});
  CHECK(t.leaves.size() == 4);
  CHECK(t.minipods[t.node_minipod[t.find("gpu003")]] == "spine1");
  CHECK(t.minipods[t.node_minipod[t.find("gpu120")]] == "spine2");
  CHECK(t.leaves[t.node_leaf[t.find("gpu006")]] == "leaf2");
}

TEST_CASE("the minipod level is configurable") {
  TopologyOptions o;
  o.minipod_level = 2;
  Topology t = parse_topology_conf(kTree, "topo.conf", o);
  CHECK(t.minipods.size() == 4);
  o.minipod_level = 0;
  CHECK(parse_topology_conf(kTree, "topo.conf", o).minipods == std::vector<std::string>{"core"});
}

TEST_CASE("topology.conf block: base blocks are the minipods") {
  Topology t = parse_topology_conf(
      "BlockName=b1 Nodes=n[01-04]\nBlockName=b2 Nodes=n[05-08]\nBlockName=b3 Nodes=n[09-10]\nBlockSizes=4,8\n",
      "block.conf");
  CHECK(t.kind == "block");
  CHECK(t.minipods == std::vector<std::string>{"b1", "b2", "b3"});
  CHECK(t.node_minipod[t.find("n09")] == 2);
}

TEST_CASE("topology.conf errors name the file and line") {
  auto conf = [](const std::string& text) { return error_of([&] { parse_topology_conf(text, "t.conf"); }); };
  CHECK(conf("SwitchName=s0 Nodes=a[1-2]\nSwitchName=s1 Nodes=gpu[001-\n") ==
        "t.conf:2: unclosed '[' in hostlist \"gpu[001-\"");
  CHECK(conf("SwitchName=top Switches=s[1-3]\nSwitchName=s1 Nodes=a1\nSwitchName=s2 Nodes=a2\n") ==
        "t.conf:1: switch top lists unknown switch s3");
  CHECK(conf("SwitchName=a Switches=b Nodes=x1\nSwitchName=b Switches=a\n").find("t.conf:1: cycle") == 0);
  CHECK(conf("SwitchName=a Switches=a Nodes=x\n") == "t.conf:1: switch a lists itself (cycle)");
  CHECK(conf("SwitchName=l1 Nodes=n[1-3]\nSwitchName=l2 Nodes=n[3-4]\n") ==
        "t.conf:2: node n3 is already in l1 (line 1); a node belongs to one leaf");
  CHECK(conf("SwitchName=t Switches=l\nSwitchName=u Switches=l\nSwitchName=l Nodes=n1\n") ==
        "t.conf:2: switch l already has parent t (line 1)");
  CHECK(conf("SwitchName=s Nodes=n1\nSwitchName=s Nodes=n2\n") ==
        "t.conf:2: switch s declared twice (first on line 1)");
  CHECK(conf("\n\nSwitchName=s Nodes=n1 Speed=3\n") == "t.conf:3: unknown key speed for SwitchName");
  CHECK(conf("SwitchName=s Nodes\n") == "t.conf:1: expected Key=Value, got \"Nodes\"");
  CHECK(conf("NodeName=x\n") == "t.conf:1: unknown entry nodename (want SwitchName, BlockName or BlockSizes)");
  CHECK(conf("RingName=r Nodes=n[1-4]\n") == "t.conf:1: ring topologies are not supported (tree or block only)");
  CHECK(conf("# nothing\n") == "t.conf:1: no SwitchName or BlockName entry");
  CHECK(conf("BlockName=b Nodes=n[1-4]\nBlockSizes=4,12\n") ==
        "t.conf:2: block size 12 is not a power-of-two multiple of 4");
  CHECK(conf("BlockName=b Nodes=n[1-5]\nBlockSizes=4\n") ==
        "t.conf:1: block b has 5 nodes, more than the base block size 4");
  CHECK(conf("BlockSizes=4,x\n") == "t.conf:1: bad block size \"x\" (want positive integers, comma-separated)");
  CHECK(conf("SwitchName=s Nodes=n1\nBlockName=b Nodes=n2\n") ==
        "t.conf:2: a file mixes SwitchName and BlockName entries");
}

TEST_CASE("topology.yaml tree and block") {
  const char* y =
      "- topology: blocks\n"
      "  block:\n"
      "    block_sizes: [2, 4]\n"
      "    blocks:\n"
      "      - block: b1\n"
      "        nodes: n[1-2]\n"
      "      - block: b2\n"
      "        nodes: n[3-4]\n"
      "- topology: fabric\n"
      "  cluster_default: true\n"
      "  tree:\n"
      "    switches:\n"
      "      - switch: top\n"
      "        children: sp[1-2]\n"
      "      - switch: sp1\n"
      "        children: lf1\n"
      "      - switch: sp2\n"
      "        children: lf2\n"
      "      - switch: lf1\n"
      "        nodes: gpu[01-04]\n"
      "      - switch: lf2\n"
      "        nodes: [gpu05, \"gpu[06-08]\"]\n";
  Topology t = parse_topology_yaml(y, "topo.yaml");
  CHECK(t.kind == "tree");
  CHECK(t.nodes.size() == 8);
  CHECK(t.minipods == std::vector<std::string>{"sp1", "sp2"});
  TopologyOptions o;
  o.name = "blocks";
  Topology b = parse_topology_yaml(y, "topo.yaml", o);
  CHECK(b.kind == "block");
  CHECK(b.minipods.size() == 2);
}

TEST_CASE("topology.yaml errors name the file and line") {
  auto yaml = [](const std::string& text) { return error_of([&] { parse_topology_yaml(text, "t.yaml"); }); };
  CHECK(yaml("- topology: a\n  tree:\n    switches:\n      - switch: s\n        nodes: n[1-\n") ==
        "t.yaml:5: unclosed '[' in hostlist \"n[1-\"");
  CHECK(yaml("- topology: a\n  tree:\n    switches:\n      - switch: s\n        bogus: 1\n") ==
        "t.yaml:5: unknown key \"bogus\"");
  CHECK(yaml("- topology: a\n  tree:\n    switches:\n      - switch: s\n        children: x\n") ==
        "t.yaml:4: switch s lists unknown switch x");
  CHECK(yaml("- topology: a\n  tree: {switches: [{switch: s, nodes: n1}]\n").find("t.yaml:3: YAML syntax") == 0);
  CHECK(yaml("- topology: a\n  flat: true\n") == "t.yaml:1: a flat topology has no minipods to place by");
  CHECK(yaml("- topology: a\n  tree: {}\n  block: {}\n") ==
        "t.yaml:1: topology a needs exactly one of tree, block, flat");
  CHECK(yaml("topology: a\n") == "t.yaml:1: expected a list of topologies (\"- topology: NAME\")");
  CHECK(yaml("- topology: a\n  block:\n    blocks:\n      - block: b\n") == "t.yaml:4: missing key \"nodes\"");
}

TEST_CASE("state file: busy and faulty hostlists, everything else free") {
  Topology t = parse_topology_conf(kTree, "topo.conf");
  auto st = parse_state(t, R"({"busy": ["gpu[001-003]"], "faulty": ["gpu003", "gpu120"]})", "s.json");
  CHECK(st[t.find("gpu001")] == kBusy);
  CHECK(st[t.find("gpu003")] == kFaulty);
  CHECK(st[t.find("gpu120")] == kFaulty);
  CHECK(st[t.find("gpu004")] == kFree);
  auto state = [&](const std::string& j) { return error_of([&] { parse_state(t, j, "s.json"); }); };
  CHECK(state("{\"busy\": [\n \"gpu001\",\n ]}") == "s.json: line 3, column 2: malformed JSON");
  CHECK(state(R"({"busy": ["gpu999"]})") == "s.json: busy[0]: node gpu999 is not in topo.conf");
  CHECK(state(R"({"busy": ["gpu[1-"]})") == "s.json: busy[0]: unclosed '[' in hostlist \"gpu[1-\"");
  CHECK(state(R"({"idle": []})") == "s.json: unknown field \"idle\" (want busy, faulty)");
  CHECK(state(R"({"faulty": "gpu001"})") == "s.json: field \"faulty\" must be a list of hostlist strings");
  CHECK(state(R"({"busy": [1]})") == "s.json: busy[0] is not a string");
}

TEST_CASE("load_topology picks the parser by extension and names unreadable files") {
  std::string dir = BALLAST_SOURCE_DIR "/tests/plugins/scheduler/data/";
  CHECK(load_topology(dir + "tree.conf").nodes.size() == 36);
  CHECK(load_topology(dir + "tree.yaml").nodes.size() == 36);
  CHECK(error_of([&] { load_topology(dir + "missing.conf"); }) == dir + "missing.conf: cannot open");
}
