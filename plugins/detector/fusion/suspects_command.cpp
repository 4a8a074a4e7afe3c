#include "suspects_command.hpp"

#include "fusion_json.hpp"

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

const char* kUsage =
    "usage: ballast suspects --events FILE|- [--json] [--min-score X] [--half-life S]\n"
    "Replays recorded events (JSON lines; a journal through `ballast journal cat FILE --json`)\n"
    "through the suspect fusion: fault.suspected, fault.confirmed, node.silent (machine and hang\n"
    "detectors), straggler.report (culprit ranks), placement.plan (ranks to nodes). Prints the\n"
    "job's suspects ranked, each with every detector's evidence; --json prints each change of\n"
    "the ranking as a suspects.ranking event (JSON lines), the last one being the final list.\n";

constexpr size_t kMaxLine = 16u << 20;  // one event line
constexpr size_t kMaxDepth = 64;        // nesting of one event

bool number_arg(const char* flag, const char* text, double min, double* out) {
  char* end = nullptr;
  double v = std::strtod(text, &end);
  if (end == text || *end || !(v >= min) || v > 1e12) {
    std::fprintf(stderr, "ballast suspects: %s: expected a number >= %g, got '%s'\n", flag, min, text);
    return false;
  }
  *out = v;
  return true;
}

int run(int argc, char** argv) {
  std::string path;
  bool json = false;
  FusionConfig config;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json") {
      json = true;
    } else if (a == "--events" && i + 1 < argc) {
      path = argv[++i];
    } else if (a == "--min-score" && i + 1 < argc) {
      if (!number_arg("--min-score", argv[++i], 0, &config.min_score)) return 2;
    } else if (a == "--half-life" && i + 1 < argc) {
      if (!number_arg("--half-life", argv[++i], 0, &config.half_life_s)) return 2;
    } else if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else {
      std::fprintf(stderr, "ballast suspects: unexpected argument '%s'\n%s", a.c_str(), kUsage);
      return 2;
    }
  }
  if (path.empty()) {
    std::fprintf(stderr, "ballast suspects: --events FILE is required\n%s", kUsage);
    return 2;
  }
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
      nlohmann::json out = {{"topic", "suspects.ranking"}, {"ts", static_cast<double>(now) / 1e9},
                            {"source", {{"plugin", "fusion"}}}, {"payload", ranking_json(ranking, now)}};
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
    std::printf("%2d. %-20s score %.2f%s since %.3f\n", ++k, s.node.c_str(), s.score,
                s.alerting ? " ALERT" : "      ", static_cast<double>(s.since_ns) / 1e9);
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
