// The host's /metrics, scraped with a real HTTP client (curl): the counters
// of the bus and of each plugin, the policy's, fault reports by detector and
// kind, recovery actions and their outcomes, in Prometheus text format; the
// listen address parsed and refused with the reason; the tallies bounded.
#include "error.hpp"
#include "host.hpp"
#include "host_metrics.hpp"
#include "metrics_http.hpp"

#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

namespace fs = std::filesystem;
using namespace ballast;

namespace {

bool has(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

// curl's body and status code ("%{http_code}" on the last line).
std::string curl(const std::string& url, int* code, const std::string& extra = "") {
  FILE* p = popen(("curl -sS --max-time 20 -w '\\n%{http_code}' " + extra + " '" + url + "' 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  std::array<char, 4096> buf;
  std::string text;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) text.append(buf.data(), n);
  pclose(p);
  const size_t nl = text.rfind('\n');
  *code = nl == std::string::npos ? 0 : std::atoi(text.c_str() + nl + 1);
  return nl == std::string::npos ? text : text.substr(0, nl);
}

std::string policy_file() {
  const fs::path path = fs::temp_directory_path() / ("ballast-metrics-policy-" + std::to_string(getpid()) + ".lua");
  std::ofstream(path) << "ballast.on('fault.confirmed', function(ev)\n"
                         "  return { action = 'evict', subject = ev.payload.subject, reason = 'bad' }\n"
                         "end)\n";
  return path.string();
}

// Scrape until `what` shows (the tallies are queued), at most 20 s.
std::string scrape_until(const std::string& url, const std::string& what) {
  std::string body;
  for (int i = 0; i < 200; ++i) {
    int code = 0;
    body = curl(url, &code);
    if (code == 200 && has(body, what)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return body;
}

}  // namespace

TEST_CASE("a running host serves its counters, fault reports, actions and outcomes at /metrics") {
  HostOptions options;
  options.node = "metrics-node";
  options.log_level = BALLAST_LOG_WARN;
  Host host(options);
  PolicyOptions popts;
  popts.name = "test-policy";
  REQUIRE(host.load_policy(policy_file(), popts) == BALLAST_OK);
  REQUIRE(host.load_plugin(std::string(BALLAST_PLUGIN_DIR) + "/ballast-hello.so", nlohmann::json::object()) ==
          BALLAST_OK);
  REQUIRE(host.serve_metrics("127.0.0.1:0") == BALLAST_OK);
  const std::string url = host.metrics_url();
  REQUIRE(url.rfind("http://127.0.0.1:", 0) == 0);
  REQUIRE(host.start() == BALLAST_OK);

  REQUIRE(host.publish_json("fault.confirmed",
                            R"({"stage":1,"subject":"gpu7","kind":"outlier","detector":"machine","score":5})",
                            "test") == BALLAST_OK);
  REQUIRE(host.publish_json("fault.suspected", R"({"stage":0,"subject":"gpu7","kind":"stuck","detector":"hang"})",
                            "test") == BALLAST_OK);
  REQUIRE(host.publish_json("job.action", R"({"event":"end","action":"evict","outcome":"done"})", "test") ==
          BALLAST_OK);
  REQUIRE(host.publish_json("job.action", R"({"event":"start","action":"evict"})", "test") == BALLAST_OK);

  const std::string body = scrape_until(url, "ballast_recovery_actions_total{");
  CHECK(has(body, "# TYPE ballast_bus_published_total counter\nballast_bus_published_total "));
  CHECK(has(body, "ballast_host_info{node=\"metrics-node\"} 1\n"));
  CHECK(has(body, "ballast_plugins 2\n"));
  CHECK(has(body, "ballast_fault_reports_total{topic=\"fault.confirmed\",detector=\"machine\",kind=\"outlier\"} 1\n"));
  CHECK(has(body, "ballast_fault_reports_total{topic=\"fault.suspected\",detector=\"hang\",kind=\"stuck\"} 1\n"));
  CHECK(has(body, "ballast_recovery_actions_total{action=\"evict\",policy=\"test-policy\"} 1\n"));
  CHECK(has(body, "ballast_action_outcomes_total{action=\"evict\",outcome=\"done\"} 1\n"));
  CHECK_FALSE(has(body, "outcome=\"\""));  // a start is not an outcome
  // Each plugin's counters, the policy's among them.
  CHECK(has(body, "ballast_plugin_counter{plugin=\"hello\",counter=\"seen\"} 1\n"));
  // The policy watches fault.confirmed only: one event handled, counted in the plugin.
  CHECK(has(body, "ballast_plugin_counter{plugin=\"policy\",counter=\"events\"} 1\n"));
  CHECK(host.counter("policy.events") == 1);
  CHECK(has(body, "ballast_plugin_counter{plugin=\"policy\",counter=\"actions\"} 1\n"));

  int code = 0;
  CHECK(has(curl(url.substr(0, url.size() - 8) + "/other", &code), "not found"));
  CHECK(code == 404);
  curl(url, &code, "-X POST");
  CHECK(code == 405);
  host.stop();
}

TEST_CASE("the listen address: loopback by default, errors name the value and the reason") {
  std::string host;
  uint16_t port = 1;
  REQUIRE(parse_listen("9464", &host, &port) == BALLAST_OK);
  CHECK(host == "127.0.0.1");
  CHECK(port == 9464);
  REQUIRE(parse_listen(":0", &host, &port) == BALLAST_OK);
  CHECK(host == "127.0.0.1");
  CHECK(port == 0);
  REQUIRE(parse_listen("0.0.0.0:80", &host, &port) == BALLAST_OK);
  CHECK(host == "0.0.0.0");
  REQUIRE(parse_listen("[::1]:9000", &host, &port) == BALLAST_OK);
  CHECK(host == "::1");
  CHECK(port == 9000);
  for (const char* bad : {"", "host:", "host:port", "1:70000", "[::1]9000"}) {
    CAPTURE(bad);
    CHECK(parse_listen(bad, &host, &port) == BALLAST_EINVAL);
    CHECK(has(last_error(), "listen address"));
  }

  // A port already taken: the error says so, the first server goes on.
  std::unique_ptr<MetricsHttp> first, second;
  REQUIRE(MetricsHttp::open(
              "127.0.0.1:0", [] { return std::string("x 1\n"); }, &first) == BALLAST_OK);
  const std::string taken = first->url().substr(7, first->url().size() - 7 - 8);  // HOST:PORT
  CHECK(MetricsHttp::open(
            taken, [] { return std::string(); }, &second) == BALLAST_EIO);
  CHECK(has(last_error(), "cannot serve metrics on " + taken));
  int code = 0;
  CHECK(curl(first->url(), &code) == "x 1\n");
  CHECK(code == 200);
  CHECK(MetricsHttp::open(
            "no-such-host.invalid:0", [] { return std::string(); }, &second) == BALLAST_EINVAL);
}

TEST_CASE("tallies escape label values and stay bounded") {
  EventTally tally;
  ballast_fault_report r{};
  r.size = sizeof r;
  r.stage = BALLAST_FAULT_CONFIRMED;
  r.subject = "n";
  r.kind = "a\"b\\c\nd";
  r.detector = "machine";
  ballast_event e{};
  e.size = sizeof e;
  e.schema = BALLAST_SCHEMA_FAULT_REPORT;
  e.topic = "fault.confirmed";
  e.payload = &r;
  e.payload_size = sizeof r;
  tally.count(e);
  CHECK(has(tally.render(), "kind=\"a\\\"b\\\\c\\nd\"} 1\n"));
  std::vector<std::string> kinds;
  for (size_t i = 0; i < EventTally::kMaxSeries + 10; ++i) kinds.push_back("k" + std::to_string(i));
  for (const auto& k : kinds) {
    r.kind = k.c_str();
    tally.count(e);
  }
  const std::string text = tally.render();
  CHECK(has(text, "ballast_fault_reports_total{topic=\"other\",detector=\"other\",kind=\"other\"} 11\n"));
}
