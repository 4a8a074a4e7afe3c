// The agent -> controller link against real `ballast run` processes: agents
// in network namespaces of their own (loopback when the machine does not
// allow namespaces; the link-cut case then reports itself skipped), mutual
// TLS with certificates from tools/engines/make-certs. Every scenario counts,
// in the controller's ingest journal, that each node's sequences 1..N arrived
// exactly once, N being what the agent spooled.
#include "cluster_harness.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

using namespace cluster_test;

namespace {

const std::string kBallast = BALLAST_EXE;

struct World {
  std::string dir, certs, tag;
  int port = 0;
  bool netns = false;
  std::string controller_ip = "127.0.0.1";
  int nodes = 2;

  explicit World(const std::string& name, int net) {
    dir = scratch_dir(name);
    tag = "bl" + std::to_string(getpid() % 100000);
    port = test::reserve_ports(1);
    REQUIRE(port > 0);
    netns = netns_up(tag, nodes, net);
    std::string ips = "127.0.0.1";
    for (int i = 1; i <= nodes; ++i) ips += " 10." + std::to_string(net) + "." + std::to_string(i) + ".1";
    certs = dir + "/certs";
    REQUIRE(sh(engines() + "/make-certs " + certs + " " + ips + " -- n1 n2 n3") == 0);
    net_ = net;
  }
  ~World() {
    if (netns) netns_down(tag, nodes);
  }
  std::string listen() const { return (netns ? "0.0.0.0:" : "127.0.0.1:") + std::to_string(port); }
  // The controller's address as node i sees it.
  std::string controller_for(int i) const {
    return (netns ? "10." + std::to_string(net_) + "." + std::to_string(i) + ".1:" : "127.0.0.1:") +
           std::to_string(port);
  }
  std::string ns(int i) const { return netns ? tag + std::to_string(i) : ""; }
  // `extra`: more fields of its cluster table ("max_connections = 30, ").
  Proc controller(const std::string& name, const std::string& extra = "") const {
    std::string cfg = dir + "/" + name + ".lua";
    std::string text = controller_config(listen(), certs, dir + "/ctl");
    text.insert(text.find("durable = "), extra);
    write_file(cfg, text);
    return spawn({kBallast, "run", cfg, "--json"}, dir + "/" + name + ".out", dir + "/" + name + ".err");
  }
  Proc agent(int i, uint64_t count, int batch, int period_ms) const {
    std::string node = "n" + std::to_string(i);
    std::string cfg = dir + "/" + node + ".lua";
    write_file(cfg, agent_config(node, certs, {controller_for(i)}, count, batch, period_ms, dir + "/spool-" + node));
    return spawn({kBallast, "run", cfg, "--json"}, dir + "/" + node + ".out", dir + "/" + node + ".err", ns(i));
  }
  int net_ = 0;
};

// Every node's sequences 1..expected exactly once.
void check_exactly_once(const Counts& counts, const std::vector<std::string>& nodes, uint64_t expected) {
  for (const auto& node : nodes) {
    INFO("node " << node);
    REQUIRE(counts.count(node) == 1);
    const auto& seqs = counts.at(node);
    uint64_t missing = 0, twice = 0;
    for (uint64_t s = 1; s <= expected; ++s) {
      auto it = seqs.find(s);
      if (it == seqs.end())
        ++missing;
      else if (it->second > 1)
        ++twice;
    }
    CHECK(missing == 0);
    CHECK(twice == 0);
    CHECK(seqs.size() == expected);
  }
}

uint64_t ingested(const std::string& journal, const std::string& node) {
  auto c = ingest_counts(journal);
  return c.count(node) ? c[node].size() : 0;
}

// A TCP connection to 127.0.0.1:port that sends `bytes` and then nothing; -1 when it failed.
int raw_connection(int port, const std::string& bytes) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      (!bytes.empty() && send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(bytes.size()))) {
    close(fd);
    return -1;
  }
  return fd;
}

// The peer closed the connection (end of file or an error on read).
bool closed_by_peer(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  char buf[4096];
  ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

nlohmann::json last_json(const std::string& path) {
  std::string text = read_file(path);
  auto j = nlohmann::json::parse(text, nullptr, false);
  return j.is_discarded() ? nlohmann::json::object() : j;
}

}  // namespace

