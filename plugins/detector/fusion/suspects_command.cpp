#include "suspects_command.hpp"

#include "fusion_json.hpp"

#include "command_line.hpp"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <new>
#include <string>

namespace ballast::fusion {

namespace {

const char* kDescription =
    "Replays recorded events (JSON lines; a journal through `ballast journal cat FILE --json`)\n"
    "through the suspect fusion: fault.suspected, fault.confirmed, node.silent (machine and hang\n"
    "detectors), straggler.report (culprit ranks), placement.plan (ranks to nodes). Prints the\n"
    "job's suspects ranked, each with every detector's evidence; --json prints each change of\n"
    "the ranking as a suspects.ranking event (JSON lines), the last one being the final list.";

constexpr size_t kMaxLine = 16u << 20;  // one event line
constexpr size_t kMaxDepth = 64;        // nesting of one event

int run(int argc, char** argv) {
  std::string path;
  bool json = false;
  FusionConfig config;
  CLI::App app(kDescription, "ballast suspects");
  app.add_option("--events", path, "the events, JSON lines (- for stdin)")->required();
  app.add_flag("--json", json, "each change of the ranking as a JSON line");
  app.add_option("--min-score", config.min_score, "least score of a suspect listed")->check(util::NumberIn(0, 1e12));
  app.add_option("--half-life", config.half_life_s, "seconds for evidence to lose half its weight")
      ->check(util::NumberIn(0, 1e12));
  if (int rc = util::parse_command_line(app, argc, argv); rc >= 0) return rc;
  std::ifstream file;
  if (path != "-") {
    file.open(path, std::ios::binary);
    if (!file) {
      std::fprintf(stderr, "ballast suspects: %s: cannot open: %s\n", path.c_str(), std::strerror(errno));
      return 1;
    }
  }
  std::istream& in = path == "-" ? std::cin : file;
  Fusion fusion(config);
  std::string line, last_key, error;
  int64_t now = 0;
  size_t lineno = 0, events = 0;
  auto fail = [&](const std::string& what) {
    std::fprintf(stderr, "ballast suspects: %s:%zu: %s\n", path.c_str(), lineno, what.c_str());
    return 1;
  };
  while (std::getline(in, line)) {
    ++lineno;
    if (line.size() > kMaxLine) return fail("line longer than 16 MiB");
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (json_depth(line) > kMaxDepth) return fail("JSON nested deeper than 64 levels");
    nlohmann::json ev;
    try {
      ev = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      return fail(std::string("not JSON: ") + e.what());  // position, number out of range, ...
    }
    if (!feed_event(ev, &fusion, &error)) return fail(error);
    ++events;
    if (ev.is_object() && ev.contains("ts") && ev["ts"].is_number()) {
      double ts = ev["ts"].get<double>() * 1e9;
      if (std::isfinite(ts) && ts > static_cast<double>(now) && ts < 9e18) now = static_cast<int64_t>(ts);
    }
    auto ranking = fusion.ranking(now);
    std::string key = ranking_key(ranking);
    if (json && key != last_key) {
      nlohmann::json out = {{"topic", "suspects.ranking"},
                            {"ts", static_cast<double>(now) / 1e9},
                            {"source", {{"plugin", "fusion"}}},
                            {"payload", ranking_json(ranking, now)}};
      std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    }
    last_key = key;
  }
  if (in.bad()) return fail(std::string("cannot read: ") + std::strerror(errno));
  if (json) return 0;
  auto ranking = fusion.ranking(now);
  std::printf("%zu suspect(s) from %zu events\n", ranking.size(), events);
  int k = 0;
  for (const Suspect& s : ranking) {
    std::printf("%2d. %-20s score %.2f%s since %.3f\n", ++k, s.node.c_str(), s.score, s.alerting ? " ALERT" : "      ",
                static_cast<double>(s.since_ns) / 1e9);
    for (const Evidence& e : s.evidence)
      std::printf("      %-10s %-10s %s%s weight %.2f (score %.3g)\n", e.from.detector.c_str(), e.from.kind.c_str(),
                  e.from.metric.c_str(), e.from.confirmed ? " confirmed" : "", e.weight, e.from.score);
  }
  return 0;
}

}  // namespace

int suspects_main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "ballast suspects: out of memory\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ballast suspects: internal error: %s\n", e.what());
  }
  return 1;
}

}  // namespace ballast::fusion
