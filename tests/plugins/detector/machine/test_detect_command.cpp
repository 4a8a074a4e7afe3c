// `ballast detect`: the CSV reader's errors, the --config subset and a
// replay end to end through detect_main (stdout captured in a file).
#include <doctest/doctest.h>

#include "detect_command.hpp"
#include "detector_config.hpp"
#include "metrics_csv.hpp"

#include <unistd.h>
#include <zlib.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

using namespace ballast::machine;

namespace {

using ConfigText = std::map<std::string, std::string>;

// Every file a test writes, removed at exit.
struct TempFiles {
  std::vector<std::string> paths;
  ~TempFiles() {
    for (const auto& p : paths) std::remove(p.c_str());
  }
} temp_files;

std::string temp_path(const std::string& name) {
  std::string p = "machine_cmd_" + std::to_string(getpid()) + "_" + name;
  temp_files.paths.push_back(p);
  return p;
}

std::string write_file(const std::string& name, const std::string& text) {
  std::string p = temp_path(name);
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

std::string write_gz(const std::string& name, const std::string& text) {
  std::string p = temp_path(name);
  gzFile f = gzopen(p.c_str(), "wb");
  gzwrite(f, text.data(), static_cast<unsigned>(text.size()));
  gzclose(f);
  return p;
}

std::string read_error(const std::string& path) {
  MetricsTable t;
  std::string error;
  CHECK_FALSE(read_metrics_csv(path, &t, &error));
  return error;
}

// A job of 8 machines, 40 s at 1 s; node3's CPU drops at t=20.
std::string job_csv() {
  std::mt19937 rng(7);
  std::normal_distribution<double> noise(0, 2);
  std::ostringstream s;
  s << "ts,node,metric,value\n";
  for (int t = 0; t < 40; ++t)
    for (int i = 0; i < 8; ++i) {
      double v = (i == 3 && t >= 20 ? 15 : 90) + noise(rng);
      s << 1700000000 + t << ".00" << i << ",node" << i << ",proc.cpu," << v << "\n";
    }
  return s.str();
}

// Runs detect_main with stdout redirected to a file; returns {code, output}.
std::pair<int, std::string> run_detect(std::vector<std::string> args) {
  args.insert(args.begin(), "ballast detect");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::string out = temp_path("stdout");
  std::fflush(stdout);
  int saved = dup(1);
  FILE* f = std::fopen(out.c_str(), "w");
  dup2(fileno(f), 1);
  int code = detect_main(static_cast<int>(args.size()), argv.data());
  std::fflush(stdout);
  dup2(saved, 1);
  close(saved);
  std::fclose(f);
  std::ifstream in(out);
  std::stringstream ss;
  ss << in.rdbuf();
  std::remove(out.c_str());
  return {code, ss.str()};
}

}  // namespace

TEST_CASE("CSV errors name the file, the line and the column") {
  std::string p = write_file("nocol.csv", "ts,node,value\n1,a,2\n");
  CHECK(read_error(p) ==
        p + ":1: missing column 'metric' in the header 'ts,node,value' (expected ts,node,metric,value)");
  p = write_file("nan.csv", "ts,node,metric,value\n1,a,cpu,2\n2,a,cpu,nan\n");
  CHECK(read_error(p) == p + ":3: column 4 (value): not a finite number: 'nan'");
  p = write_file("text.csv", "ts,node,metric,value\n1,a,cpu,2\nx,a,cpu,3\n");
  CHECK(read_error(p) == p + ":3: column 1 (ts): not a number: 'x'");
  p = write_file("short.csv", "ts,node,metric,value\n1,a,cpu\n");
  CHECK(read_error(p) == p + ":2: expected 4 columns, found 3");
  p = write_file("back.csv", "ts,node,metric,value\n5,a,cpu,1\n5,b,cpu,1\n4,b,cpu,1\n");
  CHECK(read_error(p).rfind(p + ":4: column 1 (ts): time goes backwards for node 'b': 4 after 5", 0) == 0);
  p = write_file("empty.csv", "");
  CHECK(read_error(p) == p + ": empty file: expected a header ts,node,metric,value");
  CHECK(read_error(temp_path("missing.csv")).find("cannot open") != std::string::npos);
}

TEST_CASE("a truncated gzip stream is an error naming the file and the line") {
  std::string full = write_gz("full.csv.gz", job_csv());
  MetricsTable t;
  std::string error;
  REQUIRE(read_metrics_csv(full, &t, &error));
  CHECK(t.rows.size() == 320);
  CHECK(t.nodes.size() == 8);
  std::ifstream in(full, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string cut = write_file("cut.csv.gz", bytes.substr(0, bytes.size() / 2));
  std::string e = read_error(cut);
  CHECK(e.rfind(cut + ":", 0) == 0);
  CHECK(e.find("truncated gzip stream") != std::string::npos);
}

TEST_CASE("columns may come in any order and extra columns are ignored") {
  std::string p = write_file("order.csv", "value,metric,extra,node,ts\n3.5,cpu,x,a,1.25\n");
  MetricsTable t;
  std::string error;
  REQUIRE(read_metrics_csv(p, &t, &error));
  REQUIRE(t.rows.size() == 1);
  CHECK(t.rows[0].ts_ns == 1250000000);
  CHECK(t.rows[0].value == 3.5);
  CHECK(t.nodes[0] == "a");
}

TEST_CASE("detect --json prints one object per alert with the time it is raised, then a summary") {
  std::string csv = write_gz("job.csv.gz", job_csv());
  auto [code, out] = run_detect({"--metrics", csv, "--json"});
  CHECK(code == 0);
  std::istringstream lines(out);
  std::string line;
  std::vector<nlohmann::json> alerts;
  while (std::getline(lines, line)) alerts.push_back(nlohmann::json::parse(line));
  REQUIRE(alerts.size() == 2);
  CHECK(alerts[0]["node"] == "node3");
  CHECK(alerts[0]["metric"] == "proc.cpu");
  CHECK(alerts[0]["kind"] == "outlier");
  CHECK(alerts[0]["score"].get<double>() > 4);
  // Fault at t=20: the median of the last 3 rounds flips at the 2nd faulty
  // round, 21 (the time of the round's last sample, node7's at .007).
  CHECK(alerts[0]["ts"].get<double>() == doctest::Approx(1700000021.007).epsilon(1e-12));
  CHECK(alerts[1]["kind"] == "summary");
  CHECK(alerts[1]["alerts"] == 1);
  CHECK(alerts[1]["series_checked"] == 8);
  CHECK(alerts[1]["series_ignored"] == 0);
  CHECK_FALSE(alerts[1].contains("warning"));
}

TEST_CASE("detect reads its settings from --config and reports bad ones") {
  std::string csv = write_file("job.csv", job_csv());
  // A threshold no machine reaches: no alert.
  std::string cfg = write_file("cfg.lua",
                               "-- detector settings\nreturn {\n  threshold = 1e9, window = 3,\n"
                               "  metrics = { 'proc.*' }; continuity = 2,\n}\n");
  auto [code, out] = run_detect({"--metrics", csv, "--config", cfg});
  CHECK(code == 0);
  CHECK(out.find("0 alert(s)") != std::string::npos);
  // Human output names the machine.
  auto [code2, out2] = run_detect({"--metrics", csv});
  CHECK(code2 == 0);
  CHECK(out2.find("node3") != std::string::npos);
  CHECK(out2.find("1 alert(s)") != std::string::npos);
  std::string bad = write_file("bad.lua", "return {\n  window = 3,\n  threshold = os.exit(),\n}\n");
  auto [code3, out3] = run_detect({"--metrics", csv, "--config", bad});
  CHECK(code3 == 1);
  // A minimum deviation no machine reaches, as a nested table.
  std::string dev = write_file("dev.lua", "return { min_deviation = { [\"proc.cpu\"] = 1000 } }");
  auto [code4, out4] = run_detect({"--metrics", csv, "--config", dev});
  CHECK(code4 == 0);
  CHECK(out4.find("0 alert(s)") != std::string::npos);
  std::string typo = write_file("typo.lua", "return { windw = 3 }");
  CHECK(run_detect({"--metrics", csv, "--config", typo}).first == 1);
  CHECK(run_detect({"--config", typo}).first == 2);
  CHECK(run_detect({"--metrics", temp_path("nope.csv")}).first == 1);
}

TEST_CASE("--config is real Lua, evaluated as ballast run evaluates a config") {
  DetectorConfig c;
  std::string error;
  // Locals, arithmetic and string functions: what the old Lua subset refused.
  const std::string lua = write_file("real.lua",
                                     "local t = 3\n"
                                     "local names = {}\n"
                                     "for _, n in ipairs({'util', 'power'}) do names[#names + 1] = 'gpu*.' .. n end\n"
                                     "return { window = t * 2, continuity = t, metrics = names, hold_peers = false,\n"
                                     "         min_deviation = { ['proc.cpu'] = 2 ^ 3 } }\n");
  REQUIRE_MESSAGE(load_config_file(lua, &c, &error), error);
  CHECK(c.window_s == 6);
  CHECK(c.continuity == 3);
  CHECK(c.metrics == std::vector<std::string>{"gpu*.util", "gpu*.power"});
  CHECK_FALSE(c.hold_peers);
  CHECK(c.min_deviation.front() == std::make_pair(std::string("proc.cpu"), 8.0));
  // The sandbox: no os, io, load or require; the error names the file and line.
  const std::string os = write_file("os.lua", "return {\n  window = 3,\n  threshold = os.exit(),\n}\n");
  CHECK_FALSE(load_config_file(os, &c, &error));
  CHECK(error.find(os + ":3: attempt to index a nil value (global 'os')") == 0);
  const std::string io = write_file("io.lua", "local f = io.open('/etc/passwd')\nreturn {}\n");
  CHECK_FALSE(load_config_file(io, &c, &error));
  CHECK(error.find(io + ":1:") == 0);
  // A loop ends at the deadline; memory ends at the cap.
  const std::string loop = write_file("loop.lua", "while true do end\n");
  CHECK_FALSE(load_config_file(loop, &c, &error));
  CHECK(error.find("ran longer than 1000 ms") != std::string::npos);
  const std::string big = write_file("big.lua", "local s = string.rep('x', 1 << 26)\nreturn { window = #s }\n");
  CHECK_FALSE(load_config_file(big, &c, &error));
  CHECK(error.find("not enough memory") != std::string::npos);
  // What a config cannot hold, named by its key path.
  const std::string fn = write_file("fn.lua", "return { metrics = { 'a', function() end } }\n");
  CHECK_FALSE(load_config_file(fn, &c, &error));
  CHECK(error == fn + ": metrics[2]: a function is not a configuration value");
  const std::string cyc = write_file("cycle.lua", "local t = {}\nt.self = t\nreturn { min_deviation = t }\n");
  CHECK_FALSE(load_config_file(cyc, &c, &error));
  CHECK(error == cyc + ": min_deviation.self: a table that contains itself");
  const std::string none = write_file("none.lua", "local x = 1\n");
  CHECK_FALSE(load_config_file(none, &c, &error));
  CHECK(error == none + ": the file must return a table; it returns nothing");
  const std::string syntax = write_file("syntax.lua", "return { a = 'x }\n");
  CHECK_FALSE(load_config_file(syntax, &c, &error));
  CHECK(error.find(syntax + ":1:") == 0);
  const std::string typo = write_file("typo2.lua", "return { windw = 3 }\n");
  CHECK_FALSE(load_config_file(typo, &c, &error));
  CHECK(error == typo + ": unknown key 'windw'");
}

TEST_CASE("apply_config: each key's value checked, named on error") {
  ConfigText t;
  std::string error;
  DetectorConfig c;
  auto get = [&](const std::string& k, std::string* v) {
    auto it = t.find(k);
    if (it == t.end()) return false;
    *v = it->second;
    return true;
  };
  t = {{"threshold", "-1"}};
  CHECK_FALSE(apply_config(get, &c, &error));
  CHECK(error.find("'threshold'") != std::string::npos);
  t = {{"min_deviation", "{\"net.tcp.retrans\": 5}"}};
  REQUIRE(apply_config(get, &c, &error));
  CHECK(c.min_deviation.front() == std::make_pair(std::string("net.tcp.retrans"), 5.0));
  t = {{"min_deviation", "{\"x\": -2}"}};
  CHECK_FALSE(apply_config(get, &c, &error));
  CHECK(error.find("min_deviation.x") != std::string::npos);
  t = {{"window", "5"}, {"metrics", "[\"gpu*.util\"]"}, {"continuity", "3"}};
  REQUIRE(apply_config(get, &c, &error));
  CHECK(c.window_s == 5);
  CHECK(c.continuity == 3);
  CHECK(c.metrics == std::vector<std::string>{"gpu*.util"});
  CHECK(c.hold_peers);
  t = {{"hold_peers", "false"}};
  REQUIRE(apply_config(get, &c, &error));
  CHECK_FALSE(c.hold_peers);
  t = {{"hold_peers", "1"}};
  CHECK_FALSE(apply_config(get, &c, &error));
  CHECK(error == "config key 'hold_peers': expected true or false, got '1'");
}
