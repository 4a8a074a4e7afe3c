#include "topology.hpp"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#ifdef BALLAST_SCHED_HAVE_YAML
#include <yaml.h>
#endif

namespace ballast::sched {
namespace {

[[noreturn]] void fail(const std::string& source, int line, const std::string& msg) {
  throw InputError(source + ":" + std::to_string(line) + ": " + msg);
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Expand a hostlist, turning a syntax error into "SOURCE:LINE: ...".
std::vector<std::string> expand_at(const std::string& expr, const std::string& source, int line, size_t* budget) {
  try {
    return expand_hostlist(expr, budget);
  } catch (const InputError& e) {
    fail(source, line, e.what());
  }
}

// What both file formats declare, before the checks that make it a Topology.
struct SwitchDecl {
  std::string name;
  int line;
  std::vector<std::string> children, nodes;
};
struct BlockDecl {
  std::string name;
  int line;
  std::vector<std::string> nodes;
};

void add_node(Topology& t, const std::string& name, int leaf, const std::string& source, int line,
              std::vector<int>& node_line) {
  auto [it, inserted] = t.node_id.emplace(name, static_cast<int>(t.nodes.size()));
  if (!inserted) {
    int id = it->second;
    fail(source, line,
         "node " + name + " is already in " + t.leaves[t.node_leaf[id]] + " (line " + std::to_string(node_line[id]) +
             "); a node belongs to one leaf");
  }
  t.nodes.push_back(name);
  t.node_leaf.push_back(leaf);
  node_line.push_back(line);
}

Topology build_tree(const std::vector<SwitchDecl>& sw, const std::string& source, const TopologyOptions& opt) {
  if (sw.empty()) fail(source, 1, "no switches declared");
  if (opt.minipod_level < 0) throw InputError("minipod level must be >= 0");
  std::map<std::string, int> id;
  for (size_t i = 0; i < sw.size(); ++i) {
    if (!id.emplace(sw[i].name, static_cast<int>(i)).second)
      fail(source, sw[i].line,
           "switch " + sw[i].name + " declared twice (first on line " + std::to_string(sw[id[sw[i].name]].line) + ")");
  }
  std::vector<int> parent(sw.size(), -1);
  for (size_t i = 0; i < sw.size(); ++i) {
    for (const auto& c : sw[i].children) {
      auto it = id.find(c);
      if (it == id.end()) fail(source, sw[i].line, "switch " + sw[i].name + " lists unknown switch " + c);
      if (it->second == static_cast<int>(i)) fail(source, sw[i].line, "switch " + c + " lists itself (cycle)");
      if (parent[it->second] >= 0)
        fail(source, sw[i].line,
             "switch " + c + " already has parent " + sw[parent[it->second]].name + " (line " +
                 std::to_string(sw[parent[it->second]].line) + ")");
      parent[it->second] = static_cast<int>(i);
    }
  }
  // Depth by walking up, each switch once: a walk stops at a switch whose
  // depth is known; meeting a switch of the current walk again is a cycle.
  // Linear in the switch count (a 200,000-switch chain is one walk).
  std::vector<int> depth(sw.size(), -1), walk_of(sw.size(), -1), path;
  for (size_t i = 0; i < sw.size(); ++i) {
    path.clear();
    int s = static_cast<int>(i);
    while (depth[s] < 0 && parent[s] >= 0) {
      if (walk_of[s] == static_cast<int>(i))
        fail(source, sw[i].line, "cycle in the switch hierarchy through switch " + sw[i].name);
      walk_of[s] = static_cast<int>(i);
      path.push_back(s);
      s = parent[s];
    }
    if (depth[s] < 0) depth[s] = 0;  // a root
    for (size_t k = path.size(); k-- > 0;) depth[path[k]] = depth[parent[path[k]]] + 1;
  }
  // Each switch's ancestor at the minipod level, by increasing depth.
  std::vector<int> order(sw.size()), minipod_switch(sw.size());
  for (size_t i = 0; i < sw.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return depth[a] < depth[b]; });
  for (int s : order) minipod_switch[s] = depth[s] <= opt.minipod_level ? s : minipod_switch[parent[s]];
  Topology t;
  t.source = source;
  t.kind = "tree";
  std::map<int, int> minipod_of_switch;  // switch at the minipod level -> minipod id
  std::vector<int> node_line;
  for (size_t i = 0; i < sw.size(); ++i) {
    if (sw[i].nodes.empty()) continue;
    const int s = minipod_switch[i];
    auto [it, inserted] = minipod_of_switch.emplace(s, static_cast<int>(t.minipods.size()));
    if (inserted) t.minipods.push_back(sw[s].name);
    int leaf = static_cast<int>(t.leaves.size());
    t.leaves.push_back(sw[i].name);
    t.leaf_minipod.push_back(it->second);
    for (const auto& n : sw[i].nodes) add_node(t, n, leaf, source, sw[i].line, node_line);
  }
  if (t.nodes.empty()) fail(source, sw[0].line, "no switch lists any node");
  for (int leaf : t.node_leaf) t.node_minipod.push_back(t.leaf_minipod[leaf]);
  return t;
}

Topology build_block(const std::vector<BlockDecl>& bl, const std::vector<int>& sizes, int sizes_line,
                     const std::string& source) {
  if (bl.empty()) fail(source, 1, "no blocks declared");
  for (size_t i = 1; i < sizes.size(); ++i) {
    int r = sizes[i - 1] > 0 ? sizes[i] / sizes[i - 1] : 0;
    if (sizes[i] % std::max(1, sizes[i - 1]) != 0 || r < 2 || (r & (r - 1)) != 0)
      fail(source, sizes_line,
           "block size " + std::to_string(sizes[i]) + " is not a power-of-two multiple of " +
               std::to_string(sizes[i - 1]));
  }
  Topology t;
  t.source = source;
  t.kind = "block";
  std::map<std::string, int> seen;
  std::vector<int> node_line;
  for (const auto& b : bl) {
    if (!seen.emplace(b.name, b.line).second)
      fail(source, b.line, "block " + b.name + " declared twice (first on line " + std::to_string(seen[b.name]) + ")");
    if (!sizes.empty() && static_cast<int>(b.nodes.size()) > sizes[0])
      fail(source, b.line,
           "block " + b.name + " has " + std::to_string(b.nodes.size()) + " nodes, more than the base block size " +
               std::to_string(sizes[0]));
    int leaf = static_cast<int>(t.leaves.size());
    t.leaves.push_back(b.name);
    t.leaf_minipod.push_back(leaf);
    t.minipods.push_back(b.name);
    for (const auto& n : b.nodes) add_node(t, n, leaf, source, b.line, node_line);
  }
  for (int leaf : t.node_leaf) t.node_minipod.push_back(t.leaf_minipod[leaf]);
  return t;
}

std::vector<int> parse_sizes(const std::string& v, const std::string& source, int line) {
  std::vector<int> out;
  std::stringstream ss(v);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty() || item.size() > 9 || !std::all_of(item.begin(), item.end(), ::isdigit) || std::stoi(item) == 0)
      fail(source, line, "bad block size \"" + item + "\" (want positive integers, comma-separated)");
    out.push_back(std::stoi(item));
  }
  if (out.empty()) fail(source, line, "BlockSizes is empty");
  return out;
}

}  // namespace

