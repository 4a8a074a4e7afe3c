// The detector as a plugin in the real host: metric batches published on the
// bus, fault.suspected and node.silent coming back; and `ballast detect` run
// as a user runs it, on metrics recorded from a real fault (bench/detect).
#include <doctest/doctest.h>

#include <ballast/host.h>
#include <nlohmann/json.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Seen {
  std::mutex mu;
  std::vector<std::string> topic, subject, kind, metric;
};

int on_report(void* user, const ballast_event* ev) {
  auto* seen = static_cast<Seen*>(user);
  if (ev->schema != BALLAST_SCHEMA_FAULT_REPORT) return 0;
  const auto* r = static_cast<const ballast_fault_report*>(ev->payload);
  std::lock_guard<std::mutex> lock(seen->mu);
  seen->topic.push_back(ev->topic);
  seen->subject.push_back(r->subject ? r->subject : "");
  seen->kind.push_back(r->kind ? r->kind : "");
  seen->metric.push_back(r->metric ? r->metric : "");
  return 0;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Runs `ballast ARGS`, returns {exit code, stdout}; stderr goes to stdout too.
std::pair<int, std::string> ballast(const std::string& args) {
  std::string cmd = std::string(BALLAST_EXE) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  int status = pclose(p);
  return {WEXITSTATUS(status), out};
}

const std::string kData = std::string(BALLAST_SOURCE_DIR) + "/tests/plugins/detector/machine/data/";

}  // namespace

TEST_CASE("the plugin flags a deviating machine and a silent one on the bus") {
  ballast_host* host = nullptr;
  REQUIRE(ballast_host_create("controller", &host) == BALLAST_OK);
  REQUIRE(ballast_host_load_plugin(host, BALLAST_PLUGIN_DIR "/ballast-machine.so",
                                   "{ period = 0.1, window = 0.3, warmup = 3, silent_after = 1 }") == BALLAST_OK);
  Seen seen;
  uint64_t id1 = 0, id2 = 0;
  REQUIRE(ballast_host_subscribe(host, "fault.suspected", nullptr, on_report, &seen, &id1) == BALLAST_OK);
  REQUIRE(ballast_host_subscribe(host, "node.silent", nullptr, on_report, &seen, &id2) == BALLAST_OK);
  REQUIRE(ballast_host_start(host) == BALLAST_OK);
  std::mt19937 rng(3);
  std::normal_distribution<double> noise(0, 0.005);
  const std::vector<std::string> nodes = {"m0", "m1", "m2", "m3", "m4"};
  auto start = std::chrono::steady_clock::now();
  for (int round = 0; round < 300; ++round) {  // up to 15 s
    double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::vector<ballast_metric_sample> samples;
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (i == 4 && t > 2.0) continue;  // m4 goes quiet
      double v = (i == 2 && t > 1.5 ? 0.9 : 0.1) + noise(rng);
      samples.push_back({nodes[i].c_str(), "proc.cpu", now_ns(), v, 0});
    }
    samples.push_back({"m1", "proc.cpu", now_ns(), 0, BALLAST_SAMPLE_INVALID});  // not data
    ballast_metric_batch batch{sizeof batch, static_cast<uint32_t>(samples.size()), samples.data()};
    ballast_event ev{};
    ev.size = sizeof ev;
    ev.schema = BALLAST_SCHEMA_METRIC_BATCH;
    ev.topic = "metric.sample";
    ev.payload = &batch;
    ev.payload_size = sizeof batch;
    REQUIRE(ballast_host_publish(host, &ev) == BALLAST_OK);
    {
      std::lock_guard<std::mutex> lock(seen.mu);
      bool silent = std::count(seen.topic.begin(), seen.topic.end(), "node.silent") > 0;
      if (silent && seen.topic.size() >= 2 && t > 3.5) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ballast_host_destroy(host);
  // m2 once or more (a loaded machine can stall this loop for two rounds:
  // m2 then has no score, is re-armed and alerted again), m4 once, no one else.
  REQUIRE(seen.topic.size() >= 2);
  CHECK(std::count(seen.topic.begin(), seen.topic.end(), "node.silent") == 1);
  CHECK(std::count(seen.topic.begin(), seen.topic.end(), "fault.suspected") >= 1);
  for (size_t k = 0; k < seen.topic.size(); ++k) {
    if (seen.topic[k] == "fault.suspected") {
      CHECK(seen.subject[k] == "m2");
      CHECK(seen.kind[k] == "outlier");
      CHECK(seen.metric[k] == "proc.cpu");
    } else {
      CHECK(seen.topic[k] == "node.silent");
      CHECK(seen.subject[k] == "m4");
      CHECK(seen.kind[k] == "silent");
    }
  }
}

TEST_CASE("ballast detect finds a real SIGSTOP stall and stays quiet on a healthy run") {
  // Recorded by bench/detect: 5 machines x 2 worker processes in lock-step;
  // m3's workers were stopped at t = 1795307124.786.
  auto [code, out] = ballast("detect --metrics " + kData + "sigstop.csv.gz --json");
  REQUIRE(code == 0);
  auto j = nlohmann::json::parse(out.substr(0, out.find('\n')));
  CHECK(j["node"] == "m3");
  CHECK(j["kind"] == "outlier");
  CHECK(j["ts"].get<double>() > 1795307124.786);
  CHECK(j["ts"].get<double>() < 1795307124.786 + 5);
  // One alert, then the summary.
  size_t second = out.find('\n') + 1;
  CHECK(nlohmann::json::parse(out.substr(second))["kind"] == "summary");
  auto [code2, out2] = ballast("detect --metrics " + kData + "clean.csv.gz");
  CHECK(code2 == 0);
  CHECK(out2.find("0 alert(s)") != std::string::npos);
}

TEST_CASE("ballast detect: bad input is exit 1 with the file and line") {
  std::string cut = "machine_plugin_cut_" + std::to_string(getpid()) + ".csv.gz";
  FILE* in = std::fopen((kData + "sigstop.csv.gz").c_str(), "rb");
  FILE* out = std::fopen(cut.c_str(), "wb");
  char buf[4000];
  size_t n = std::fread(buf, 1, sizeof buf, in);
  std::fwrite(buf, 1, n, out);
  std::fclose(in);
  std::fclose(out);
  auto [code, text] = ballast("detect --metrics " + cut);
  std::remove(cut.c_str());
  CHECK(code == 1);
  CHECK(text.find(cut + ":") != std::string::npos);
  CHECK(text.find("truncated gzip stream") != std::string::npos);
  CHECK(ballast("detect").first == 2);
}
