// bench_e2e: the whole loop, measured. `ballast run` with the bundled
// trainer at 4 ranks, the hang detector, the placement plugin and the
// default policy; one fault injected per run, repeated per fault kind. Per
// kind: detection latency (injection -> first report), decision latency
// (report -> the policy's action), recovery time (report -> the first step
// trained after the recovery), steps lost; medians and maxima. Then the
// default demonstration (examples/configs/demo.lua), --demo-repeats times
// (1), for its ETTR, its seconds lost and each fault's time to the first new
// step (medians). More kinds, not run by default: `slow` (rank 1
// at a fifth of its speed, the straggler analysis loaded, 600 steps), `skip`
// (rank 2 leaves a collective out) and `net` (root: node1's link degraded in
// job.netns, the machine detector loaded, 10000 steps, the fault 8 s after
// the start, once the detector's warm-up is over).
//
//   bench_e2e [--repeats N] [--kinds crash,hang,nan,slow,skip,net] [--stall SECONDS] [--no-demo] [--demo-repeats N]
//
// Prints JSON lines {"bench","case","metric","value","unit"}.
#include "command_line.hpp"

#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace {

namespace fs = std::filesystem;

nlohmann::json run_ballast(const std::string& args, const std::string& dir) {
  const std::string cmd = std::string(BENCH_E2E_BALLAST) + " run " + args + " --json 2>" + dir + "/stderr.log";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return nullptr;
  std::string out;
  std::array<char, 4096> buf;
  for (size_t n; (n = fread(buf.data(), 1, buf.size(), p)) > 0;) out.append(buf.data(), n);
  pclose(p);
  return nlohmann::json::parse(out, nullptr, false);
}

// One fault kind's run: the injection, the job's length, and what the
// config needs beside the executor, the hang detector and the placement
// plugin.
struct Kind {
  std::string spec;
  int steps = 200;
  std::string plugins;  // more plugins, Lua
  std::string job;      // more job fields, Lua
};

std::string config(const std::string& dir, double stall, const Kind& k) {
  const std::string path = dir + "/job.lua";
  std::ofstream(path) << "return {\n  plugins = { 'runner', { path = 'hang', config = { stall_seconds = " << stall
                      << ", period_seconds = 0.2 } }, 'scheduler', " << k.plugins
                      << " },\n"
                         "  job = { command = { '" BENCH_E2E_TRAINER "', '--steps', '"
                      << k.steps
                      << "', '--checkpoint-every', '20', "
                         "'--log-every', '1000' }, ranks = 4, standby = 1, progress = false, dir = '"
                      << dir << "/job', " << k.job
                      << " },\n  policy = { script = '" BENCH_E2E_POLICY "', fallback = 'escalate' },\n}\n";
  return path;
}