Topology parse_topology_conf(const std::string& text, const std::string& source, const TopologyOptions& opt) {
  std::vector<SwitchDecl> sw;
  std::vector<BlockDecl> bl;
  std::vector<int> sizes;
  int sizes_line = 0;
  size_t budget = kMaxHostlistNames;  // for the whole file
  std::istringstream in(text);
  std::string raw;
  int line = 0;
  while (std::getline(in, raw)) {
    ++line;
    auto hash = raw.find('#');
    if (hash != std::string::npos) raw.resize(hash);
    std::istringstream ls(raw);
    std::string tok;
    std::map<std::string, std::string> kv;
    std::string first;
    while (ls >> tok) {
      auto eq = tok.find('=');
      if (eq == std::string::npos || eq == 0) fail(source, line, "expected Key=Value, got \"" + tok + "\"");
      std::string key = lower(tok.substr(0, eq));
      if (first.empty()) first = key;
      if (!kv.emplace(key, tok.substr(eq + 1)).second) fail(source, line, "key " + tok.substr(0, eq) + " given twice");
    }
    if (kv.empty()) continue;
    if (first == "switchname") {
      SwitchDecl d{kv["switchname"], line, {}, {}};
      if (d.name.empty()) fail(source, line, "SwitchName is empty");
      for (auto& [k, v] : kv) {
        if (k == "switches")
          d.children = expand_at(v, source, line, &budget);
        else if (k == "nodes")
          d.nodes = expand_at(v, source, line, &budget);
        else if (k != "switchname" && k != "linkspeed")
          fail(source, line, "unknown key " + k + " for SwitchName");
      }
      sw.push_back(std::move(d));
    } else if (first == "blockname") {
      BlockDecl d{kv["blockname"], line, {}};
      if (d.name.empty()) fail(source, line, "BlockName is empty");
      for (auto& [k, v] : kv) {
        if (k == "nodes")
          d.nodes = expand_at(v, source, line, &budget);
        else if (k != "blockname")
          fail(source, line, "unknown key " + k + " for BlockName");
      }
      bl.push_back(std::move(d));
    } else if (first == "blocksizes") {
      if (kv.size() != 1) fail(source, line, "BlockSizes takes no other key");
      sizes = parse_sizes(kv["blocksizes"], source, line);
      sizes_line = line;
    } else if (first == "ringname") {
      fail(source, line, "ring topologies are not supported (tree or block only)");
    } else {
      fail(source, line, "unknown entry " + first + " (want SwitchName, BlockName or BlockSizes)");
    }
  }
  if (!sw.empty() && !bl.empty()) fail(source, bl[0].line, "a file mixes SwitchName and BlockName entries");
  if (!sw.empty()) return build_tree(sw, source, opt);
  if (!bl.empty()) return build_block(bl, sizes, sizes_line, source);
  fail(source, line, "no SwitchName or BlockName entry");
}

