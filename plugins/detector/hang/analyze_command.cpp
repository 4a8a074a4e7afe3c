#include "analysis.hpp"
#include "hang_commands.hpp"
#include "heartbeat.hpp"
#include "launch_record.hpp"

#include "command_line.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <string>

namespace ballast::hang {

int analyze_main(int argc, char** argv) {
  CLI::App app("Root cause of a hung, failed, mismatched or slow collective from the trace rings in DIR.",
               "ballast analyze");
  std::string dir, chrome;
  bool json = false;
  Options opt;
  app.add_option("DIR", dir, "the folder of the *.btrace rings (BALLAST_TRACE_DIR)")->required();
  app.add_flag("--json", json, "print one JSON object");
  app.add_option("--chrome", chrome, "write a Chrome/Perfetto trace of the rings");
  app.add_option("--slow-ms", opt.slow_ms,
                 "a rank entering collectives this much later than the others is slow (default 1000)")
      ->check(CLI::PositiveNumber);
  if (int rc = util::parse_command_line(app, argc, argv); rc >= 0) return rc;
  std::vector<std::string> errors;
  auto rings = read_dir(dir, &errors);
  // A job `ballast launch` stopped: the ranks it ended itself are analysed
  // in the state it found them in when it gave its verdict, not as the
  // processes it killed afterwards.
  LaunchRecord launch;
  std::string launch_err;
  const bool launched = read_launch_record(dir, &launch, &launch_err);
  if (!launch_err.empty()) errors.push_back(launch_err);
  const auto states = launched ? states_at_verdict(launch) : std::map<int, ProcState>{};
  for (auto& r : rings)
    if (const auto it = states.find(r.header.rank); it != states.end()) r.state = it->second;
  const auto beats = rings.empty() ? read_heartbeats(dir, &errors) : std::vector<Heartbeat>{};
  if (rings.empty() && beats.empty()) {
    for (const auto& e : errors) std::fprintf(stderr, "ballast analyze: %s\n", e.c_str());
    std::fprintf(stderr, "ballast analyze: no readable trace ring (*.btrace) or heartbeat (*.heartbeat) in %s\n",
                 dir.c_str());
    return 1;
  }
  Verdict v = !rings.empty() ? analyze(rings, opt) : analyze_heartbeats(beats, states);
  for (const auto& e : errors) v.warnings.push_back(e);
  if (!chrome.empty()) {
    std::ofstream f(chrome);
    f << chrome_trace(rings);
    if (!f) {
      std::fprintf(stderr, "ballast analyze: cannot write %s\n", chrome.c_str());
      return 1;
    }
  }
  if (json) {
    auto j = nlohmann::json::parse(v.to_json());
    if (launched) j["launch"] = nlohmann::json::parse(launch_summary_json(launch));
    std::fputs((j.dump() + "\n").c_str(), stdout);
  } else {
    std::fputs(((launched ? launch_summary(launch) : "") + v.to_text()).c_str(), stdout);
  }
  return v.verdict == "healthy" ? 0 : 1;
}

}  // namespace ballast::hang