TEST_CASE("controller killed while agents publish: nothing lost, nothing applied twice") {
  World w("kill-ctl", 211);
  const uint64_t count = 3000;
  Proc ctl = w.controller("ctl1");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  Proc a1 = w.agent(1, count, 10, 10), a2 = w.agent(2, count, 10, 10);  // ~3 s of publishing
  // Kill -9 the controller mid-stream, twice.
  for (int round = 0; round < 2; ++round) {
    REQUIRE(eventually(
        20, [&] { return ingested(w.dir + "/ctl-ingest.journal", "n1") > 500u * static_cast<unsigned>(round + 1); }));
    ctl.signal(SIGKILL);
    ctl.wait();
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    ctl = w.controller("ctl" + std::to_string(round + 2));
  }
  bool done = eventually(30, [&] {
    return ingested(w.dir + "/ctl-ingest.journal", "n1") >= count &&
           ingested(w.dir + "/ctl-ingest.journal", "n2") >= count;
  });
  a1.signal(SIGTERM);
  a2.signal(SIGTERM);
  CHECK(a1.wait() == 0);
  CHECK(a2.wait() == 0);
  // Everything can be in before the last controller is up (the second had it
  // all): SIGTERM it once it handles signals, or it dies of it (143).
  CHECK(eventually(20, [&] { return read_file(w.dir + "/ctl3.err").find("running on node") != std::string::npos; }));
  ctl.signal(SIGTERM);
  CHECK(ctl.wait() == 0);
  INFO(read_file(w.dir + "/n1.err"));
  REQUIRE(done);
  auto n1 = last_json(w.dir + "/n1.out");
  CHECK(n1["cluster.last_seq"] == count);
  CHECK(n1["cluster.spool_overflow"] == 0);
  CHECK(n1["cluster.connects"].get<int>() >= 2);  // a kill can come before the agent reconnected
  check_exactly_once(ingest_counts(w.dir + "/ctl-ingest.journal"), {"n1", "n2"}, count);
  // The last controller saw resends it had already applied, or none at all:
  // either way nothing reached its bus twice (the count above).
  MESSAGE("duplicates dropped by the last controller: " << last_json(w.dir + "/ctl3.out")["cluster.duplicates"]);
}

TEST_CASE("an agent's link cut: node.silent, then node.back and everything delivered once after it returns") {
  World w("cut-link", 212);
  REQUIRE_MESSAGE(w.netns, "the link-cut case needs network namespaces (root, iproute2)");
  // The cut lasts BALLAST_CLUSTER_CUT_S seconds (30 in the scenario of
  // docs/deploy.md and bench/cluster; 3 by default to keep CI short).
  const char* env = std::getenv("BALLAST_CLUSTER_CUT_S");
  const double cut_s = env ? std::atof(env) : 3.0;
  const uint64_t count = static_cast<uint64_t>(cut_s * 100 + 1500);
  Proc ctl = w.controller("ctl1");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  Proc a1 = w.agent(1, count, 1, 10);  // 100 events/s for the whole cut
  REQUIRE(eventually(20, [&] { return ingested(w.dir + "/ctl-ingest.journal", "n1") > 300; }));
  REQUIRE(sh(engines() + "/netns cut " + w.tag + " 1") == 0);
  std::this_thread::sleep_for(std::chrono::duration<double>(cut_s));
  REQUIRE(sh(engines() + "/netns mend " + w.tag + " 1") == 0);
  bool done = eventually(30 + cut_s, [&] { return ingested(w.dir + "/ctl-ingest.journal", "n1") >= count; });
  a1.signal(SIGTERM);
  CHECK(a1.wait() == 0);
  ctl.signal(SIGTERM);
  CHECK(ctl.wait() == 0);
  INFO(read_file(w.dir + "/n1.err"));
  REQUIRE(done);
  check_exactly_once(ingest_counts(w.dir + "/ctl-ingest.journal"), {"n1"}, count);
  // The controller noticed the silence from its own heartbeats (once for
  // the cut; a machine loaded enough to stall the agent may add some).
  const int silent = bus_count(w.dir + "/ctl-bus.journal", "node.silent", "n1");
  CHECK(silent >= 1);
  // Heard again after each silence: node.back once for each.
  CHECK(bus_count(w.dir + "/ctl-bus.journal", "node.back", "n1") == silent);
  auto n1 = last_json(w.dir + "/n1.out");
  CHECK(n1["cluster.connects"].get<int>() >= 2);
}

