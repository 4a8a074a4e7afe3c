// The executor on a real host (libballast's C API) with real ranks: a small
// Python process that speaks the job channel (channel_trainer.py). Crashes
// are reported at once and restarted from the last checkpoint, actions are
// journaled with their cause and outcome, evict + replace goes through the
// placement plugin, pause stops and resumes the ranks, a restart loop and an
// action that keeps failing are escalated.
#include <doctest/doctest.h>

#include <ballast/host.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace {

const std::string kTrainer = BALLAST_SOURCE_DIR "/tests/plugins/scheduler/runner/channel_trainer.py";

struct Events {
  std::mutex mu;
  std::vector<nlohmann::json> all;
  static int handler(void* user, const ballast_event* ev) {
    std::vector<char> buf(1 << 16);
    int64_t need = ballast_event_to_json(ev, buf.data(), buf.size());
    if (need < 0) return -1;
    if (uint64_t(need) >= buf.size()) {
      buf.resize(size_t(need) + 1);
      ballast_event_to_json(ev, buf.data(), buf.size());
    }
    auto* e = static_cast<Events*>(user);
    std::lock_guard<std::mutex> lock(e->mu);
    e->all.push_back(nlohmann::json::parse(buf.data()));
    return 0;
  }
  std::vector<nlohmann::json> topic(const std::string& t) {
    std::lock_guard<std::mutex> lock(mu);
    std::vector<nlohmann::json> out;
    for (const auto& e : all)
      if (e["topic"] == t) out.push_back(e);
    return out;
  }
  // Wait, bounded, until a job.state event has `state`.
  bool wait_state(const std::string& state, double seconds = 90) {
    for (auto t0 = std::chrono::steady_clock::now();
         std::chrono::steady_clock::now() - t0 < std::chrono::duration<double>(seconds);) {
      for (const auto& e : topic("job.state"))
        if (e["payload"]["state"] == state) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
};

std::string job_dir(const std::string& name) {
  const char* tmp = std::getenv("TMPDIR");
  std::string dir = std::string(tmp ? tmp : "/tmp") + "/" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

std::vector<nlohmann::json> journal(const std::string& dir) {
  std::vector<nlohmann::json> out;
  std::ifstream in(dir + "/actions.jsonl");
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

// The fake trainer's weight after `steps` steps: what every run must end with.
double reference_weight(int steps) {
  double w = 1.0;
  for (int s = 1; s <= steps; ++s) w = std::fmod(w * 1.0001 + s * 1e-3, 1000.0);
  return w;
}

struct Job {
  ballast_host* host = nullptr;
  Events events;
  std::string dir;
  Job(const std::string& name, const std::string& extra_job, const std::string& extra_top, bool policy,
      bool scheduler = false) {
    dir = job_dir(name);
    REQUIRE(ballast_host_create("test-node", &host) == BALLAST_OK);
    if (scheduler)
      REQUIRE_MESSAGE(ballast_host_load_plugin(host, BALLAST_PLUGIN_DIR "/ballast-scheduler.so", nullptr) == BALLAST_OK,
                      ballast_last_error());
    // extra_job: the command's arguments, its closing brace, then the job's options.
    const std::string cfg = "{ job = { dir = '" + dir +
                            "', metrics_period_seconds = 0, progress = false, command = {'" + kTrainer + "', " +
                            extra_job + " }, report = 'none', " + extra_top + " }";
    REQUIRE_MESSAGE(ballast_host_load_plugin(host, BALLAST_PLUGIN_DIR "/ballast-runner.so", cfg.c_str()) == BALLAST_OK,
                    ballast_last_error());
    if (policy)
      REQUIRE_MESSAGE(
          ballast_host_load_policy(host, BALLAST_SOURCE_DIR "/scripts/default.lua", "escalate") == BALLAST_OK,
          ballast_last_error());
    uint64_t id = 0;
    for (const char* t : {"job.*", "fault.*"})
      REQUIRE(ballast_host_subscribe(host, t, nullptr, Events::handler, &events, &id) == BALLAST_OK);
    REQUIRE_MESSAGE(ballast_host_start(host) == BALLAST_OK, ballast_last_error());
  }
  ~Job() { ballast_host_destroy(host); }
  void act(const std::string& json) {
    REQUIRE(ballast_host_publish_json(host, "recovery.action", json.c_str()) == BALLAST_OK);
  }
  double final_weight() {
    std::ifstream in(dir + "/final-weights.json");
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    return j.is_object() ? j["w"].get<double>() : -1;
  }
};

}  // namespace

TEST_CASE("a job runs to its end and says so") {
  Job job("finish", "'--steps', '12', '--step-seconds', '0.02'}, ranks = 4, standby = 0", "", false);
  REQUIRE(job.events.wait_state("finished"));
  CHECK(job.final_weight() == reference_weight(12));
  ballast_host_stop(job.host);
}

TEST_CASE("a rank that reports done but never exits is killed after exit_grace_seconds; the job finishes") {
  Job job("linger",
          "'--steps', '8', '--step-seconds', '0.02', '--linger-after-done', '1'}, ranks = 2, standby = 0, "
          "exit_grace_seconds = 0.5",
          "", false);
  REQUIRE(job.events.wait_state("finished", 30));
  CHECK(job.final_weight() == reference_weight(8));
  CHECK(job.events.topic("fault.confirmed").empty());
  ballast_host_stop(job.host);
}

TEST_CASE("a crash is reported at once, restarted from the last checkpoint, and ends with the same weights") {
  Job job("crash",
          "'--steps', '40', '--step-seconds', '0.03', '--checkpoint-every', '5'}, ranks = 4, keep_checkpoints = 2",
          "inject = {'crash:rank=2@step12'}", true);
  REQUIRE(job.events.wait_state("finished", 120));
  auto faults = job.events.topic("fault.confirmed");
  REQUIRE(!faults.empty());
  CHECK(faults[0]["payload"]["kind"] == "crashed");
  CHECK(faults[0]["payload"]["detector"] == "executor");
  CHECK(faults[0]["payload"]["subject"] == "rank:2");
  auto j = journal(job.dir);
  REQUIRE(j.size() >= 2);
  CHECK(j[0]["event"] == "start");
  CHECK(j[1]["event"] == "end");
  CHECK(j[1]["action"] == "restart");
  CHECK(j[1]["cause"] == "fault.confirmed");
  CHECK(j[1]["outcome"] == "ok");
  CHECK(j[1]["end_s"].get<double>() >= j[1]["start_s"].get<double>());
  CHECK(job.final_weight() == reference_weight(40));  // the same, to the bit
  // Old checkpoints deleted as training went on: the newest two (one more if
  // the last report came after the end).
  size_t kept = 0;
  for (const auto& e : std::filesystem::directory_iterator(job.dir + "/checkpoints")) kept += e.is_regular_file();
  CHECK(kept >= 2);
  CHECK(kept <= 3);
  CHECK(std::filesystem::exists(job.dir + "/checkpoints/step-00000040.safetensors"));
}

TEST_CASE("evict and replace take a standby chosen by the placement plugin; pause; checkpoint_now") {
  Job job("evict", "'--steps', '400', '--step-seconds', '0.03', '--checkpoint-every', '50'}, ranks = 2, standby = 2",
          "", false, true);
  REQUIRE(job.events.wait_state("running"));
  job.act(R"({"action": "checkpoint_now", "reason": "test"})");
  job.act(R"({"action": "evict", "subject": "node1", "reason": "test"})");
  job.act(R"({"action": "replace", "subject": "node1", "reason": "test"})");
  job.act(R"({"action": "pause", "reason": "test", "args": {"seconds": 0.3}})");
  REQUIRE(job.events.wait_state("paused"));
  for (int i = 0; i < 3000 && journal(job.dir).size() < 8; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  auto j = journal(job.dir);
  REQUIRE(j.size() == 8);
  CHECK(j[1]["action"] == "checkpoint_now");
  CHECK(j[1]["outcome"] == "ok");
  CHECK(j[3]["action"] == "evict");
  CHECK(j[3]["outcome"] == "ok");
  CHECK(j[5]["action"] == "replace");
  CHECK(j[5]["outcome"] == "ok");
  CHECK(j[5]["detail"].get<std::string>().find("node1 -> node") == 0);
  CHECK(j[5]["detail"].get<std::string>().find("the placement plugin chose") != std::string::npos);
  CHECK(j[7]["action"] == "pause");
  CHECK(j[7]["outcome"] == "ok");
  ballast_host_stop(job.host);
}

TEST_CASE("a replace that comes after the evict's own replace is superseded, also once the node is repaired") {
  Job job("late-replace",
          "'--steps', '400', '--step-seconds', '0.03', '--checkpoint-every', '50'}, ranks = 2, standby = 1, "
          "repair_seconds = 0",
          "", false, true);
  REQUIRE(job.events.wait_state("running"));
  job.act(R"({"action": "evict", "subject": "node1", "reason": "test"})");
  auto ended = [&job](const std::string& action) {
    int n = 0;
    for (const auto& e : journal(job.dir)) n += e["event"] == "end" && e["action"] == action;
    return n;
  };
  for (int i = 0; i < 6000 && ended("replace") < 1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  REQUIRE(ended("replace") == 1);  // the evict's own, taking the standby
  job.act(R"({"action": "replace", "subject": "node1", "reason": "the policy, late"})");
  for (int i = 0; i < 6000 && ended("replace") < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const auto j = journal(job.dir);
  REQUIRE(!j.empty());
  CHECK(j.back()["action"] == "replace");
  CHECK(j.back()["outcome"] == "superseded");
  CHECK(j.back()["detail"].get<std::string>().find("already took the place of node1") != std::string::npos);
  ballast_host_stop(job.host);
}

TEST_CASE("the same crash after every restart is a loop, and is escalated") {
  Job job("loop", "'--steps', '40', '--step-seconds', '0.02', '--exit-at', '3'}, ranks = 2, restart_loop_limit = 2", "",
          true);
  REQUIRE(job.events.wait_state("escalated", 120));
  auto j = journal(job.dir);
  REQUIRE(!j.empty());
  CHECK(j.back()["outcome"] == "refused");
  CHECK(j.back()["detail"].get<std::string>().find("restart loop") == 0);
  int restarts = 0;
  for (const auto& e : j) restarts += e["event"] == "end" && e["outcome"] == "ok";
  CHECK(restarts == 2);
}

TEST_CASE("an action that keeps failing is retried with back-off, then escalated") {
  // Every rank of a restarted attempt exits before its hello: each try of the restart fails.
  Job job("retry",
          "'--steps', '400', '--step-seconds', '0.02', '--exit-before-hello-on-restart'}, ranks = 2, "
          "action_tries = 2, backoff_seconds = 0.1",
          "", false);
  REQUIRE(job.events.wait_state("running"));
  job.act(R"({"action": "restart", "reason": "test"})");
  REQUIRE(job.events.wait_state("escalated"));
  auto j = journal(job.dir);
  std::vector<std::string> outcomes;
  for (const auto& e : j)
    if (e["event"] == "end") outcomes.push_back(e["outcome"]);
  REQUIRE(outcomes.size() == 2);
  CHECK(outcomes[0] == "failed");
  CHECK(outcomes[1] == "failed");
  CHECK(j.back()["try"] == 2);
}

TEST_CASE("a user-code error is reported with the trainer's message") {
  Job job("usererror", "'--steps', '40', '--step-seconds', '0.02'}, ranks = 2", "inject = {'usererror@4'}", false);
  std::vector<nlohmann::json> faults;
  for (int i = 0; i < 4000 && faults.empty(); ++i) {
    faults = job.events.topic("fault.confirmed");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  REQUIRE(!faults.empty());
  CHECK(faults[0]["payload"]["kind"] == "user_error");
  const auto& raw = faults[0]["payload"]["evidence"];
  auto ev = raw.is_string() ? nlohmann::json::parse(raw.get<std::string>()) : raw;
  CHECK(ev["message"] == "ValueError: bad batch at step 4");
  CHECK(ev["step"] == 4);
  job.act(R"({"action": "escalate", "reason": "user-code error"})");
  REQUIRE(job.events.wait_state("escalated"));
}

TEST_CASE("another detector's crash report after the restart, and the evict + replace it asks for, are superseded") {
  Job job("echo", "'--steps', '150', '--step-seconds', '0.02', '--checkpoint-every', '5'}, ranks = 4, standby = 1",
          "inject = {'crash:rank=1@1'}", false);
  std::vector<nlohmann::json> faults;
  for (int i = 0; i < 4000 && faults.empty(); ++i) {
    faults = job.events.topic("fault.confirmed");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  REQUIRE(!faults.empty());
  job.act(R"({"action": "restart", "reason": "crash", "cause_topic": "fault.confirmed"})");
  auto ends = [&job] {
    std::vector<nlohmann::json> out;
    for (const auto& e : journal(job.dir))
      if (e["event"] == "end") out.push_back(e);
    return out;
  };
  for (int i = 0; i < 4000 && ends().empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  REQUIRE(ends().size() == 1);
  CHECK(ends()[0]["outcome"] == "ok");
  // The hang detector reading the old rings of ranks 1 and 3 (its stall
  // clock restarted when the new rings appeared, so `since` is after the
  // restart), and the over-eviction a policy would ask for.
  const auto now =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  for (int r : {1, 3}) {
    const nlohmann::json f = {{"subject", "rank:" + std::to_string(r)},
                              {"rank", r},
                              {"kind", "crashed"},
                              {"detector", "hang"},
                              {"confidence", 1.0},
                              {"since_ns", now},
                              {"detected_ns", now},
                              {"evidence", "{}"}};
    REQUIRE(ballast_host_publish_json(job.host, "fault.confirmed", f.dump().c_str()) == BALLAST_OK);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (const char* s : {"rank:1", "rank:3"})
    for (const char* a : {"evict", "replace"})
      job.act(
          nlohmann::json{{"action", a}, {"subject", s}, {"reason", "test"}, {"cause_topic", "fault.confirmed"}}.dump());
  REQUIRE(job.events.wait_state("finished", 120));
  const auto e = ends();
  REQUIRE(e.size() == 5);
  for (size_t i = 1; i < 5; ++i) {
    INFO(e[i].dump());
    CHECK(e[i]["outcome"] == "superseded");
  }
  CHECK(job.final_weight() == reference_weight(150));
}
