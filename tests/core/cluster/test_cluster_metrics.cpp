// The cluster role's counters on /metrics, scraped with a real HTTP client
// (curl) from real `ballast run` processes: a controller and an agent over
// mutual TLS on loopback. The agent's events forwarded and acknowledged, the
// controller's events applied, connections, and the silence it notices when
// the agent is killed; SIGUSR1 and the stop line carry the same counters.
#include "cluster_harness.hpp"
#include "test_ports.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <regex>

using namespace cluster_test;

namespace {

const std::string kBallast = BALLAST_EXE;

bool has(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

// The config with its own /metrics on a free loopback port.
std::string with_metrics(std::string config) {
  const std::string head = "return { ";
  REQUIRE(config.rfind(head, 0) == 0);
  return config.insert(head.size(), "metrics = { listen = \"127.0.0.1:0\" }, ");
}

// The metrics URL a process logged, once it did (at most 30 s).
std::string metrics_url(const Proc& p) {
  std::smatch m;
  std::string text;
  eventually(30, [&] {
    text = read_file(p.err);
    return std::regex_search(text, m, std::regex("serving metrics at (http://127\\.0\\.0\\.1:[0-9]+/metrics)"));
  });
  INFO(text);
  REQUIRE(!m.empty());
  return m[1];
}

std::string curl(const std::string& url) {
  FILE* p = popen(("curl -sS --max-time 20 '" + url + "' 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  std::array<char, 4096> buf;
  std::string text;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) text.append(buf.data(), n);
  pclose(p);
  return text;
}

// Scrape until every line of `want` shows (at most `timeout_s`); the last body.
std::string scrape_until(const std::string& url, const std::vector<std::string>& want, double timeout_s = 30) {
  std::string body;
  eventually(timeout_s, [&] {
    body = curl(url);
    for (const auto& w : want)
      if (!has(body, w)) return false;
    return true;
  });
  return body;
}

}  // namespace

TEST_CASE("the cluster counters of a controller and an agent on /metrics, SIGUSR1 and the stop line") {
  const std::string dir = scratch_dir("cluster-metrics");
  const std::string certs = dir + "/certs";
  REQUIRE(sh(engines() + "/make-certs " + certs + " 127.0.0.1 -- n1") == 0);
  const std::string controller = "127.0.0.1:" + std::to_string(test::reserve_ports(1));
  const uint64_t count = 200;

  write_file(dir + "/ctl.lua", with_metrics(controller_config(controller, certs, dir + "/ctl")));
  Proc ctl = spawn({kBallast, "run", dir + "/ctl.lua", "--json"}, dir + "/ctl.out", dir + "/ctl.err");
  const std::string ctl_url = metrics_url(ctl);
  write_file(dir + "/n1.lua", with_metrics(agent_config("n1", certs, {controller}, count, 10, 10, dir + "/spool-n1")));
  Proc agent = spawn({kBallast, "run", dir + "/n1.lua", "--json"}, dir + "/n1.out", dir + "/n1.err");
  const std::string agent_url = metrics_url(agent);

  const std::string n = std::to_string(count);
  std::string body = scrape_until(ctl_url, {"\nballast_cluster_applied_total " + n + "\n"});
  INFO(read_file(ctl.err));
  INFO(body);
  CHECK(has(body, "# TYPE ballast_cluster_applied_total counter\n"));
  CHECK(has(body, "\nballast_cluster_connected 1\n"));
  CHECK(has(body, "# TYPE ballast_cluster_connected gauge\n"));
  CHECK(std::regex_search(body, std::regex("\nballast_cluster_connections_total [1-9][0-9]*\n")));
  CHECK(has(body, "\nballast_cluster_duplicates_total "));
  CHECK(has(body, "\nballast_cluster_node_silent_total 0\n"));
  CHECK_FALSE(has(body, "plugin=\"cluster\""));  // each has its own family

  body = scrape_until(agent_url, {"\nballast_cluster_acked_seq " + n + "\n"});
  INFO(read_file(agent.err));
  INFO(body);
  CHECK(has(body, "\nballast_cluster_last_seq " + n + "\n"));
  CHECK(has(body, "\nballast_cluster_forwarded_total " + n + "\n"));
  CHECK(has(body, "\nballast_cluster_spool_overflow_total 0\n"));
  CHECK(std::regex_search(body, std::regex("\nballast_cluster_connects_total [1-9][0-9]*\n")));

  // SIGUSR1 writes them with the host's counters.
  ctl.signal(SIGUSR1);
  CHECK(eventually(30, [&] { return has(read_file(ctl.err), "cluster.applied=" + n); }));

  // The agent killed: the controller notices its silence (silent_after_ms 2 s).
  agent.signal(SIGKILL);
  agent.wait();
  body = scrape_until(ctl_url, {"\nballast_cluster_node_silent_total 1\n", "\nballast_cluster_connected 0\n"});
  CHECK(has(body, "\nballast_cluster_node_silent_total 1\n"));
  CHECK(has(body, "\nballast_cluster_connected 0\n"));

  // The stop line (--json) still has them.
  ctl.signal(SIGTERM);
  CHECK(ctl.wait() == 0);
  const auto summary = nlohmann::json::parse(read_file(dir + "/ctl.out"), nullptr, false);
  REQUIRE(summary.is_object());
  CHECK(summary["cluster.applied"] == count);
  CHECK(summary["cluster.node_silent"] == 1);
}