#ifdef BALLAST_SCHED_HAVE_YAML
namespace {

// A small YAML document tree with line numbers, from libyaml's events.
struct YNode {
  enum Kind { Scalar, Seq, Map } kind = Scalar;
  std::string value;
  int line = 0;
  std::vector<YNode> items;
  // A map's keys and values, in parallel (a vector of pairs of YNode would
  // need YNode complete here, which clang with libstdc++ 12 refuses).
  std::vector<YNode> keys;
  std::vector<YNode> values;
  const YNode* get(const std::string& key) const {
    for (size_t i = 0; i < keys.size(); ++i)
      if (keys[i].kind == Scalar && keys[i].value == key) return &values[i];
    return nullptr;
  }
};

struct YamlParser {
  yaml_parser_t p;
  const std::string& source;
  YamlParser(const std::string& text, const std::string& src) : source(src) {
    yaml_parser_initialize(&p);
    yaml_parser_set_input_string(&p, reinterpret_cast<const unsigned char*>(text.data()), text.size());
  }
  ~YamlParser() { yaml_parser_delete(&p); }
  YamlParser(const YamlParser&) = delete;
  YamlParser& operator=(const YamlParser&) = delete;

  // Next event; the caller deletes it.
  void next(yaml_event_t& ev) {
    if (!yaml_parser_parse(&p, &ev))
      fail(source, static_cast<int>(p.problem_mark.line) + 1,
           std::string("YAML syntax: ") + (p.problem ? p.problem : "error") +
               (p.context ? std::string(" ") + p.context : ""));
  }
  // Nesting is bounded: the tree is built and destroyed recursively.
  static constexpr int kMaxDepth = 64;
  YNode node(yaml_event_t& ev, int depth) {
    YNode n;
    n.line = static_cast<int>(ev.start_mark.line) + 1;
    if (depth > kMaxDepth) fail(source, n.line, "YAML nested deeper than " + std::to_string(kMaxDepth) + " levels");
    switch (ev.type) {
      case YAML_SCALAR_EVENT:
        n.value.assign(reinterpret_cast<const char*>(ev.data.scalar.value), ev.data.scalar.length);
        return n;
      case YAML_SEQUENCE_START_EVENT:
        n.kind = YNode::Seq;
        for (;;) {
          yaml_event_t e;
          next(e);
          if (e.type == YAML_SEQUENCE_END_EVENT) {
            yaml_event_delete(&e);
            break;
          }
          n.items.push_back(guarded(e, depth + 1));
        }
        return n;
      case YAML_MAPPING_START_EVENT:
        n.kind = YNode::Map;
        for (;;) {
          yaml_event_t e;
          next(e);
          if (e.type == YAML_MAPPING_END_EVENT) {
            yaml_event_delete(&e);
            break;
          }
          YNode k = guarded(e, depth + 1);
          yaml_event_t v;
          next(v);
          YNode value = guarded(v, depth + 1);
          n.keys.push_back(std::move(k));
          n.values.push_back(std::move(value));
        }
        return n;
      case YAML_ALIAS_EVENT:
        fail(source, n.line, "YAML aliases are not supported");
      default:
        fail(source, n.line, "unexpected YAML event");
    }
  }
  YNode guarded(yaml_event_t& ev, int depth) {
    std::unique_ptr<yaml_event_t, void (*)(yaml_event_t*)> hold(&ev, yaml_event_delete);
    return node(ev, depth);
  }
  YNode document() {
    yaml_event_t e;
    for (;;) {
      next(e);
      if (e.type == YAML_STREAM_END_EVENT) {
        yaml_event_delete(&e);
        fail(source, 1, "empty YAML document");
      }
      if (e.type == YAML_STREAM_START_EVENT || e.type == YAML_DOCUMENT_START_EVENT) {
        yaml_event_delete(&e);
        continue;
      }
      return guarded(e, 0);
    }
  }
};

const YNode& need(const YNode& map, const std::string& key, const std::string& source) {
  const YNode* v = map.get(key);
  if (!v) fail(source, map.line, "missing key \"" + key + "\"");
  return *v;
}

// A hostlist given as one string or as a list of strings.
std::vector<std::string> yaml_hostlist(const YNode& n, const std::string& source, size_t* budget) {
  if (n.kind == YNode::Scalar) return expand_at(n.value, source, n.line, budget);
  if (n.kind != YNode::Seq) fail(source, n.line, "expected a hostlist string or a list of them");
  std::vector<std::string> out;
  for (const auto& item : n.items) {
    if (item.kind != YNode::Scalar) fail(source, item.line, "expected a hostlist string");
    for (auto& s : expand_at(item.value, source, item.line, budget)) out.push_back(std::move(s));
  }
  return out;
}

void check_keys(const YNode& map, std::initializer_list<const char*> allowed, const std::string& source) {
  for (const YNode& k : map.keys) {
    bool ok = false;
    for (const char* a : allowed) ok = ok || k.value == a;
    if (!ok) fail(source, k.line, "unknown key \"" + k.value + "\"");
  }
}

}  // namespace

