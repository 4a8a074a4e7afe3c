// `ballast detect` on hostile or careless input: huge time gaps, deeply
// nested configs, invalid UTF-8, numbers out of range, long metric names,
// quoted CSV fields. Each is a clear error or a correct answer, never a
// crash, an abort or an effective hang.
#include <doctest/doctest.h>

#include "detect_command.hpp"
#include "detector.hpp"
#include "detector_config.hpp"
#include "metrics_csv.hpp"

#include <unistd.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

using namespace ballast::machine;

namespace {

struct TempFiles {
  std::vector<std::string> paths;
  ~TempFiles() {
    for (const auto& p : paths) std::remove(p.c_str());
  }
} temp_files;

std::string write_file(const std::string& name, const std::string& text) {
  std::string p = "machine_hostile_" + std::to_string(getpid()) + "_" + name;
  temp_files.paths.push_back(p);
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

// Runs detect_main with stdout and stderr in files; returns {code, stdout, stderr}.
struct Run {
  int code;
  std::string out, err;
};
Run run_detect(std::vector<std::string> args) {
  args.insert(args.begin(), "ballast detect");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::string out = write_file("stdout", ""), err = write_file("stderr", "");
  std::fflush(stdout);
  std::fflush(stderr);
  int saved_out = dup(1), saved_err = dup(2);
  FILE* fo = std::fopen(out.c_str(), "w");
  FILE* fe = std::fopen(err.c_str(), "w");
  dup2(fileno(fo), 1);
  dup2(fileno(fe), 2);
  int code = detect_main(static_cast<int>(args.size()), argv.data());
  std::fflush(stdout);
  std::fflush(stderr);
  dup2(saved_out, 1);
  dup2(saved_err, 2);
  close(saved_out);
  close(saved_err);
  std::fclose(fo);
  std::fclose(fe);
  auto slurp = [](const std::string& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  return {code, slurp(out), slurp(err)};
}

}  // namespace

TEST_CASE("two samples 9e9 s apart are replayed without walking every empty period") {
  MetricsTable t;
  std::string error;
  std::string p = write_file("gap.csv", "ts,node,metric,value\n0,a,proc.cpu,1\n9000000000,a,proc.cpu,1\n");
  REQUIRE(read_metrics_csv(p, &t, &error));
  Detector d(DetectorConfig{});
  replay(t, &d);
  // The evaluations after the gap stop once nothing can change any more
  // (every window empty, every machine silent): a handful, not 9e9.
  CHECK(d.work() < 100);
  Run r = run_detect({"--metrics", p});
  CHECK(r.code == 0);
  CHECK(r.out.find("silent") != std::string::npos);
}

TEST_CASE("a 150 KB nested --config is an error naming the file") {
  std::string nested = "return { ";
  for (int i = 0; i < 25000; ++i) nested += "a = { ";
  nested += std::string(25000, '}') + " }";
  std::string p = write_file("nested.lua", nested);
  Run r = run_detect({"--metrics", p, "--config", p});
  CHECK(r.code == 1);
  CHECK(r.err.find(p + ": nested too deeply") != std::string::npos);
}

TEST_CASE("invalid UTF-8 in a node name or a config pattern is an error, not an abort") {
  std::string csv = write_file("utf8.csv", "ts,node,metric,value\n1,good,proc.cpu,1\n2,bad\xff,proc.cpu,1\n");
  Run r = run_detect({"--metrics", csv, "--json"});
  CHECK(r.code == 1);
  CHECK(r.err.find(csv + ":3: column 2 (node): not valid UTF-8") != std::string::npos);
  std::string metric = write_file("utf8m.csv", "ts,node,metric,value\n1,a,cpu\xc3(,1\n");
  r = run_detect({"--metrics", metric, "--json"});
  CHECK(r.code == 1);
  CHECK(r.err.find(metric + ":2: column 3 (metric): not valid UTF-8") != std::string::npos);
  std::string ok = write_file("ok.csv", "ts,node,metric,value\n1,n\xc3\xa9ud,proc.cpu,1\n");
  CHECK(run_detect({"--metrics", ok, "--json"}).code == 0);  // valid UTF-8 is fine
  std::string cfg = write_file("utf8.lua", "return {\n  metrics = { 'proc.*', 'gpu\xff' },\n}\n");
  r = run_detect({"--metrics", ok, "--config", cfg});
  CHECK(r.code == 1);
  CHECK(r.err.find(cfg + ": metrics[2]: not valid UTF-8") != std::string::npos);
  cfg = write_file("utf8k.lua", "return { min_deviation = { ['gpu\xff'] = 1 } }\n");
  r = run_detect({"--metrics", ok, "--config", cfg});
  CHECK(r.code == 1);
  CHECK(r.err.find(cfg + ": min_deviation: a key that is not valid UTF-8") != std::string::npos);
}

TEST_CASE("numbers out of range in --config are errors naming the file and field") {
  std::string ok = write_file("ok2.csv", "ts,node,metric,value\n1,a,proc.cpu,1\n");
  std::string cfg = write_file("big.lua", "return {\n  threshold = 1e3081,\n}\n");
  Run r = run_detect({"--metrics", ok, "--config", cfg});
  CHECK(r.code == 1);
  CHECK(r.err.find(cfg + ": threshold: not a finite number") != std::string::npos);
  cfg = write_file("bigdev.lua", "return { min_deviation = { ['proc.cpu'] = 1e3081 } }\n");
  r = run_detect({"--metrics", ok, "--config", cfg});
  CHECK(r.code == 1);
  CHECK(r.err.find(cfg + ": min_deviation.proc.cpu: not a finite number") != std::string::npos);
}

TEST_CASE("the evidence is valid JSON whatever the metric name") {
  DetectorConfig c;
  c.metrics = {"*"};
  Detector d(c);
  std::string name = "custom." + std::string(600, 'x') + "\"\\\n\xff";
  std::vector<Alert> alerts;
  for (int t = 0; t < 20; ++t) {
    for (int i = 0; i < 8; ++i)
      d.add("n" + std::to_string(i), name, t * 1000000000LL, i == 2 && t >= 10 ? 500 : 100 + i, 0);
    d.evaluate(t * 1000000000LL + 1, &alerts);
  }
  REQUIRE(alerts.size() == 1);
  auto j = nlohmann::json::parse(alerts[0].evidence);  // throws on invalid JSON
  CHECK(j["metric"].get<std::string>().size() >= 600);
  CHECK(j["value"] == 500);
}

TEST_CASE("RFC 4180 quoting: labelled series are one field") {
  std::string p = write_file("quoted.csv",
                             "ts,node,metric,value\n"
                             "1,a,\"DCGM_FI_DEV_GPU_UTIL{gpu=\"\"0\"\",UUID=\"\"GPU-1\"\"}\",97\n"
                             "2,\"b,c\",plain,1\n");
  MetricsTable t;
  std::string error;
  REQUIRE_MESSAGE(read_metrics_csv(p, &t, &error), error);
  REQUIRE(t.rows.size() == 2);
  CHECK(t.metrics[0] == "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-1\"}");
  CHECK(t.rows[0].value == 97);
  CHECK(t.nodes[1] == "b,c");
  p = write_file("open.csv", "ts,node,metric,value\n1,a,\"gpu{x=1,2\n");
  CHECK_FALSE(read_metrics_csv(p, &t, &error));
  CHECK(error == p + ":2: column 3: unterminated quoted field (a line break inside quotes is not accepted)");
  p = write_file("after.csv", "ts,node,metric,value\n1,\"a\"b,m,2\n");
  CHECK_FALSE(read_metrics_csv(p, &t, &error));
  CHECK(error == p + ":2: column 2: unexpected text after a closing quote");
}
