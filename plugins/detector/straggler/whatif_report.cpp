#include "whatif_report.hpp"

#include "replay.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>

namespace ballast::straggler {
namespace {

nlohmann::ordered_json attributions(const std::vector<Attribution>& v) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const Attribution& a : v) j[a.name] = a.slowdown;
  return j;
}

nlohmann::ordered_json per_step(const std::vector<int64_t>& steps, const std::vector<double>& t) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (size_t i = 0; i < steps.size(); ++i) j[std::to_string(steps[i])] = t[i];
  return j;
}

nlohmann::ordered_json explained(const Explained& e) {
  return {{"t_original", e.t_original}, {"t_ideal", e.t_ideal}, {"t_removed", e.t_removed},
          {"t_added", e.t_added},       {"removed", e.removed}, {"added", e.added}};
}

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string percent(double share) { return fmt("%.0f%%", share * 100); }

std::string join_ranks(const std::vector<int32_t>& ranks) {
  std::string s;
  for (int32_t r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

}  // namespace

nlohmann::ordered_json to_json(const WhatIfResult& r) {
  nlohmann::ordered_json j;
  j["source"] = r.source;
  j["dp"] = r.dp;
  j["pp"] = r.pp;
  j["ranks"] = r.ranks;
  j["ops_per_step"] = r.ops_per_step;
  j["steps"] = r.steps;
  j["dropped_steps"] = r.dropped_steps;
  j["ignored_rows"] = r.ignored_rows;
  j["slowdown"] = r.slowdown;
  j["launch_slowdown"] = r.launch_slowdown;
  j["replay_error"] = r.replay_error;
  j["kind"] = r.kind;
  j["by_optype"] = attributions(r.by_optype);
  j["by_stage"] = attributions(r.by_stage);
  j["by_dp_rank"] = attributions(r.by_dp_rank);
  j["by_rank"] = attributions(r.by_rank);
  j["mw"] = r.mw.removed;
  j["ms"] = r.ms.removed;
  j["mw_detail"] = explained(r.mw);
  j["mw_detail"]["ranks"] = r.mw_ranks;
  j["ms_detail"] = explained(r.ms);
  j["ms_detail"]["stage"] = r.pp - 1;
  j["step_times"] = {{"original", per_step(r.steps, r.t_base)},
                     {"replayed", per_step(r.steps, r.t_replay)},
                     {"no_delay", per_step(r.steps, r.t_nodelay)},
                     {"ideal", per_step(r.steps, r.t_ideal)}};
  return j;
}

std::string kind_explanation(const WhatIfResult& r) {
  const std::string mw = percent(r.mw.removed), ms = percent(r.ms.removed);
  const std::string nw = std::to_string(r.mw_ranks.size()) + " of " + std::to_string(r.ranks) + " ranks";
  if (r.kind == "none") return "no significant straggling (S below 1.03)";
  if (r.kind == "worker")
    return "one slow worker: idealising the slowest " + nw + " (rank " + join_ranks(r.mw_ranks) + ") removes " + mw +
           " of the slowdown (M_W >= 50%)";
  if (r.kind == "stage")
    return "stage imbalance: idealising the last stage removes " + ms + " of the slowdown (M_S >= 50%; M_W " + mw + ")";
  return "random stragglers (e.g. sequence-length imbalance): neither the slowest " + nw + " (M_W " + mw +
         ") nor the last stage (M_S " + ms + ") explains half of the slowdown";
}

std::string human_report(const WhatIfResult& r) {
  std::string s = "what-if analysis of " + r.source + ": " + std::to_string(r.steps.size()) + " steps, " +
                  std::to_string(r.ranks) + " ranks (dp " + std::to_string(r.dp) + " x pp " + std::to_string(r.pp) +
                  "), " + std::to_string(r.ops_per_step) + " ops per step\n";
  double t_nodelay = mean(r.t_nodelay), t_ideal = mean(r.t_ideal), t_base = mean(r.t_base);
  s += "slowdown S = " + fmt("%.3f", r.slowdown) + ": a step takes " + fmt("%.3f", t_nodelay) + " s, " +
       fmt("%.3f", t_ideal) + " s with no stragglers\n";
  s += "launch delays add " + fmt("%.2f%%", (r.launch_slowdown - 1) * 100) + " (recorded " + fmt("%.3f", t_base) +
       " s); replay of the recorded run off by " + fmt("%.2f%%", r.replay_error * 100) + "\n";
  if (!r.dropped_steps.empty()) s += std::to_string(r.dropped_steps.size()) + " steps dropped (incomplete)\n";
  s += "kind: " + kind_explanation(r) + "\n";

  struct Culprit {
    std::string what;
    double slowdown;
  };
  std::vector<Culprit> top;
  for (size_t i = 0; i < r.mw_ranks.size(); ++i) top.push_back({"rank " + r.by_rank[i].name, r.by_rank[i].slowdown});
  if (!r.by_stage.empty()) top.push_back({"stage " + r.by_stage[0].name, r.by_stage[0].slowdown});
  if (!r.by_dp_rank.empty()) top.push_back({"dp_rank " + r.by_dp_rank[0].name, r.by_dp_rank[0].slowdown});
  for (size_t i = 0; i < std::min<size_t>(3, r.by_optype.size()); ++i)
    top.push_back({r.by_optype[i].name, r.by_optype[i].slowdown});
  std::stable_sort(top.begin(), top.end(), [](const Culprit& a, const Culprit& b) { return a.slowdown > b.slowdown; });
  s += "top culprits (slowdown with only them as recorded, the rest ideal):\n";
  for (const Culprit& c : top) {
    char line[128];
    std::snprintf(line, sizeof line, "  %-28s %.3f\n", c.what.c_str(), c.slowdown);
    s += line;
  }
  return s;
}

void write_timeline(const Timeline& timeline, const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "w"), &std::fclose);
  if (!f) throw TraceError(path + ": cannot write: " + std::strerror(errno));
  double origin = 1e300;
  std::vector<int32_t> ranks;
  for (const auto& e : timeline.original) {
    origin = std::min(origin, e.start);
    ranks.push_back(e.rank);
  }
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());

  // One event per line, each written by nlohmann-json as it is made (a
  // timeline has an event per operation: no document held in memory).
  FILE* out = f.get();
  std::fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n", out);
  bool first = true;
  auto put = [&](const nlohmann::ordered_json& e) {
    std::fputs(first ? "" : ",\n", out);
    std::fputs(e.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace).c_str(), out);
    first = false;
  };
  const char* names[] = {"recorded", "ideal (no stragglers)"};
  for (int pid = 1; pid <= 2; ++pid) {
    put({{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"args", {{"name", names[pid - 1]}}}});
    put({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
    for (int32_t rank : ranks)
      put({{"ph", "M"},
           {"name", "thread_name"},
           {"pid", pid},
           {"tid", rank},
           {"args", {{"name", "rank " + std::to_string(rank)}}}});
  }
  for (int pid = 1; pid <= 2; ++pid) {
    for (const auto& e : pid == 1 ? timeline.original : timeline.ideal) {
      put({{"ph", "X"},
           {"pid", pid},
           {"tid", e.rank},
           {"name", std::string(optype_name(e.type)) + " " + std::to_string(e.seq)},
           {"cat", std::string(report_name(e.type))},
           {"ts", std::round((e.start - origin) * 1e9) / 1e3},
           {"dur", std::round(e.duration * 1e9) / 1e3},
           {"args", {{"step", e.step}}}});
    }
  }
  std::fputs("\n]}\n", out);
  if (std::ferror(out)) throw TraceError(path + ": write error");
}

}  // namespace ballast::straggler