Topology parse_topology_yaml(const std::string& text, const std::string& source, const TopologyOptions& opt) {
  YamlParser yp(text, source);
  YNode root = yp.document();
  size_t budget = kMaxHostlistNames;  // for the whole file
  if (root.kind != YNode::Seq || root.items.empty())
    fail(source, root.line, "expected a list of topologies (\"- topology: NAME\")");
  const YNode* chosen = nullptr;
  for (const auto& item : root.items) {
    if (item.kind != YNode::Map) fail(source, item.line, "each topology must be a mapping");
    check_keys(item, {"topology", "cluster_default", "tree", "block", "flat"}, source);
    const YNode& name = need(item, "topology", source);
    int kinds = (item.get("tree") != nullptr) + (item.get("block") != nullptr) + (item.get("flat") != nullptr);
    if (kinds != 1) fail(source, item.line, "topology " + name.value + " needs exactly one of tree, block, flat");
    if (!opt.name.empty()) {
      if (name.value == opt.name) chosen = &item;
    } else if (!chosen) {
      chosen = &item;
    } else if (const YNode* d = item.get("cluster_default"); d && d->value == "true") {
      chosen = &item;
    }
  }
  if (!chosen) throw InputError(source + ": no topology named " + opt.name);
  if (const YNode* tree = chosen->get("tree")) {
    if (tree->kind != YNode::Map) fail(source, tree->line, "tree must be a mapping with \"switches\"");
    check_keys(*tree, {"switches"}, source);
    const YNode& list = need(*tree, "switches", source);
    if (list.kind != YNode::Seq) fail(source, list.line, "switches must be a list");
    std::vector<SwitchDecl> sw;
    for (const auto& s : list.items) {
      if (s.kind != YNode::Map) fail(source, s.line, "each switch must be a mapping");
      check_keys(s, {"switch", "children", "nodes", "link_speed"}, source);
      const YNode& n = need(s, "switch", source);
      if (n.kind != YNode::Scalar || n.value.empty()) fail(source, n.line, "switch name must be a non-empty string");
      SwitchDecl d{n.value, s.line, {}, {}};
      if (const YNode* c = s.get("children")) d.children = yaml_hostlist(*c, source, &budget);
      if (const YNode* c = s.get("nodes")) d.nodes = yaml_hostlist(*c, source, &budget);
      sw.push_back(std::move(d));
    }
    return build_tree(sw, source, opt);
  }
  if (const YNode* block = chosen->get("block")) {
    if (block->kind != YNode::Map) fail(source, block->line, "block must be a mapping with \"blocks\"");
    check_keys(*block, {"block_sizes", "blocks"}, source);
    std::vector<int> sizes;
    int sizes_line = block->line;
    if (const YNode* bs = block->get("block_sizes")) {
      sizes_line = bs->line;
      if (bs->kind == YNode::Scalar) {
        sizes = parse_sizes(bs->value, source, bs->line);
      } else if (bs->kind == YNode::Seq) {
        std::string joined;
        for (const auto& i : bs->items) joined += (joined.empty() ? "" : ",") + i.value;
        sizes = parse_sizes(joined, source, bs->line);
      } else {
        fail(source, bs->line, "block_sizes must be a list of integers");
      }
    }
    const YNode& list = need(*block, "blocks", source);
    if (list.kind != YNode::Seq) fail(source, list.line, "blocks must be a list");
    std::vector<BlockDecl> bl;
    for (const auto& b : list.items) {
      if (b.kind != YNode::Map) fail(source, b.line, "each block must be a mapping");
      check_keys(b, {"block", "nodes"}, source);
      const YNode& n = need(b, "block", source);
      bl.push_back({n.value, b.line, yaml_hostlist(need(b, "nodes", source), source, &budget)});
    }
    return build_block(bl, sizes, sizes_line, source);
  }
  fail(source, chosen->line, "a flat topology has no minipods to place by");
}
#else
Topology parse_topology_yaml(const std::string&, const std::string& source, const TopologyOptions&) {
  throw InputError(source + ": this build has no YAML support (install libyaml-dev and rebuild)");
}
#endif

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw InputError(path + ": read failed");
  return ss.str();
}

