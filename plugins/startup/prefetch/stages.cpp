#include "stages.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>

#include <ballast/events.h>

#include "util.hpp"

namespace ballast::startup {

std::string stage_to_json_line(const StageRecord& r) {
  nlohmann::json j = {{"stage", r.stage},   {"node", r.node},   {"rank", r.rank},    {"start_ns", r.start_ns},
                      {"end_ns", r.end_ns}, {"bytes", r.bytes}, {"status", r.status}};
  if (!r.detail.empty()) j["detail"] = r.detail;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

std::vector<StageRecord> read_stages(const std::string& path) {
  std::istringstream in(read_file(path));
  std::vector<StageRecord> out;
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::string where = path + ":" + std::to_string(lineno);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      throw Error(where + ": not JSON (column " + std::to_string(e.byte) + ")");
    } catch (const nlohmann::json::out_of_range&) {
      throw Error(where + ": a number too large for a double");
    }
    if (!j.is_object()) throw Error(where + ": not a JSON object");
    auto need = [&](const char* key, auto check, const char* what) {
      if (!j.contains(key)) throw Error(where + ": field \"" + key + "\" is missing");
      if (!check(j[key])) throw Error(where + ": field \"" + key + "\" must be " + what);
      return j[key];
    };
    auto is_int = [](const nlohmann::json& v) { return v.is_number_integer(); };
    StageRecord r;
    r.stage = need(
                  "stage", [](const nlohmann::json& v) { return v.is_string() && !v.get<std::string>().empty(); },
                  "a non-empty string")
                  .get<std::string>();
    r.start_ns = need("start_ns", is_int, "an integer").get<int64_t>();
    r.end_ns = need("end_ns", is_int, "an integer").get<int64_t>();
    if (r.end_ns < r.start_ns) throw Error(where + ": field \"end_ns\" is before \"start_ns\"");
    if (j.contains("node") && j["node"].is_string()) r.node = j["node"].get<std::string>();
    if (j.contains("rank")) r.rank = need("rank", is_int, "an integer").get<int32_t>();
    if (j.contains("bytes"))
      r.bytes = need(
                    "bytes",
                    [](const nlohmann::json& v) {
                      return v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
                    },
                    "a non-negative integer")
                    .get<uint64_t>();
    if (j.contains("status")) r.status = need("status", is_int, "an integer").get<int32_t>();
    if (j.contains("detail") && j["detail"].is_string()) r.detail = j["detail"].get<std::string>();
    out.push_back(std::move(r));
  }
  return out;
}

StageLog::StageLog(const ballast_host_api* host, std::string path) : host_(host), path_(std::move(path)) {
  if (path_.empty()) {
    const char* env = std::getenv("BALLAST_STARTUP_STAGES");
    if (env != nullptr) path_ = env;
  }
}

void StageLog::record(StageRecord r) {
  if (r.node.empty()) r.node = hostname();
  if (r.rank < 0) {
    const char* rank = std::getenv("RANK");
    if (rank != nullptr) r.rank = std::atoi(rank);
  }
  if (!path_.empty()) {
    std::string line = stage_to_json_line(r);
    int fd = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0 || ::write(fd, line.data(), line.size()) != ssize_t(line.size()))
      std::fprintf(stderr, "ballast startup: cannot append to profile %s: %s\n", path_.c_str(),
                   errno_text(errno).c_str());
    if (fd >= 0) ::close(fd);
  }
  if (host_ != nullptr && host_->publish != nullptr) {
    ballast_startup_stage payload{};
    payload.size = sizeof payload;
    payload.status = r.status;
    payload.stage = r.stage.c_str();
    payload.node = r.node.c_str();
    payload.rank = r.rank;
    payload.start_ns = r.start_ns;
    payload.end_ns = r.end_ns;
    payload.bytes = r.bytes;
    ballast_event ev{};
    ev.size = sizeof ev;
    ev.schema = BALLAST_SCHEMA_STARTUP_STAGE;
    ev.topic = "startup.stage";
    ev.ts_ns = r.end_ns;
    ev.source.node = payload.node;
    ev.source.rank = r.rank;
    ev.payload = &payload;
    ev.payload_size = sizeof payload;
    host_->publish(host_, &ev);  // no subscriber is not an error
  }
}

namespace {

// Total length of the union of [start, end) intervals.
int64_t union_ns(std::vector<std::pair<int64_t, int64_t>> iv) {
  std::sort(iv.begin(), iv.end());
  int64_t total = 0, cur_s = 0, cur_e = 0;
  bool open = false;
  for (auto [s, e] : iv) {
    if (!open || s > cur_e) {
      if (open) total += cur_e - cur_s;
      cur_s = s;
      cur_e = e;
      open = true;
    } else {
      cur_e = std::max(cur_e, e);
    }
  }
  if (open) total += cur_e - cur_s;
  return total;
}

}  // namespace

