// `ballast whatif`: JSON, the human report, the timeline export, usage and
// input errors, through the command's run().
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "data.hpp"
#include "whatif_command.hpp"

using straggler_test::data;
using straggler_test::Scratch;

namespace {

struct Outcome {
  int rc;
  std::string out, err;
};

std::string contents(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  std::fclose(f);
  return s;
}

Outcome run(std::vector<std::string> args) {
  args.insert(args.begin(), "ballast whatif");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::FILE* out = std::tmpfile();
  std::FILE* err = std::tmpfile();
  REQUIRE(out);
  REQUIRE(err);
  int rc = ballast::straggler::run_whatif(static_cast<int>(args.size()), argv.data(), out, err);
  return {rc, contents(out), contents(err)};
}

}  // namespace

TEST_CASE("--json prints one object with the slowdown, attributions, M_W, M_S and step times") {
  Outcome o = run({"--trace", data("ST", "trace.csv.gz"), "--meta", data("ST", "meta.yaml"), "--json"});
  REQUIRE(o.rc == 0);
  CHECK(o.err.empty());
  auto j = nlohmann::json::parse(o.out);
  CHECK(j["slowdown"].get<double>() == doctest::Approx(1.1787).epsilon(0.01));
  CHECK(j["launch_slowdown"].get<double>() == doctest::Approx(1.0192).epsilon(0.01));
  CHECK(j["by_stage"]["3"].get<double>() == doctest::Approx(1.2323).epsilon(0.01));
  CHECK(j["by_optype"]["forward-compute"].get<double>() == doctest::Approx(1.0875).epsilon(0.01));
  CHECK(j["by_dp_rank"].size() == 2);
  CHECK(j["mw"].get<double>() == doctest::Approx(0.0314).epsilon(0.02));
  CHECK(j["ms"].get<double>() == doctest::Approx(1.2194).epsilon(0.02));
  CHECK(j["kind"] == "stage");
  for (const char* k : {"original", "no_delay", "ideal"}) {
    CAPTURE(k);
    CHECK(j["step_times"][k].size() == 32);
  }
  CHECK(j["step_times"]["ideal"]["23"].get<double>() == doctest::Approx(1.8433).epsilon(0.01));
}

TEST_CASE("the human report names the slowdown, the kind and the culprits") {
  Outcome o = run({"--trace", data("AR", "trace.csv.gz")});  // meta.yaml beside the trace
  REQUIRE(o.rc == 0);
  INFO(o.out);
  CHECK(o.out.find("slowdown S = 1.973") != std::string::npos);
  CHECK(o.out.find("kind: one slow worker") != std::string::npos);
  CHECK(o.out.find("rank 0 ") != std::string::npos);
  CHECK(o.out.find("backward-compute") != std::string::npos);
  CHECK(o.out.find("16 ranks (dp 4 x pp 4)") != std::string::npos);
}

TEST_CASE("--timeline writes the recorded and the ideal run as two processes") {
  Scratch tmp("timeline");
  std::string path = (tmp.dir / "st.json").string();
  Outcome o = run({"--trace", data("ST", "trace.csv.gz"), "--timeline", path});
  REQUIRE(o.rc == 0);
  auto j = nlohmann::json::parse(straggler_test::slurp(path));
  size_t recorded = 0, ideal = 0;
  double recorded_end = 0, ideal_end = 0;
  std::set<int> threads[3];
  for (auto& e : j["traceEvents"]) {
    if (e["ph"] != "X") continue;
    double end = e["ts"].get<double>() + e["dur"].get<double>();
    int pid = e["pid"].get<int>();
    REQUIRE((pid == 1 || pid == 2));
    threads[pid].insert(e["tid"].get<int>());
    if (pid == 1) ++recorded, recorded_end = std::max(recorded_end, end);
    if (pid == 2) ++ideal, ideal_end = std::max(ideal_end, end);
  }
  CHECK(threads[1].size() == 8);  // one thread per rank
  CHECK(threads[2].size() == 8);
  CHECK(recorded == 6784);
  CHECK(ideal == 6784);
  // The ideal steps start where the recorded ones did and are shorter.
  CHECK(ideal_end < recorded_end);
  CHECK(ideal_end > 0.7 * recorded_end);
}

TEST_CASE("usage and input errors give exit codes 2 and 1 with a message") {
  Outcome usage = run({"--json"});
  CHECK(usage.rc == 2);
  CHECK(usage.err.find("--trace") != std::string::npos);

  Outcome missing = run({"--trace", "/nonexistent/t.csv.gz"});
  CHECK(missing.rc == 1);
  CHECK(missing.err.find("/nonexistent/t.csv.gz: cannot open") != std::string::npos);

  Scratch tmp("cmd");
  std::string bad = tmp.write("bad.csv",
                              "dp_rank,stage,rank,step,optype,start_ts,duration,seq_id,mc,mb_id,gmc\n"
                              "0,0,0,1,forward-compute,0.1,NaN,0,0,0,0\n");
  Outcome nan = run({"--trace", bad});
  CHECK(nan.rc == 1);
  CHECK(nan.err.find(bad + ":2: column duration: NaN") != std::string::npos);

  Outcome help = run({"--help"});
  CHECK(help.rc == 0);
  CHECK(help.out.find("--timeline") != std::string::npos);
}

TEST_CASE("the real `ballast whatif` executable runs the plugin's command") {
  Scratch tmp("exe");
  std::string out = (tmp.dir / "out.json").string(), err = (tmp.dir / "err.txt").string();
  std::string cmd =
      std::string(BALLAST_EXE) + " whatif --trace " + data("AR", "trace.csv.gz") + " --json > " + out + " 2> " + err;
  int status = std::system(cmd.c_str());
  INFO(straggler_test::slurp(err));
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  auto j = nlohmann::json::parse(straggler_test::slurp(out));
  CHECK(j["slowdown"].get<double>() == doctest::Approx(1.9730).epsilon(0.01));
  CHECK(j["mw"].get<double>() == doctest::Approx(1.0017).epsilon(0.02));
  CHECK(j["kind"] == "worker");

  std::string bad = tmp.write("bad.csv", "dp_rank,stage\n0,0\n");
  status = std::system((std::string(BALLAST_EXE) + " whatif --trace " + bad + " > " + out + " 2> " + err).c_str());
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 1);
  CHECK(straggler_test::slurp(err).find(bad + ":1: column rank: missing from the header") != std::string::npos);
}
