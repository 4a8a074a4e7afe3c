#include "analysis.hpp"
#include "commands.hpp"
#include "heartbeat.hpp"
#include "launch_record.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

namespace ballast::hang {

int analyze_main(int argc, char** argv) {
  std::string dir, chrome;
  bool json = false;
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") json = true;
    else if (a == "--chrome" && i + 1 < argc) chrome = argv[++i];
    else if (a == "--slow-ms" && i + 1 < argc) opt.slow_ms = std::atof(argv[++i]);
    else if (a == "-h" || a == "--help") {
      std::printf("usage: %s DIR [--json] [--chrome FILE] [--slow-ms N]\n"
                  "Root cause of a hung, failed, mismatched or slow collective from the trace rings in DIR.\n",
                  argv[0]);
      return 0;
    } else if (!a.empty() && a[0] != '-' && dir.empty()) dir = a;
    else {
      std::fprintf(stderr, "%s: unexpected argument '%s' (usage: %s DIR [--json] [--chrome FILE] [--slow-ms N])\n",
                   argv[0], a.c_str(), argv[0]);
      return 2;
    }
  }
  if (dir.empty()) {
    std::fprintf(stderr, "%s: missing DIR, the folder of the *.btrace rings (BALLAST_TRACE_DIR)\n", argv[0]);
    return 2;
  }
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
    for (const auto& e : errors) std::fprintf(stderr, "%s: %s\n", argv[0], e.c_str());
    std::fprintf(stderr, "%s: no readable trace ring (*.btrace) or heartbeat (*.heartbeat) in %s\n", argv[0], dir.c_str());
    return 2;
  }
  Verdict v = !rings.empty() ? analyze(rings, opt) : analyze_heartbeats(beats, states);
  for (const auto& e : errors) v.warnings.push_back(e);
  if (!chrome.empty()) {
    std::ofstream f(chrome);
    f << chrome_trace(rings);
    if (!f) {
      std::fprintf(stderr, "%s: cannot write %s\n", argv[0], chrome.c_str());
      return 2;
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
