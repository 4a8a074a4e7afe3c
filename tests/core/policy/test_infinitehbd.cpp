// `ballast policy check scripts/default.lua` replays the 348 days of the
// InfiniteHBD fault trace (as fault.confirmed events, bench/ettr/fault_trace.hpp)
// and chooses, for each fault class, the rung of the ladder it belongs to.
#include <doctest/doctest.h>

#include "../../../bench/ettr/fault_trace.hpp"

#include <sys/wait.h>

#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>

TEST_CASE(
    "the default policy replays the InfiniteHBD trace: machine faults evicted and replaced, unknown ones restarted") {
  const auto faults =
      ballast::faults::read_trace(std::string(BALLAST_SOURCE_DIR) + "/tests/data/faults/infinitehbd-fault-trace.json");
  REQUIRE(faults.size() == 584);
  const std::string dir = std::filesystem::temp_directory_path().string();
  const std::string events = dir + "/infinitehbd-events.jsonl", out = dir + "/infinitehbd-actions.jsonl";
  {
    std::ofstream f(events);
    for (const auto& x : faults) f << ballast::faults::to_event(x) << "\n";
  }
  const std::string cmd = std::string(BALLAST_EXE) + " policy check " + BALLAST_SOURCE_DIR +
                          "/scripts/default.lua --json --events " + events + " > " + out + " 2> " + out + ".err";
  const int st = std::system(cmd.c_str());
  std::ifstream err(out + ".err");
  std::string summary((std::istreambuf_iterator<char>(err)), std::istreambuf_iterator<char>());
  INFO(summary);
  REQUIRE(WIFEXITED(st));
  REQUIRE(WEXITSTATUS(st) == 0);
  CHECK(summary.find("584 event(s)") != std::string::npos);
  CHECK(summary.find("0 error(s)") != std::string::npos);

  // The actions, grouped by the event (ts, subject) that caused them.
  std::map<std::pair<long long, std::string>, std::vector<std::string>> chosen;
  std::ifstream in(out);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("action")) continue;
    CHECK(j["fallback"] == false);
    chosen[{std::llround(j["ts"].get<double>() * 1000), j["subject"]}].push_back(j["action"]);
  }

  // What the ladder says for each, with its restart window (3 restarts in
  // 1800 s of trace time, then escalate; restarts within 10 s of a counted
  // one count with it) kept here independently.
  std::deque<double> restarts;
  std::map<std::string, std::map<std::string, int>> by_class;  // "Level/Class" -> actions -> count
  int evictions = 0, restarts_seen = 0, escalations = 0;
  for (const auto& f : faults) {
    const double t = ballast::faults::kEpoch + f.start_days * 86400.0;
    auto& got = chosen[{std::llround(t * 1000), f.node}];
    INFO(f.node << " " << f.level << "/" << f.cls << "/" << f.desc << " at day " << f.start_days);
    REQUIRE_FALSE(got.empty());
    std::string action = got.front();
    if (f.kind == "unknown") {
      while (!restarts.empty() && t - restarts.front() >= 1800) restarts.pop_front();
      const bool same_incident = !restarts.empty() && t - restarts.back() < 10;
      const std::string want = !same_incident && restarts.size() >= 3 ? "escalate" : "restart";
      CHECK(action == want);
      if (want == "restart" && !same_incident) restarts.push_back(t);
      got.erase(got.begin());
      (want == "restart" ? restarts_seen : escalations)++;
    } else {
      REQUIRE(got.size() >= 2);
      CHECK(got[0] == "evict");
      CHECK(got[1] == "replace");
      got.erase(got.begin(), got.begin() + 2);
      action = "evict+replace";
      ++evictions;
    }
    by_class[f.level + "/" + f.cls][action]++;
  }
  for (const auto& [key, left] : chosen) CHECK_MESSAGE(left.empty(), "actions left for " << key.second);
  // Every class of the trace got one rung: hardware, software, stress tests,
  // maintenance evicted; the faults with no known cause restarted.
  for (const auto& [cls, actions] : by_class) {
    INFO(cls);
    if (cls == "Other Failure/Unknown Error")
      CHECK(actions.count("evict+replace") == 0);
    else if (cls.rfind("Hardware Failure/", 0) == 0 || cls == "Other Failure/Stress Test Failure")
      CHECK(actions.size() == 1);
  }
  CHECK(evictions > 400);
  CHECK(restarts_seen > 100);
  MESSAGE("InfiniteHBD replay: " << evictions << " evict+replace, " << restarts_seen << " restarts, " << escalations
                                 << " escalations");
}
