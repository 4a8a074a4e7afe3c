// Issue 25's end-to-end check: `ballast run` with the real trainer at 4
// ranks, the default policy and the detectors. A crash, a hang and a NaN
// are injected into one run: the job recovers from each without a person,
// the journal holds each action with its cause, and the final weights are
// bit-identical to a fault-free run with the same seed and steps. A
// user-code error stops the job with the trainer's message. A slowed rank
// (named by the straggler analysis, evicted and replaced) and a rank that
// leaves a collective out (the trainer names it, the job restarts) are
// recovered too, to the weights of a fault-free run.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace {

namespace fs = std::filesystem;

constexpr int kSteps = 160;

std::string scratch(const std::string& name) {
  const char* tmp = std::getenv("TMPDIR");
  const std::string dir = std::string(tmp ? tmp : "/tmp") + "/" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

struct Run {
  int code = -1;
  std::string output;
  nlohmann::json report;
  std::string dir;
};

// The straggler analysis as examples/configs/demo.lua runs it: only a clear
// slowdown (a busy small machine makes step times noisy).
const std::string kStraggler =
    "{ path = 'straggler', config = { window_steps = 50, report_every = 50, min_slowdown = 2 } }";

// `ballast run` on a config like examples/configs/demo.lua, its job in dir.
Run run(const std::string& name, const std::vector<std::string>& injections, int steps = kSteps,
        const std::string& more_plugins = "") {
  Run r;
  r.dir = scratch(name);
  const std::string config = r.dir + "/job.lua";
  std::ofstream(config)
      << "return {\n"
         "  plugins = { 'runner', { path = 'hang', config = { stall_seconds = 2, period_seconds = 0.2 } },\n"
         "              'scheduler', "
      << more_plugins
      << " },\n"
         "  job = { command = { '" BALLAST_BINARY_DIR "/bin/ballast-trainer', '--steps', '"
      << steps
      << "', '--checkpoint-every', '10', '--log-every', '1000' },\n"
         "          ranks = 4, standby = 1, progress = false, dir = '"
      << r.dir + "/job"
      << "' },\n"
         "  policy = { script = '" BALLAST_SOURCE_DIR
         "/scripts/default.lua', fallback = 'escalate' },\n"
         "}\n";
  std::string cmd = std::string(BALLAST_EXE) + " run " + config + " --json --timeline " + r.dir + "/timeline.json";
  for (const auto& i : injections) cmd += " --inject '" + i + "'";
  cmd += " 2>" + r.dir + "/stderr.log";
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p);
  std::array<char, 4096> buf;
  for (size_t n; (n = fread(buf.data(), 1, buf.size(), p)) > 0;) r.output.append(buf.data(), n);
  const int st = pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.report = nlohmann::json::parse(r.output, nullptr, false);
  std::ifstream err(r.dir + "/stderr.log");
  r.output += std::string(std::istreambuf_iterator<char>(err), {});
  return r;
}

// The tensors of a safetensors file: the bytes after its JSON header.
std::string tensor_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), {});
  REQUIRE(all.size() >= 8);
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = header << 8 | uint8_t(all[size_t(i)]);
  REQUIRE(8 + header <= all.size());
  return all.substr(8 + header);
}

std::vector<nlohmann::json> journal(const std::string& dir) {
  std::vector<nlohmann::json> out;
  std::ifstream in(dir + "/job/actions.jsonl");
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

std::string final_checkpoint(const std::string& dir, int steps = kSteps) {
  char name[64];
  std::snprintf(name, sizeof name, "/job/checkpoints/step-%08d.safetensors", steps);
  return dir + name;
}

}  // namespace

