// Scrape a real prometheus-node-exporter started on a loopback port. Exits
// 77 (skipped) when the exporter is not installed or does not come up.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "prometheus.hpp"
#include "test_ports.hpp"

#include <ballast/events.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <thread>

using namespace ballast::collect;

namespace {

std::string g_url;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

TEST_CASE("scrape node-exporter: real series, counters as rates") {
  std::string body, error;
  REQUIRE(http_get(g_url, 5000, &body, &error));
  std::vector<PromSample> series;
  REQUIRE_MESSAGE(parse_exposition(body, &series, &error), error);
  CHECK(series.size() > 100);
  bool cpu = false;
  for (const auto& s : series)
    if (s.name == "node_cpu_seconds_total" && s.type == "counter") cpu = true;
  CHECK(cpu);

  Scraper scraper(g_url, "ne.", 5000);
  std::vector<Sample> first, second;
  REQUIRE_MESSAGE(scraper.scrape(now_ns(), &first, &error), error);
  std::map<std::string, Sample> f;
  for (const auto& s : first) f.emplace(s.metric, s);
  CHECK(f.count("ne.node_load1"));                         // a gauge comes at once
  CHECK_FALSE(f.count("ne.node_context_switches_total"));  // a counter needs two scrapes
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  REQUIRE_MESSAGE(scraper.scrape(now_ns(), &second, &error), error);
  std::map<std::string, Sample> m;
  for (const auto& s : second) m.emplace(s.metric, s);
  REQUIRE(m.count("ne.node_context_switches_total"));
  CHECK((m["ne.node_context_switches_total"].flags & BALLAST_SAMPLE_COUNTER) != 0);
  CHECK(m["ne.node_context_switches_total"].value > 0);
  bool labelled = false;
  for (const auto& [k, v] : m)
    labelled = labelled || k.rfind("ne.node_cpu_seconds_total{cpu=\"0\",mode=\"idle\"}", 0) == 0;
  CHECK(labelled);
}

TEST_CASE("scrape node-exporter with the detectors' names: the series ballast detect knows") {
  Scraper scraper(g_url, "ne.", 5000, true);
  std::vector<Sample> first, second;
  std::string error;
  REQUIRE_MESSAGE(scraper.scrape(now_ns(), &first, &error), error);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  REQUIRE_MESSAGE(scraper.scrape(now_ns(), &second, &error), error);
  std::map<std::string, Sample> m;
  for (const auto& s : second) m.emplace(s.metric, s);
  CHECK(m.count("load.1"));
  CHECK(m.count("mem.available_bytes"));
  REQUIRE(m.count("ctxt"));
  CHECK(m["ctxt"].value > 0);
  REQUIRE(m.count("cpu.idle"));  // every CPU's idle time, as a share of the machine
  CHECK(m["cpu.idle"].value >= 0);
  CHECK(m["cpu.idle"].value <= 100.5);
  bool net = false;  // net.<device>.rx_bytes for some interface
  for (const auto& [k, v] : m) net = net || (k.rfind("net.", 0) == 0 && k.size() > 9 && k.ends_with(".rx_bytes"));
  CHECK(net);
  CHECK_FALSE(m.count("ne.node_context_switches_total"));  // mapped, not kept under its own name
  bool unmapped = false;                                   // what the table does not know keeps the prefix
  for (const auto& [k, v] : m) unmapped = unmapped || k.rfind("ne.node_", 0) == 0;
  CHECK(unmapped);
}

int main(int argc, char** argv) {
  const char* exe = "/usr/bin/prometheus-node-exporter";
  if (access(exe, X_OK) != 0) {
    std::puts("prometheus-node-exporter is not installed: skipped");
    return 77;
  }
  int port = test::reserve_ports(1);
  std::string listen = "--web.listen-address=127.0.0.1:" + std::to_string(port);
  pid_t pid = fork();
  if (pid == 0) {
    freopen("/dev/null", "w", stderr);
    execl(exe, exe, listen.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  g_url = "http://127.0.0.1:" + std::to_string(port) + "/metrics";
  bool up = false;
  std::string body, error;
  for (int i = 0; i < 100 && !up; ++i) {  // up to 10 s
    up = http_get(g_url, 1000, &body, &error);
    if (!up) {
      int status;
      if (waitpid(pid, &status, WNOHANG) == pid) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  int rc = 77;
  if (up) {
    doctest::Context ctx(argc, argv);
    rc = ctx.run();
  } else {
    std::printf("node-exporter did not come up (%s): skipped\n", error.c_str());
  }
  kill(pid, SIGTERM);
  waitpid(pid, nullptr, 0);
  return rc;
}
