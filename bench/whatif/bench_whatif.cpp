// bench_whatif: time of the whole what-if analysis (read + S + every
// attribution + M_W + M_S) of the AR and ST traces, and how it grows with
// ranks and steps on synthetic traces scaled up from AR.
//
// bench_whatif [--repeat N] [--data DIR]
// Prints one JSON object per line; values are medians of N runs. The peer is
// the published Python tool of arXiv 2505.05713 (about 1.8 s for AR on this
// kind of machine): it is not available here, so its figure is quoted.
#include "command_line.hpp"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "trace.hpp"
#include "whatif.hpp"

using namespace ballast::straggler;

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// CPU time of this thread: what "one core" costs, whatever else the shared machine runs.
double cpu_ms() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void emit(const std::string& c, const char* metric, double value, const char* unit, const std::string& extra = "") {
  std::printf("{\"bench\":\"whatif\",\"case\":\"%s\",\"metric\":\"%s\",\"value\":%.6g,\"unit\":\"%s\"%s}\n", c.c_str(),
              metric, value, unit, extra.c_str());
  std::fflush(stdout);
}

// The whole job of `ballast whatif` on a file, minus printing.
void real_trace(const std::string& dir, const std::string& name, int repeat) {
  std::vector<double> read, analysis, total, wall;
  WhatIfResult r;
  for (int i = 0; i < repeat; ++i) {
    auto w0 = Clock::now();
    double t0 = cpu_ms();
    Meta meta = read_meta(dir + "/" + name + "/meta.yaml");
    Trace trace = read_trace(dir + "/" + name + "/trace.csv.gz");
    double t1 = cpu_ms();
    r = analyze(trace, meta);
    double t2 = cpu_ms();
    wall.push_back(ms_since(w0));
    read.push_back(t1 - t0);
    analysis.push_back(t2 - t1);
    total.push_back(t2 - t0);
  }
  std::string ops = ",\"ops\":" + std::to_string(r.rows) + ",\"ranks\":" + std::to_string(r.ranks) +
                    ",\"steps\":" + std::to_string(r.steps.size());
  emit(name, "read_cpu_ms", median(read), "ms", ops);
  emit(name, "analysis_cpu_ms", median(analysis), "ms", ops);
  emit(name, "total_cpu_ms", median(total), "ms", ops);
  emit(name, "total_wall_ms", median(wall), "ms", ops);
  emit(name, "slowdown", r.slowdown, "x");
  emit(name, "mw", r.mw.removed, "share");
  emit(name, "ms", r.ms.removed, "share");
  if (name == "AR") {
    emit(name, "python_reference_ms", 1800, "ms",
         ",\"note\":\"published figure of the artifact's tool, not run here\"");
    emit(name, "speedup_vs_python", 1800 / median(total), "x");
  }
}

// AR with its DP ranks and steps replicated: the same schedule, more lanes.
Trace scaled(const Trace& base, int dp, int dp_factor, int step_factor) {
  Trace t;
  t.source = "synthetic";
  t.rows.reserve(base.rows.size() * dp_factor * step_factor);
  for (int k = 0; k < dp_factor; ++k) {
    for (int j = 0; j < step_factor; ++j) {
      for (TraceRow r : base.rows) {
        r.dp_rank += k * dp;
        r.rank += k * 1000000;
        r.step += static_cast<int64_t>(j) * 1000000;
        t.rows.push_back(r);
      }
    }
  }
  return t;
}

std::string to_csv(const Trace& t) {
  std::string s = "dp_rank,stage,rank,step,optype,start_ts,duration,seq_id,mc,mb_id,gmc\n";
  char line[256];
  for (const TraceRow& r : t.rows) {
    std::snprintf(line, sizeof line, "%d,%d,%d,%lld,%s,%.17g,%.17g,%d,%d,%d,%d\n", r.dp_rank, r.stage, r.rank,
                  static_cast<long long>(r.step), std::string(optype_name(r.optype)).c_str(), r.start, r.duration,
                  r.seq_id, r.mc, r.mb_id, r.gmc);
    s += line;
  }
  return s;
}

void scaling(const std::string& dir, int repeat) {
  Trace ar = read_trace(dir + "/AR/trace.csv.gz");
  Meta meta = read_meta(dir + "/AR/meta.yaml");
  const std::pair<int, int> factors[] = {{1, 1}, {2, 1}, {4, 1}, {1, 2}, {1, 4}, {4, 4}};
  for (auto [fd, fs] : factors) {
    Trace t = scaled(ar, meta.dp, fd, fs);
    Meta m = meta;
    m.dp = meta.dp * fd;
    m.world = 0;
    std::string csv = to_csv(t);
    std::vector<double> parse, analysis;
    WhatIfResult r;
    int n = std::max(3, repeat / (fd * fs));
    for (int i = 0; i < n; ++i) {
      double t0 = cpu_ms();
      Trace parsed = parse_trace_csv(csv, "synthetic");
      double t1 = cpu_ms();
      r = analyze(parsed, m);
      parse.push_back(t1 - t0);
      analysis.push_back(cpu_ms() - t1);
    }
    std::string c = "AR-dp" + std::to_string(fd) + "x-steps" + std::to_string(fs) + "x";
    std::string extra = ",\"ops\":" + std::to_string(r.rows) + ",\"ranks\":" + std::to_string(r.ranks) +
                        ",\"steps\":" + std::to_string(r.steps.size());
    emit(c, "parse_cpu_ms", median(parse), "ms", extra);
    emit(c, "analysis_cpu_ms", median(analysis), "ms", extra);
    emit(c, "analysis_ns_per_op", median(analysis) * 1e6 / static_cast<double>(r.rows), "ns", extra);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int repeat = 15;
  std::string dir = std::string(BALLAST_SOURCE_DIR) + "/tests/data/stragglers";
  CLI::App app(
      "Time of the whole what-if analysis of the AR and ST traces, and how it grows with ranks and steps; "
      "JSON lines on stdout (docs/benchmarks.md).",
      "bench_whatif");
  app.add_option("--repeat", repeat, "runs per trace (default 15)")->check(CLI::PositiveNumber);
  app.add_option("--data", dir, "folder of the traces");
  if (int rc = ballast::util::parse_command_line(app, argc, argv); rc >= 0) return rc;
  try {
    real_trace(dir, "AR", repeat);
    real_trace(dir, "ST", repeat * 4);
    scaling(dir, repeat);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_whatif: %s\n", e.what());
    return 1;
  }
  return 0;
}