TEST_CASE("unauthenticated and wrongly keyed clients are refused and never reach the bus") {
  World w("auth", 213);
  Proc ctl = w.controller("ctl1");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // 1. No certificate at all: a TLS client without one.
  std::string host_port = w.controller_for(1);
  std::string ns = w.ns(1).empty() ? "" : "ip netns exec " + w.ns(1) + " ";
  sh("echo hi | " + ns + "timeout 5 openssl s_client -connect " + host_port + " -CAfile " + w.certs +
     "/ca.crt >/dev/null 2>&1");
  // 2. A certificate from another CA (a wrong key) for a real node name.
  std::string other = w.dir + "/other-ca";
  REQUIRE(sh(engines() + "/make-certs " + other + " 127.0.0.1 -- n1") == 0);
  std::string cfg = w.dir + "/wrong.lua";
  write_file(cfg, agent_config("n1", w.certs, {host_port}, 50, 10, 10, w.dir + "/spool-wrong"));
  sh("sed -i 's#" + w.certs + "/n1#" + other + "/n1#g' " + cfg);
  Proc wrong = spawn({kBallast, "run", cfg, "--json"}, w.dir + "/wrong.out", w.dir + "/wrong.err", w.ns(1));
  // 3. A valid certificate (n3) claiming to be another node (n2).
  std::string cfg3 = w.dir + "/liar.lua";
  write_file(cfg3, agent_config("n2", w.certs, {w.controller_for(2)}, 50, 10, 10, w.dir + "/spool-liar"));
  sh("sed -i 's#" + w.certs + "/n2#" + w.certs + "/n3#g' " + cfg3);
  Proc liar = spawn({kBallast, "run", cfg3, "--json"}, w.dir + "/liar.out", w.dir + "/liar.err", w.ns(2));
  bool refused = eventually(15, [&] {
    std::string log = read_file(w.dir + "/ctl1.err");
    size_t n = 0;
    for (size_t at = log.find("refused connection"); at != std::string::npos;
         at = log.find("refused connection", at + 1))
      ++n;
    return n >= 3 && log.find("does not match its certificate") != std::string::npos;
  });
  wrong.signal(SIGTERM);
  liar.signal(SIGTERM);
  wrong.wait();
  liar.wait();
  ctl.signal(SIGTERM);
  CHECK(ctl.wait() == 0);
  INFO(read_file(w.dir + "/ctl1.err"));
  CHECK(refused);
  CHECK(ingest_counts(w.dir + "/ctl-ingest.journal").empty());
  CHECK(bus_count(w.dir + "/ctl-bus.journal", "metric.sample", "n1") == 0);
  CHECK(bus_count(w.dir + "/ctl-bus.journal", "metric.sample", "n2") == 0);
  auto c = last_json(w.dir + "/ctl1.out");
  CHECK(c["cluster.refused"].get<int>() >= 3);
  CHECK(c["cluster.applied"] == 0);
  // The wrongly keyed agent spooled its events and keeps them: nothing lost on its side either.
  CHECK(last_json(w.dir + "/wrong.out")["cluster.acked"] == 0);
}

TEST_CASE("stalled handshakes, a hostile peer and the bound on connections beside publishing agents") {
  // The controller's event loops serve every connection: one that speaks no
  // TLS, 10 that stop inside their first record and 40 that never start their
  // TLS handshake must cost the publishing agents nothing; the stalled ones
  // are closed after the handshake timeout (3 s), those above the bound of 30
  // open connections at once.
  World w("stall", 214);
  const uint64_t count = 3000;
  Proc ctl = w.controller("ctl1", "max_connections = 30, handshake_timeout_ms = 3000, ");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  Proc a1 = w.agent(1, count, 1, 2), a2 = w.agent(2, count, 1, 2);  // 500 events/s each, one a message
  const std::string journal = w.dir + "/ctl-ingest.journal";
  REQUIRE(eventually(30, [&] { return ingested(journal, "n1") > 300 && ingested(journal, "n2") > 300; }));
  int hostile = raw_connection(w.port, "GET / HTTP/1.0\r\n\r\n");
  std::vector<int> stalled;
  // A TLS record header announcing 16 KiB of handshake, then nothing.
  for (int i = 0; i < 10; ++i) stalled.push_back(raw_connection(w.port, std::string("\x16\x03\x01\x40\x00", 5)));
  for (int i = 0; i < 40; ++i) stalled.push_back(raw_connection(w.port, ""));
  for (int fd : stalled) REQUIRE(fd >= 0);
  REQUIRE(hostile >= 0);
  // While they stall, the agents go on (or have finished).
  const uint64_t n1 = ingested(journal, "n1"), n2 = ingested(journal, "n2");
  CHECK(eventually(4, [&] {
    return (ingested(journal, "n1") >= std::min(count, n1 + 100)) &&
           (ingested(journal, "n2") >= std::min(count, n2 + 100));
  }));
  CHECK(eventually(10, [&] { return closed_by_peer(hostile); }));
  // Each stalled connection closed by the controller's handshake timeout.
  CHECK(eventually(30, [&] {
    for (int& fd : stalled)
      if (fd >= 0 && closed_by_peer(fd)) {
        close(fd);
        fd = -1;
      }
    return std::all_of(stalled.begin(), stalled.end(), [](int fd) { return fd < 0; });
  }));
  for (int fd : stalled)
    if (fd >= 0) close(fd);
  close(hostile);
  bool done = eventually(60, [&] { return ingested(journal, "n1") >= count && ingested(journal, "n2") >= count; });
  a1.signal(SIGTERM);
  a2.signal(SIGTERM);
  CHECK(a1.wait() == 0);
  CHECK(a2.wait() == 0);
  ctl.signal(SIGTERM);
  CHECK(ctl.wait() == 0);
  const std::string log = read_file(w.dir + "/ctl1.err");
  INFO(log);
  REQUIRE(done);
  check_exactly_once(ingest_counts(journal), {"n1", "n2"}, count);
  CHECK(count_of(log, "TLS handshake timed out") >= 10);
  CHECK(count_of(log, "TLS handshake failed") >= 1);
  CHECK(count_of(log, "connections open, the bound") >= 1);
  auto c = last_json(w.dir + "/ctl1.out");
  CHECK(c["cluster.refused"].get<int>() >= 51);
  CHECK(c["cluster.applied"] == 2 * count);
  CHECK(c["cluster.ingest_passes"].get<uint64_t>() >= 1);
}
