// The InfiniteHBD fault trace (tests/data/faults/infinitehbd-fault-trace.json:
// fault_start / fault_end of 400 GPU servers over 348 days) as the events
// Ballast's detectors would publish for it: one fault.confirmed per fault,
// naming the node, with a kind the default policy's ladder understands.
// Shared by bench_ettr and the policy's replay test; header-only.
#pragma once

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ballast::faults {

struct Fault {
  std::string node;                     // "node-<first 8 hex digits of the node_id>"
  double start_days = 0, end_days = 0;  // end: the matching fault_end, or start when there is none
  std::string level, cls, desc;         // the trace's fault_type
  std::string kind;                     // kind_of(level, cls, desc)
};

// The kind a fault.confirmed carries: "unknown" when the trace says no more
// than that something failed ("Unknown Error" of class "Unknown Error" or
// "Other Failures" outside the hardware level), else what it is: "hardware",
// "software", "stress_test" (the node failed a stress test), "offline" (taken
// out while troubleshooting a job), "down" (server down), "maintenance"
// (changes and tests that take the node away).
inline std::string kind_of(const std::string& level, const std::string& cls, const std::string& desc) {
  if (level == "Hardware Failure") return "hardware";
  if (desc == "Unknown Error" && (cls == "Unknown Error" || cls == "Other Failures")) return "unknown";
  if (level == "Software Failure") return "software";
  if (cls == "Stress Test Failure") return "stress_test";
  if (cls == "Training Task Troubleshooting") return "offline";
  if (cls == "System Crash") return "down";
  return "maintenance";
}

// Reads the trace; throws std::runtime_error naming the file and the entry.
inline std::vector<Fault> read_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot be opened");
  const auto doc = nlohmann::json::parse(in, nullptr, false);
  if (!doc.is_array()) throw std::runtime_error(path + ": not a JSON array of events");
  std::vector<Fault> out;
  std::map<std::string, std::vector<size_t>> open;  // node -> faults without their end yet
  for (size_t i = 0; i < doc.size(); ++i) {
    const auto& e = doc[i];
    const auto where = path + ": entry " + std::to_string(i);
    if (!e.is_object() || !e.contains("node_id") || !e["node_id"].is_string() || !e.contains("event_time") ||
        !e["event_time"].is_number() || !e.contains("event_type") || !e.contains("fault_type") ||
        !e["fault_type"].is_object())
      throw std::runtime_error(where + ": needs node_id, event_time, event_type and fault_type");
    const std::string id = e["node_id"], type = e["event_type"];
    const auto& ft = e["fault_type"];
    Fault f;
    f.node = "node-" + id.substr(0, std::min<size_t>(8, id.size()));
    f.start_days = f.end_days = e["event_time"].get<double>();
    f.level = ft.value("Level", "");
    f.cls = ft.value("Class", "");
    f.desc = ft.value("Desc", "");
    f.kind = kind_of(f.level, f.cls, f.desc);
    if (type == "fault_start") {
      open[f.node].push_back(out.size());
      out.push_back(f);
    } else if (type == "fault_end") {
      auto& list = open[f.node];
      // The end closes the node's open fault of the same description, else its oldest.
      auto it = std::find_if(list.begin(), list.end(), [&](size_t k) { return out[k].desc == f.desc; });
      if (it == list.end()) it = list.begin();
      if (it != list.end()) {
        out[*it].end_days = std::max(out[*it].start_days, f.start_days);
        list.erase(it);
      }
    } else {
      throw std::runtime_error(where + ": event_type '" + type + "' is neither fault_start nor fault_end");
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const Fault& a, const Fault& b) { return a.start_days < b.start_days; });
  return out;
}

// Seconds of event time of the trace's day 0 in the events written.
constexpr double kEpoch = 1700000000.0;

// One JSON line: the fault.confirmed an inspection would publish for f.
inline std::string to_event(const Fault& f) {
  const nlohmann::json evidence = {
      {"level", f.level}, {"class", f.cls}, {"desc", f.desc}, {"duration_s", (f.end_days - f.start_days) * 86400.0}};
  const nlohmann::json line = {{"topic", "fault.confirmed"},
                               {"ts", kEpoch + f.start_days * 86400.0},
                               {"source", {{"node", f.node}, {"plugin", "inspection"}}},
                               {"payload",
                                {{"stage", 1},
                                 {"subject", f.node},
                                 {"rank", -1},
                                 {"kind", f.kind},
                                 {"metric", f.cls + ": " + f.desc},
                                 {"confidence", 1.0},
                                 {"detector", "inspection"},
                                 {"evidence", evidence.dump()}}}};
  return line.dump();
}

}  // namespace ballast::faults