nlohmann::json stage_report(const std::vector<StageRecord>& records) {
  nlohmann::json out = nlohmann::json::object();
  out["records"] = records.size();
  if (records.empty()) {
    out["wall_s"] = 0.0;
    out["stages"] = nlohmann::json::array();
    return out;
  }
  int64_t start = records[0].start_ns, end = records[0].end_ns;
  std::vector<std::pair<int64_t, int64_t>> all;
  struct Acc {
    int64_t first = 0, last = 0, max_ns = 0, sum_ns = 0;
    uint64_t bytes = 0;
    size_t count = 0, failed = 0;
    int32_t max_rank = -1;
    std::string max_node;
    std::vector<std::pair<int64_t, int64_t>> iv;
    std::map<std::pair<std::string, int32_t>, int> ranks;
  };
  std::map<std::string, Acc> acc;
  for (const auto& r : records) {
    start = std::min(start, r.start_ns);
    end = std::max(end, r.end_ns);
    all.emplace_back(r.start_ns, r.end_ns);
    Acc& a = acc[r.stage];
    if (a.count == 0 || r.start_ns < a.first) a.first = r.start_ns;
    if (a.count == 0 || r.end_ns > a.last) a.last = r.end_ns;
    int64_t d = r.end_ns - r.start_ns;
    if (a.count == 0 || d > a.max_ns) {
      a.max_ns = d;
      a.max_rank = r.rank;
      a.max_node = r.node;
    }
    a.sum_ns += d;
    a.bytes += r.bytes;
    a.count += 1;
    a.failed += r.status != 0;
    a.iv.emplace_back(r.start_ns, r.end_ns);
    a.ranks[{r.node, r.rank}] += 1;
  }
  const double wall = double(end - start) / 1e9;
  const double covered = double(union_ns(all)) / 1e9;
  std::vector<std::pair<std::string, Acc*>> order;
  for (auto& [name, a] : acc) order.emplace_back(name, &a);
  std::sort(order.begin(), order.end(), [](auto& x, auto& y) { return x.second->first < y.second->first; });
  nlohmann::json stages = nlohmann::json::array();
  std::string largest;
  double largest_s = -1;
  for (auto& [name, a] : order) {
    double u = double(union_ns(a->iv)) / 1e9;
    nlohmann::json s = {{"stage", name},
                        {"count", a->count},
                        {"processes", a->ranks.size()},
                        {"failed", a->failed},
                        {"offset_s", double(a->first - start) / 1e9},
                        {"span_s", double(a->last - a->first) / 1e9},
                        {"busy_s", u},
                        {"max_s", double(a->max_ns) / 1e9},
                        {"max_rank", a->max_rank},
                        {"max_node", a->max_node},
                        {"mean_s", double(a->sum_ns) / 1e9 / double(a->count)},
                        {"bytes", a->bytes},
                        {"share", wall > 0 ? u / wall : 0.0}};
    if (a->bytes > 0 && a->max_ns > 0) s["gbytes_per_s"] = double(a->bytes) / (double(a->sum_ns) / 1e9) / 1e9;
    if (u > largest_s) {
      largest_s = u;
      largest = name;
    }
    stages.push_back(std::move(s));
  }
  out["start_ns"] = start;
  out["end_ns"] = end;
  out["wall_s"] = wall;
  out["covered_s"] = covered;
  out["unaccounted_s"] = wall - covered;
  out["largest_stage"] = largest;
  out["stages"] = std::move(stages);
  return out;
}

std::string stage_report_text(const nlohmann::json& rep) {
  std::string out;
  char line[256];
  double wall = rep.value("wall_s", 0.0);
  std::snprintf(line, sizeof line, "start-up: %.3f s wall, %zu stage records\n", wall, rep.value("records", size_t(0)));
  out += line;
  if (rep["stages"].empty()) return out;
  std::snprintf(line, sizeof line, "  %-18s %9s %9s %9s %6s %5s %12s\n", "stage", "at_s", "busy_s", "max_s", "share",
                "n", "bytes");
  out += line;
  for (const auto& s : rep["stages"]) {
    std::snprintf(line, sizeof line, "  %-18s %9.3f %9.3f %9.3f %5.1f%% %5zu %12s%s\n",
                  s["stage"].get<std::string>().c_str(), s["offset_s"].get<double>(), s["busy_s"].get<double>(),
                  s["max_s"].get<double>(), 100.0 * s["share"].get<double>(), s["count"].get<size_t>(),
                  human_bytes(double(s["bytes"].get<uint64_t>())).c_str(),
                  s["failed"].get<size_t>() ? "  (failures)" : "");
    out += line;
  }
  std::snprintf(line, sizeof line, "  %-18s %9s %9.3f\n", "(no stage)", "", rep["unaccounted_s"].get<double>());
  out += line;
  std::snprintf(line, sizeof line, "largest: %s\n", rep["largest_stage"].get<std::string>().c_str());
  out += line;
  return out;
}

}  // namespace ballast::startup
