#include "launch_record.hpp"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>

namespace ballast::hang {

namespace {

ProcState state_named(const std::string& s) {
  if (s == "alive") return ProcState::alive;
  if (s == "stopped") return ProcState::stopped;
  if (s == "gone") return ProcState::gone;
  return ProcState::unknown;
}

std::string utc(int64_t ns) {
  const time_t t = time_t(ns / 1000000000);
  tm tm_utc{};
  gmtime_r(&t, &tm_utc);
  char b[48];
  std::snprintf(b, sizeof b, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm_utc.tm_year + 1900, tm_utc.tm_mon + 1,
                tm_utc.tm_mday, tm_utc.tm_hour, tm_utc.tm_min, tm_utc.tm_sec, int(ns / 1000000 % 1000));
  return b;
}

}  // namespace

bool write_launch_record(const std::string& dir, const LaunchRecord& rec, std::string* err) {
  nlohmann::json j;
  j["reason"] = rec.reason;
  j["failed_rank"] = rec.failed_rank;
  j["verdict_ns"] = rec.verdict_ns;
  j["stopped_ns"] = rec.stopped_ns;
  j["verdict"] = nlohmann::json::parse(rec.verdict_json.empty() ? "null" : rec.verdict_json, nullptr, false);
  if (j["verdict"].is_discarded()) j["verdict"] = nullptr;
  j["ranks"] = nlohmann::json::array();
  for (const auto& r : rec.ranks)
    j["ranks"].push_back({{"rank", r.rank},
                          {"pid", r.pid},
                          {"state_at_verdict", proc_state_name(r.state)},
                          {"ended", r.ended},
                          {"stopped_by_launcher", r.stopped_by_launcher}});
  const std::string path = dir + "/" + kLaunchRecordName, part = path + ".part";
  {
    std::ofstream f(part, std::ios::trunc);
    f << j.dump(2) << "\n";
    if (!f) {
      *err = part + ": cannot write: " + std::strerror(errno);
      return false;
    }
  }
  if (std::rename(part.c_str(), path.c_str()) != 0) {
    *err = path + ": cannot rename into place: " + std::strerror(errno);
    return false;
  }
  return true;
}

bool read_launch_record(const std::string& dir, LaunchRecord* rec, std::string* err) {
  err->clear();
  const std::string path = dir + "/" + kLaunchRecordName;
  std::ifstream f(path);
  if (!f) return false;
  std::stringstream text;
  text << f.rdbuf();
  if (text.str().size() > (16u << 20)) {
    *err = path + ": larger than 16 MiB, not a launch record";
    return false;
  }
  const auto j = nlohmann::json::parse(text.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    *err = path + ": not a JSON object";
    return false;
  }
  try {
    LaunchRecord r;
    r.reason = j.at("reason").get<std::string>();
    r.failed_rank = j.at("failed_rank").get<int>();
    r.verdict_ns = j.at("verdict_ns").get<int64_t>();
    r.stopped_ns = j.at("stopped_ns").get<int64_t>();
    r.verdict_json = j.at("verdict").dump();
    for (const auto& x : j.at("ranks")) {
      LaunchRank k;
      k.rank = x.at("rank").get<int>();
      k.pid = x.at("pid").get<int32_t>();
      k.state = state_named(x.at("state_at_verdict").get<std::string>());
      k.ended = x.at("ended").get<std::string>();
      k.stopped_by_launcher = x.at("stopped_by_launcher").get<bool>();
      r.ranks.push_back(k);
    }
    *rec = std::move(r);
    return true;
  } catch (const nlohmann::json::exception& e) {
    *err = path + ": " + e.what();
    return false;
  }
}

std::map<int, ProcState> states_at_verdict(const LaunchRecord& rec) {
  std::map<int, ProcState> out;
  for (const auto& r : rec.ranks)
    if (r.stopped_by_launcher && r.state != ProcState::unknown) out[r.rank] = r.state;
  return out;
}

std::string launch_summary(const LaunchRecord& rec) {
  std::string stopped;
  for (const auto& r : rec.ranks)
    if (r.stopped_by_launcher) stopped += (stopped.empty() ? "" : ",") + std::to_string(r.rank);
  std::string t = "ballast launch stopped this job at " + utc(rec.verdict_ns) + ": " + rec.reason + "\n";
  if (!stopped.empty())
    t += "  it ended rank(s) " + stopped + " itself" + (rec.stopped_ns ? " (by " + utc(rec.stopped_ns) + ")" : "") +
         ": their processes are analysed in the state it found them in\n";
  const auto v = nlohmann::json::parse(rec.verdict_json, nullptr, false);
  if (v.is_object() && v.contains("root_cause") && v["root_cause"].is_array()) {
    std::string causes;
    for (const auto& c : v["root_cause"])
      if (c.is_object() && c.contains("rank") && c.contains("kind"))
        causes += (causes.empty() ? "" : ", ") + std::string("rank ") + c["rank"].dump() + " " +
                  (c["kind"].is_string() ? c["kind"].get<std::string>() : c["kind"].dump());
    t += "  its verdict: " +
         (v.contains("verdict") && v["verdict"].is_string() ? v["verdict"].get<std::string>() : "?") +
         (causes.empty() ? "" : " (" + causes + ")") + "\n";
  }
  return t;
}

std::string launch_summary_json(const LaunchRecord& rec) {
  nlohmann::json j;
  j["reason"] = rec.reason;
  j["failed_rank"] = rec.failed_rank;
  j["verdict_ns"] = rec.verdict_ns;
  j["stopped_ns"] = rec.stopped_ns;
  j["stopped_ranks"] = nlohmann::json::array();
  for (const auto& r : rec.ranks)
    if (r.stopped_by_launcher) j["stopped_ranks"].push_back(r.rank);
  j["verdict"] = nlohmann::json::parse(rec.verdict_json, nullptr, false);
  if (j["verdict"].is_discarded()) j["verdict"] = nullptr;
  return j.dump();
}

}  // namespace ballast::hang
