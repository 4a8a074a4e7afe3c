#include "inject.hpp"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

namespace ballast::runner {

namespace {

constexpr const char* kKinds = "hang, crash, skip, slow, machine, nan, usererror";
constexpr size_t kMaxScheduleLines = 1000000;

std::string fmt(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

bool parse_number(const std::string& s, double* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  *out = std::strtod(s.c_str(), &end);
  return end && *end == '\0' && std::isfinite(*out);
}

int parse_index(const std::string& origin, const std::string& key, const std::string& value, int limit,
                const char* what) {
  double v = 0;
  if (!parse_number(value, &v) || v != std::floor(v))
    throw InjectError(origin + ": " + key + "=" + value + " is not an integer");
  if (v < 0 || v >= limit)
    throw InjectError(origin + ": " + key + " " + value + " is out of range (the job has " + std::to_string(limit) +
                      " " + what + ": 0-" + std::to_string(limit - 1) + ")");
  return int(v);
}

}  // namespace

const char* fault_kind_name(FaultKind k) {
  switch (k) {
    case FaultKind::hang:
      return "hang";
    case FaultKind::crash:
      return "crash";
    case FaultKind::skip:
      return "skip";
    case FaultKind::slow:
      return "slow";
    case FaultKind::machine:
      return "machine";
    case FaultKind::nan:
      return "nan";
    case FaultKind::usererror:
      return "usererror";
  }
  return "?";
}

Injection parse_spec(const std::string& spec, const std::string& origin, const JobShape& shape) {
  Injection in;
  in.origin = origin;
  const auto at = spec.rfind('@');
  if (at == std::string::npos)
    throw InjectError(origin + ": missing '@' and the time (KIND:ARGS@SECONDS) or step (nan@STEP)");
  const std::string head = spec.substr(0, at), when = spec.substr(at + 1);
  const auto colon = head.find(':');
  const std::string kind = head.substr(0, colon);
  std::map<std::string, std::string> args;
  if (colon != std::string::npos) {
    std::stringstream ss(head.substr(colon + 1));
    for (std::string kv; std::getline(ss, kv, ',');) {
      const auto eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) throw InjectError(origin + ": '" + kv + "' is not KEY=VALUE");
      args[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
  }
  auto take = [&](const std::string& key) -> std::string {
    auto it = args.find(key);
    if (it == args.end()) throw InjectError(origin + ": " + kind + " needs " + key + "=");
    std::string v = it->second;
    args.erase(it);
    return v;
  };
  double t = 0;
  if (kind == "nan" || kind == "usererror") {
    in.kind = kind == "nan" ? FaultKind::nan : FaultKind::usererror;
    if (!parse_number(when, &t) || t != std::floor(t) || t < 1)
      throw InjectError(origin + ": " + kind + "@STEP wants a step number from 1, got '" + when + "'");
    in.at_step = int64_t(t);
    in.spec = kind + "@" + std::to_string(in.at_step);
  } else {
    if (kind == "hang")
      in.kind = FaultKind::hang;
    else if (kind == "crash")
      in.kind = FaultKind::crash;
    else if (kind == "skip")
      in.kind = FaultKind::skip;
    else if (kind == "slow")
      in.kind = FaultKind::slow;
    else if (kind == "machine")
      in.kind = FaultKind::machine;
    else
      throw InjectError(origin + ": unknown fault kind '" + kind + "' (known: " + kKinds + ")");
    if (when.rfind("step", 0) == 0) {
      // @stepN: when the job first reaches step N (tests and benchmarks
      // that must not depend on the machine's speed).
      if (!parse_number(when.substr(4), &t) || t != std::floor(t) || t < 1)
        throw InjectError(origin + ": '@" + when + "' wants a step number from 1 after 'step'");
      in.at_step = int64_t(t);
    } else if (!parse_number(when, &t) || t < 0) {
      throw InjectError(origin + ": '@" + when + "' is not a time in seconds (>= 0) after the job's start, or stepN");
    } else {
      in.at_s = t;
    }
    const std::string at_text = in.at_step > 0 ? "step" + std::to_string(in.at_step) : fmt(t);
    if (in.kind == FaultKind::machine) {
      in.node = parse_index(origin, "node", take("node"), shape.nodes, "nodes");
      in.machine_kind = take("kind");
      if (in.machine_kind != "cpu" && in.machine_kind != "mem" && in.machine_kind != "net")
        throw InjectError(origin + ": machine kind '" + in.machine_kind + "' is not cpu, mem or net");
      if (in.machine_kind == "net" && !shape.network_per_node)
        throw InjectError(origin + ": machine kind=net needs a network namespace per node: set job.netns = true " +
                          "or \"auto\" (the local backend, run as root)");
      in.spec = "machine:node=" + std::to_string(in.node) + ",kind=" + in.machine_kind + "@" + at_text;
    } else {
      in.rank = parse_index(origin, "rank", take("rank"), shape.ranks, "ranks");
      in.spec = kind + ":rank=" + std::to_string(in.rank);
      if (in.kind == FaultKind::slow) {
        const std::string f = take("factor");
        if (!parse_number(f, &in.factor) || in.factor < 1 || in.factor > 1000)
          throw InjectError(origin + ": factor=" + f + " is not a number in [1, 1000]");
        in.spec += ",factor=" + fmt(in.factor);
      }
      in.spec += "@" + at_text;
    }
  }
  if (!args.empty()) throw InjectError(origin + ": unknown argument '" + args.begin()->first + "' for " + kind);
  return in;
}

namespace {

// One InfiniteHBD record: a fault_start on a node that runs part of the job
// becomes an injection; other records (fault_end, nodes outside the job)
// are skipped. The trace's nodes are numbered in order of first appearance
// and node k is the job's node k: the job occupies the first few of them.
bool from_trace(const nlohmann::json& j, const std::string& origin, const JobShape& shape, const ScheduleOptions& o,
                std::map<std::string, int>* nodes, Injection* out) {
  if (!j["node_id"].is_string() || !j.contains("event_time") || !j["event_time"].is_number() ||
      !j.contains("event_type") || !j["event_type"].is_string())
    throw InjectError(origin + ": an InfiniteHBD record needs node_id, event_time (days) and event_type");
  const std::string id = j["node_id"];
  const int index = nodes->emplace(id, int(nodes->size())).first->second;
  if (j["event_type"] != "fault_start" || index >= shape.nodes) return false;
  std::string cls, desc;
  if (j.contains("fault_type") && j["fault_type"].is_object()) {
    const auto& f = j["fault_type"];
    if (f.contains("Class") && f["Class"].is_string()) cls = f["Class"];
    if (f.contains("Desc") && f["Desc"].is_string()) desc = f["Desc"];
  }
  const double at = j["event_time"].get<double>() * o.seconds_per_day;
  if (!std::isfinite(at) || at < 0) throw InjectError(origin + ": event_time is negative or not finite");
  // What the fault does to a job on that node: a GPU or software failure
  // kills its process, a link or NIC failure leaves its collectives
  // waiting, a memory failure shows in the node's metrics first.
  std::string spec;
  const int rank = index * (shape.ranks / shape.nodes);
  const std::string lower = [&] {
    std::string s = cls + " " + desc;
    for (auto& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
    return s;
  }();
  if (lower.find("cable") != std::string::npos || lower.find("link") != std::string::npos ||
      lower.find("nic") != std::string::npos || lower.find("network") != std::string::npos)
    spec = "hang:rank=" + std::to_string(rank);
  else if (lower.find("memory") != std::string::npos || lower.find("dimm") != std::string::npos)
    spec = "machine:node=" + std::to_string(index) + ",kind=mem";
  else
    spec = "crash:rank=" + std::to_string(rank);
  *out = parse_spec(spec + "@" + fmt(at), origin, shape);
  out->note = cls + ": " + desc;
  return true;
}

Injection from_line(const nlohmann::json& j, const std::string& origin, const JobShape& shape) {
  if (j.contains("spec")) {
    if (!j["spec"].is_string()) throw InjectError(origin + ": 'spec' is not a string");
    return parse_spec(j["spec"], origin, shape);
  }
  if (!j.contains("kind") || !j["kind"].is_string())
    throw InjectError(origin + ": want \"spec\", \"kind\" (with rank/node and at/step) or an InfiniteHBD record");
  const std::string kind = j["kind"];
  std::string args;
  auto add = [&](const char* key) {
    if (!j.contains(key)) return;
    if (!j[key].is_number() && !j[key].is_string()) throw InjectError(origin + ": '" + key + "' is not a number");
    args += std::string(args.empty() ? ":" : ",") + key + "=" +
            (j[key].is_string() ? j[key].get<std::string>() : j[key].dump());
  };
  if (kind == "machine") {
    add("node");
    if (j.contains("machine_kind") && j["machine_kind"].is_string())
      args += std::string(args.empty() ? ":" : ",") + "kind=" + j["machine_kind"].get<std::string>();
  } else {
    add("rank");
    add("factor");
  }
  const char* when = kind == "nan" || kind == "usererror" ? "step" : "at";
  if (!j.contains(when) || !j[when].is_number())
    throw InjectError(origin + ": '" + when + "' (a number) is required for " + kind);
  return parse_spec(kind + args + "@" + j[when].dump(), origin, shape);
}

}  // namespace

std::vector<Injection> parse_schedule(const std::string& path, const JobShape& shape, const ScheduleOptions& options) {
  std::ifstream in(path);
  if (!in) throw InjectError(path + ": cannot open the schedule file");
  if (!(options.seconds_per_day > 0) || !std::isfinite(options.seconds_per_day))
    throw InjectError(path + ": seconds per day must be positive");
  std::vector<Injection> out;
  std::map<std::string, int> nodes;
  // The published trace is one JSON array; a schedule is JSON lines.
  char first = 0;
  while (in.get(first) && std::isspace(static_cast<unsigned char>(first))) {
  }
  in.clear();
  in.seekg(0);
  if (first == '[') {
    nlohmann::json all = nlohmann::json::parse(in, nullptr, false);
    if (all.is_discarded() || !all.is_array()) throw InjectError(path + ": starts with '[' but is not a JSON array");
    for (size_t i = 0; i < all.size(); ++i) {
      const std::string origin = path + ": record " + std::to_string(i + 1);
      if (!all[i].is_object()) throw InjectError(origin + ": not a JSON object");
      Injection inj;
      if (all[i].contains("node_id") ? from_trace(all[i], origin, shape, options, &nodes, &inj)
                                     : (inj = from_line(all[i], origin, shape), true))
        out.push_back(inj);
    }
    return out;
  }
  std::string line;
  for (size_t n = 1; std::getline(in, line); ++n) {
    if (n > kMaxScheduleLines) throw InjectError(path + ": more than 1000000 lines");
    const std::string origin = path + ":" + std::to_string(n);
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) throw InjectError(origin + ": not JSON");
    if (!j.is_object()) throw InjectError(origin + ": not a JSON object");
    Injection inj;
    if (j.contains("node_id")) {
      if (from_trace(j, origin, shape, options, &nodes, &inj)) out.push_back(inj);
    } else {
      out.push_back(from_line(j, origin, shape));
    }
  }
  return out;
}

}  // namespace ballast::runner