TEST_CASE("crash, hang and NaN are recovered without a person, to the same weights as a fault-free run") {
  Run clean = run("clean", {});
  INFO(clean.output);
  REQUIRE(clean.code == 0);
  REQUIRE(clean.report.is_object());
  CHECK(clean.report["state"] == "finished");
  CHECK(clean.report["steps"] == kSteps);
  CHECK(clean.report["incidents"].empty());

  Run faulty = run("faulty", {"crash:rank=1@step30", "hang:rank=2@step70", "nan@115"});
  INFO(faulty.output);
  REQUIRE(faulty.code == 0);
  REQUIRE(faulty.report.is_object());
  CHECK(faulty.report["state"] == "finished");
  CHECK(faulty.report["steps"] == kSteps);
  const auto& incidents = faulty.report["incidents"];
  REQUIRE(incidents.size() == 3);
  for (const auto& i : incidents) {
    INFO(i.dump());
    CHECK(i["outcome"] == "recovered");
    CHECK(!i["detector"].get<std::string>().empty());
    CHECK(!i["actions"].empty());
  }
  CHECK(incidents[0]["detector"] == "executor");
  CHECK(incidents[0]["verdict"] == "crashed rank:1");
  CHECK(incidents[1]["detector"] == "hang");
  CHECK(incidents[1]["verdict"].get<std::string>().find("rank:2") != std::string::npos);
  CHECK(incidents[2]["verdict"].get<std::string>().find("nan") == 0);

  // The journal holds each action with its cause, start, end and outcome.
  int recovered = 0;
  for (const auto& a : journal(faulty.dir)) {
    if (a["event"] != "end" || a["outcome"] != "ok") continue;
    ++recovered;
    // The replace the executor queues itself after an evict, when the
    // policy's own replace had not come yet (a slow machine), is its own.
    INFO(a.dump());
    CHECK((a["cause"] == "fault.confirmed" || (a["action"] == "replace" && a["cause"] == "executor")));
    CHECK(!a["reason"].get<std::string>().empty());
    CHECK(a["end_s"].get<double>() >= a["start_s"].get<double>());
  }
  CHECK(recovered >= 3);

  // Bit-identical weights after recovering.
  CHECK(tensor_bytes(final_checkpoint(faulty.dir)) == tensor_bytes(final_checkpoint(clean.dir)));
  // The timeline is a Chrome trace.
  std::ifstream tl(faulty.dir + "/timeline.json");
  auto trace = nlohmann::json::parse(tl, nullptr, false);
  REQUIRE(trace.is_object());
  CHECK(trace["traceEvents"].size() > kSteps);
}

TEST_CASE("a user-code error stops the job with the trainer's message") {
  Run r = run("usererror", {"usererror@20"});
  INFO(r.output);
  CHECK(r.code == 1);
  REQUIRE(r.report.is_object());
  CHECK(r.report["state"] == "escalated");
  REQUIRE(r.report["incidents"].size() == 1);
  const auto& i = r.report["incidents"][0];
  CHECK(i["verdict"].get<std::string>().rfind("user_error rank:", 0) == 0);
  CHECK(!i["message"].get<std::string>().empty());
  CHECK(r.report["reason"].get<std::string>().find(i["message"].get<std::string>()) != std::string::npos);
}

TEST_CASE("a slowed rank is evicted and a collective left out is restarted, to the weights of a fault-free run") {
  constexpr int kLong = 400;
  Run clean = run("clean-long", {}, kLong, kStraggler);
  INFO(clean.output);
  REQUIRE(clean.code == 0);
  REQUIRE(clean.report.is_object());
  CHECK(clean.report["state"] == "finished");

  Run faulty = run("slow-skip", {"slow:rank=1,factor=5@step50", "skip:rank=2@step300"}, kLong, kStraggler);
  INFO(faulty.output);
  REQUIRE(faulty.code == 0);
  REQUIRE(faulty.report.is_object());
  CHECK(faulty.report["state"] == "finished");
  CHECK(faulty.report["steps"] == kLong);
  const auto& incidents = faulty.report["incidents"];
  REQUIRE(incidents.size() == 2);
  for (const auto& i : incidents) {
    INFO(i.dump());
    CHECK(i["outcome"] == "recovered");
  }
  // The slowed rank: named by the straggler analysis, its node evicted and replaced.
  CHECK(incidents[0]["fault"] == "slow:rank=1,factor=5@step50");
  CHECK(incidents[0]["detector"] == "straggler");
  CHECK(incidents[0]["verdict"] == "straggler rank:1");
  int evicted = 0, replaced = 0;
  for (const auto& a : incidents[0]["actions"]) {
    evicted += a == "evict: ok";
    replaced += a == "replace: ok";
  }
  CHECK(evicted == 1);
  CHECK(replaced == 1);
  // The rank that left a collective out: the others found it out of step,
  // named it and exited; the job restarted from its last checkpoint.
  CHECK(incidents[1]["fault"] == "skip:rank=2@step300");
  CHECK(incidents[1]["detector"] == "executor");
  CHECK(incidents[1]["message"].get<std::string>().find("rank 2 at step") != std::string::npos);
  REQUIRE(!incidents[1]["actions"].empty());
  CHECK(incidents[1]["actions"][0] == "restart: ok");

  CHECK(tensor_bytes(final_checkpoint(faulty.dir, kLong)) == tensor_bytes(final_checkpoint(clean.dir, kLong)));
}