double median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void emit(const std::string& c, const std::string& metric, double value, const char* unit) {
  std::printf("%s\n",
              nlohmann::json{{"bench", "e2e"}, {"case", c}, {"metric", metric}, {"value", value}, {"unit", unit}}
                  .dump()
                  .c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 5;
  double stall = 3;
  bool demo = true;
  int demo_repeats = 1;
  std::vector<std::string> kinds = {"crash", "hang", "nan"};
  bool no_demo = false;
  CLI::App app(
      "The whole loop: `ballast run` with the bundled trainer, one fault per run; detection, decision "
      "and recovery times, steps lost, then the demonstration's ETTR. JSON lines on stdout.",
      "bench_e2e");
  app.add_option("--repeats", repeats, "runs per fault kind (default 5)")->check(CLI::PositiveNumber);
  app.add_option("--kinds", kinds, "fault kinds (default crash,hang,nan; also slow, skip, net)")
      ->delimiter(',')
      ->check(CLI::IsMember({"crash", "hang", "nan", "slow", "skip", "net"}));
  app.add_option("--stall", stall, "the hang detector's stall, seconds (default 3)")->check(CLI::PositiveNumber);
  app.add_flag("--no-demo", no_demo, "skip the demonstration");
  app.add_option("--demo-repeats", demo_repeats, "runs of the demonstration (default 1)")->check(CLI::PositiveNumber);
  if (int rc = ballast::util::parse_command_line(app, argc, argv); rc >= 0) return rc;
  demo = !no_demo;
  const char* tmp = std::getenv("TMPDIR");
  const std::string root = std::string(tmp ? tmp : "/tmp") + "/bench-e2e";
  // The fault hits mid-run, at a step between two checkpoints (every 20).
  // The straggler analysis as the demonstration runs it (a clear slowdown only).
  const std::string straggler =
      "{ path = 'straggler', config = { window_steps = 50, report_every = 50, min_slowdown = 2 } }";
  const std::map<std::string, Kind> spec = {{"crash", {"crash:rank=1@step75", 200, "", ""}},
                                            {"hang", {"hang:rank=2@step75", 200, "", ""}},
                                            {"nan", {"nan@75", 200, "", ""}},
                                            {"slow", {"slow:rank=1,factor=5@step75", 600, straggler, ""}},
                                            {"skip", {"skip:rank=2@step75", 200, "", ""}},
                                            {"net", {"machine:node=1,kind=net@8", 10000, "'machine'", "netns = true"}}};
  for (const auto& kind : kinds) {
    if (!spec.count(kind)) {
      std::fprintf(stderr, "bench_e2e: unknown kind %s\n", kind.c_str());
      return 2;
    }
    std::map<std::string, std::vector<double>> m;
    int ok = 0, right = 0;
    for (int r = 0; r < repeats; ++r) {
      const std::string dir = root + "/" + kind + "-" + std::to_string(r);
      fs::remove_all(dir);
      fs::create_directories(dir);
      const nlohmann::json rep =
          run_ballast(config(dir, stall, spec.at(kind)) + " --inject '" + spec.at(kind).spec + "'", dir);
      if (!rep.is_object() || rep["incidents"].size() != 1) {
        std::fprintf(stderr, "bench_e2e: %s run %d: no single incident (see %s)\n", kind.c_str(), r, dir.c_str());
        continue;
      }
      const auto& i = rep["incidents"][0];
      ok += rep["state"] == "finished" && i["outcome"] == "recovered";
      const std::string verdict = i["verdict"].is_string() ? i["verdict"].get<std::string>() : "";
      right += (kind == "crash" && verdict == "crashed rank:1") ||
               (kind == "hang" && verdict.find("rank:2") != std::string::npos) ||
               (kind == "nan" && verdict.rfind("nan ", 0) == 0) || (kind == "net" && verdict == "outlier node1") ||
               (kind == "slow" && verdict == "straggler rank:1") ||
               (kind == "skip" && i["message"].is_string() &&
                i["message"].get<std::string>().find("rank 2 at step") != std::string::npos);
      for (const char* f : {"detection_latency_s", "decision_latency_s", "recovery_s"})
        if (i[f].is_number()) m[f].push_back(i[f].get<double>());
      if (i["injected_s"].is_number() && i["resumed_s"].is_number())
        m["fault_to_first_new_step_s"].push_back(i["resumed_s"].get<double>() - i["injected_s"].get<double>());
      m["steps_lost"].push_back(i["steps_lost"].get<double>());
      m["ettr"].push_back(rep["ettr"].get<double>());
    }
    emit(kind, "runs_recovered", ok, "runs");
    emit(kind, "runs_right_verdict", right, "runs");
    emit(kind, "runs", repeats, "runs");
    for (const auto& [name, v] : m) {
      const char* unit = name == "steps_lost" ? "steps" : name == "ettr" ? "ratio" : "s";
      emit(kind, name + "_median", median(v), unit);
      emit(kind, name + "_max", v.empty() ? -1 : *std::max_element(v.begin(), v.end()), unit);
    }
  }
  if (demo) {
    // The demonstration, demo_repeats times: ETTR, wall time and the time
    // lost (wall - kept steps), medians; each fault kind's time from the
    // fault to the first new step, so that the lost time can be placed.
    std::vector<double> ettr, wall, lost;
    std::map<std::string, std::vector<double>> to_step;  // fault kind ("crash") -> seconds
    int finished = 0, incidents = 0, recovered = 0;
    for (int r = 0; r < demo_repeats; ++r) {
      const std::string dir = root + "/demo";
      fs::remove_all(dir);
      fs::create_directories(dir);
      const nlohmann::json rep = run_ballast(std::string(BENCH_E2E_DEMO), dir);
      if (!rep.is_object()) {
        std::fprintf(stderr, "bench_e2e: the demonstration gave no report (see %s)\n", dir.c_str());
        continue;
      }
      emit("demo", "ettr_run", rep["ettr"].get<double>(), "ratio");  // each run, as it ends
      ettr.push_back(rep["ettr"].get<double>());
      wall.push_back(rep["wall_s"].get<double>());
      lost.push_back(rep["wall_s"].get<double>() - rep["kept_step_s"].get<double>());
      incidents += int(rep["incidents"].size());
      for (const auto& i : rep["incidents"]) {
        recovered += i["outcome"] == "recovered";
        const std::string fault = i["fault"].get<std::string>();
        if (i["injected_s"].is_number() && i["resumed_s"].is_number())
          to_step[fault.substr(0, fault.find_first_of(":@"))].push_back(i["resumed_s"].get<double>() -
                                                                        i["injected_s"].get<double>());
      }
      finished += rep["state"] == "finished";
    }
    if (!ettr.empty()) {
      emit("demo", "ettr_median", median(ettr), "ratio");
      emit("demo", "ettr_min", *std::min_element(ettr.begin(), ettr.end()), "ratio");
      emit("demo", "wall_s_median", median(wall), "s");
      emit("demo", "lost_s_median", median(lost), "s");
      for (const auto& [kind, v] : to_step) emit("demo", kind + "_fault_to_first_new_step_s_median", median(v), "s");
      emit("demo", "incidents", incidents, "incidents");
      emit("demo", "incidents_recovered", recovered, "incidents");
      emit("demo", "runs_finished", finished, "runs");
      emit("demo", "runs", demo_repeats, "runs");
    }
  }
  return 0;
}