Topology load_topology(const std::string& path, const TopologyOptions& opt) {
  std::string text = read_file(path);
  auto ends = [&](const char* suf) {
    std::string s(suf);
    return path.size() >= s.size() && path.compare(path.size() - s.size(), s.size(), s) == 0;
  };
  if (ends(".yaml") || ends(".yml")) return parse_topology_yaml(text, path, opt);
  return parse_topology_conf(text, path, opt);
}

std::string line_col(const std::string& text, size_t byte) {
  size_t line = 1, col = 1;
  // nlohmann's byte is the 1-based position of the offending character.
  for (size_t i = 0; i + 1 < byte && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return "line " + std::to_string(line) + ", column " + std::to_string(col);
}

std::vector<NodeState> parse_state(const Topology& topo, const std::string& text, const std::string& source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw InputError(source + ": " + line_col(text, e.byte) + ": malformed JSON");
  } catch (const nlohmann::json::out_of_range&) {
    throw InputError(source + ": a number too large for a double");
  }
  if (!j.is_object()) throw InputError(source + ": expected an object {\"busy\": [...], \"faulty\": [...]}");
  std::vector<NodeState> st(topo.nodes.size(), kFree);
  size_t budget = kMaxHostlistNames;  // for the whole file
  for (auto& [key, val] : j.items()) {
    NodeState s;
    if (key == "busy")
      s = kBusy;
    else if (key == "faulty")
      s = kFaulty;
    else
      throw InputError(source + ": unknown field \"" + key + "\" (want busy, faulty)");
    if (!val.is_array()) throw InputError(source + ": field \"" + key + "\" must be a list of hostlist strings");
    for (size_t i = 0; i < val.size(); ++i) {
      if (!val[i].is_string()) throw InputError(source + ": " + key + "[" + std::to_string(i) + "] is not a string");
      std::vector<std::string> names;
      try {
        names = expand_hostlist(val[i].get<std::string>(), &budget);
      } catch (const InputError& e) {
        throw InputError(source + ": " + key + "[" + std::to_string(i) + "]: " + e.what());
      }
      for (const auto& n : names) {
        int id = topo.find(n);
        if (id < 0)
          throw InputError(source + ": " + key + "[" + std::to_string(i) + "]: node " + n + " is not in " +
                           topo.source);
        if (st[id] < s) st[id] = s;  // faulty wins over busy
      }
    }
  }
  return st;
}

std::vector<NodeState> load_state(const Topology& topo, const std::string& path) {
  return parse_state(topo, read_file(path), path);
}

}  // namespace ballast::sched
