#include "job_report.hpp"

#include <cmath>
#include <cstdio>
#include <map>

namespace ballast::runner {

namespace {

// Seconds of t after the job's start, or null when t is not known.
nlohmann::json rel(const Summary& s, int64_t t) {
  if (t == 0) return nullptr;
  return std::round(double(t - s.start_ns) / 1e6) / 1e3;
}

nlohmann::json latency(int64_t from, int64_t to) {
  if (from == 0 || to == 0) return nullptr;
  return std::round(double(to - from) / 1e6) / 1e3;
}

std::string secs(const nlohmann::json& v) {
  if (v.is_null()) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.2f s", v.get<double>());
  return b;
}

}  // namespace

nlohmann::json summary_json(const Summary& s) {
  nlohmann::json inc = nlohmann::json::array();
  for (const auto& i : s.incidents) {
    inc.push_back({{"id", i.id},
                   {"fault", i.fault},
                   {"origin", i.origin},
                   {"injected_s", rel(s, i.injected_ns)},
                   {"detected_s", rel(s, i.detected_ns)},
                   {"detector", i.detector},
                   {"verdict", i.verdict},
                   {"decided_s", rel(s, i.decided_ns)},
                   {"actions", i.actions},
                   {"resumed_s", rel(s, i.resumed_ns)},
                   {"detection_latency_s", latency(i.injected_ns, i.detected_ns)},
                   {"decision_latency_s", latency(i.detected_ns, i.decided_ns)},
                   {"recovery_s", latency(i.detected_ns, i.resumed_ns)},
                   {"step_at_fault", i.step_at_fault},
                   {"resumed_from_step", i.resumed_from},
                   {"steps_lost", i.steps_lost()},
                   {"outcome", i.outcome},
                   {"message", i.message}});
  }
  return {{"command", s.command},
          {"ranks", s.ranks},
          {"state", s.state},
          {"reason", s.reason},
          {"start_unix_s", std::round(double(s.start_ns) / 1e6) / 1e3},
          {"wall_s", std::round(s.wall_seconds() * 1e3) / 1e3},
          {"attempts", s.attempts},
          {"steps", s.steps},
          {"loss_first", s.have_loss ? nlohmann::json(s.loss_first) : nlohmann::json()},
          {"loss_last", s.have_loss && std::isfinite(s.loss_last) ? nlohmann::json(s.loss_last) : nlohmann::json()},
          {"kept_step_s", std::round(s.kept_seconds * 1e3) / 1e3},
          {"ettr", std::round(s.ettr() * 1e4) / 1e4},
          {"incidents", inc},
          {"incidents_omitted", s.incidents_omitted},
          {"earlier_leaders", s.earlier_leaders}};
}

std::string summary_text(const Summary& s) {
  const nlohmann::json j = summary_json(s);
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "\nballast run: job %s after %.1f s (%s)\n", s.state.c_str(), s.wall_seconds(),
                s.reason.empty() ? "-" : s.reason.c_str());
  out += line;
  std::snprintf(line, sizeof line, "  %d ranks of %s, %d start(s), %lld steps kept\n", s.ranks, s.command.c_str(),
                s.attempts, static_cast<long long>(s.steps));
  out += line;
  if (s.have_loss) {
    std::snprintf(line, sizeof line, "  loss %.4f at the start, %.4f at the end\n", s.loss_first, s.loss_last);
    out += line;
  }
  std::snprintf(line, sizeof line, "  ETTR %.1f%% (%.1f s in kept steps of %.1f s)\n", 100 * s.ettr(), s.kept_seconds,
                s.wall_seconds());
  out += line;
  if (s.earlier_leaders)
    out +=
        "  (the figures include the earlier leaders' terms since the job's first start; the timeline begins at "
        "this controller's term)\n";
  if (s.incidents_omitted > 0) {
    std::snprintf(line, sizeof line, "  %lld older incident(s) not carried over\n",
                  static_cast<long long>(s.incidents_omitted));
    out += line;
  }
  if (s.incidents.empty()) out += "  no incident\n";
  for (const auto& i : j["incidents"]) {
    std::string actions;
    for (const auto& a : i["actions"]) actions += (actions.empty() ? "" : ", ") + a.get<std::string>();
    std::snprintf(line, sizeof line, "  incident %d: %s%s\n", i["id"].get<int>(), i["fault"].get<std::string>().c_str(),
                  i["injected_s"].is_null() ? " (not injected)" : (" injected at " + secs(i["injected_s"])).c_str());
    out += line;
    std::snprintf(line, sizeof line, "    detected %s later by %s: %s\n", secs(i["detection_latency_s"]).c_str(),
                  i["detector"].get<std::string>().empty() ? "-" : i["detector"].get<std::string>().c_str(),
                  i["verdict"].get<std::string>().empty() ? "-" : i["verdict"].get<std::string>().c_str());
    out += line;
    std::snprintf(line, sizeof line, "    decided %s after: %s\n", secs(i["decision_latency_s"]).c_str(),
                  actions.empty() ? "no action" : actions.c_str());
    out += line;
    std::snprintf(line, sizeof line, "    %s; training resumed %s after detection, %lld step(s) lost\n",
                  i["outcome"].get<std::string>().c_str(), secs(i["recovery_s"]).c_str(),
                  static_cast<long long>(i["steps_lost"].get<int64_t>()));
    out += line;
    if (!i["message"].get<std::string>().empty()) out += "    message: " + i["message"].get<std::string>() + "\n";
  }
  return out;
}

nlohmann::json timeline_json(const Summary& s) {
  static const std::map<std::string, int> kTids = {{"job", 1}, {"steps", 2}, {"actions", 3}, {"faults", 4}};
  nlohmann::json ev = nlohmann::json::array();
  ev.push_back({{"ph", "M"}, {"pid", 1}, {"name", "process_name"}, {"args", {{"name", "ballast run: " + s.command}}}});
  for (const auto& [name, tid] : kTids)
    ev.push_back({{"ph", "M"}, {"pid", 1}, {"tid", tid}, {"name", "thread_name"}, {"args", {{"name", name}}}});
  auto us = [&](int64_t t) { return double(t - s.start_ns) / 1e3; };
  for (const auto& sp : s.spans) {
    auto it = kTids.find(sp.track);
    const int tid = it == kTids.end() ? 5 : it->second;
    nlohmann::json e = {{"pid", 1}, {"tid", tid}, {"name", sp.name}, {"ts", us(sp.start_ns)}, {"args", sp.args}};
    if (sp.end_ns > sp.start_ns) {
      e["ph"] = "X";
      e["dur"] = double(sp.end_ns - sp.start_ns) / 1e3;
    } else {
      e["ph"] = "i";
      e["s"] = "t";
    }
    ev.push_back(e);
  }
  return {{"traceEvents", ev}, {"displayTimeUnit", "ms"}};
}

}  // namespace ballast::runner
