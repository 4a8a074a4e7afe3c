#include "cluster_harness.hpp"

#include "event_codec.hpp"
#include "journal.hpp"
#include "wire.hpp"

#include <ballast/events.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>

namespace cluster_test {

std::string engines() { return std::string(BALLAST_SOURCE_DIR) + "/tools/engines"; }

int sh(const std::string& command) {
  int rc = std::system(command.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

std::string scratch_dir(const std::string& name) {
  const char* tmp = std::getenv("TMPDIR");
  std::string dir = std::string(tmp ? tmp : "/tmp") + "/" + name + "-" + std::to_string(getpid());
  sh("rm -rf '" + dir + "' && mkdir -p '" + dir + "'");
  return dir;
}

void write_file(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void Proc::signal(int sig) const {
  if (pid > 0) kill(pid, sig);
}

int Proc::wait() {
  int status = 0;
  if (pid <= 0 || waitpid(pid, &status, 0) != pid) return -1;
  pid = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

Proc spawn(const std::vector<std::string>& argv, const std::string& out, const std::string& err,
           const std::string& netns) {
  std::vector<std::string> full;
  if (!netns.empty()) full = {"ip", "netns", "exec", netns};
  full.insert(full.end(), argv.begin(), argv.end());
  Proc p;
  p.out = out;
  p.err = err;
  p.pid = fork();
  if (p.pid == 0) {
    int o = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(o, 1);
    dup2(e, 2);
    std::vector<char*> args;
    for (auto& a : full) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  return p;
}

bool netns_up(const std::string& tag, int n, int net) {
  netns_down(tag, n);
  if (sh(engines() + "/netns up " + tag + " " + std::to_string(n) + " " + std::to_string(net) + " 2>/dev/null") != 0) {
    netns_down(tag, n);
    return false;
  }
  return true;
}

void netns_down(const std::string& tag, int n) { sh(engines() + "/netns down " + tag + " " + std::to_string(n)); }

Counts ingest_counts(const std::string& journal) {
  Counts counts;
  ballast::read_journal(
      journal, ballast::JournalMode::skip_bad,
      [&](const ballast::OwnedEvent& ev, uint64_t) {
        ballast::cluster::Spooled sp;
        if (ballast::cluster::unwrap_spooled(ev.view(), &sp)) counts[sp.node][sp.seq]++;
      },
      [](const ballast::JournalProblem&) {});
  return counts;
}

std::vector<Ingested> ingested_json(const std::string& journal, const std::string& topic) {
  std::vector<Ingested> out;
  ballast::read_journal(
      journal, ballast::JournalMode::skip_bad,
      [&](const ballast::OwnedEvent& ev, uint64_t) {
        ballast::cluster::Spooled sp;
        ballast::OwnedEvent inner;
        size_t used = 0;
        std::string error;
        if (!ballast::cluster::unwrap_spooled(ev.view(), &sp) ||
            ballast::decode_frame(sp.frame.data(), sp.frame.size(), &inner, &used, &error) != BALLAST_OK)
          return;
        const ballast_event& e = inner.view();
        if (e.schema == BALLAST_SCHEMA_JSON && topic == e.topic && e.payload)
          out.push_back({sp.node, sp.seq, std::string(static_cast<const char*>(e.payload), e.payload_size)});
      },
      [](const ballast::JournalProblem&) {});
  return out;
}

std::vector<AppliedStep> applied_steps(const std::string& journal, int rank) {
  std::vector<AppliedStep> out;
  ballast::read_journal(
      journal, ballast::JournalMode::skip_bad,
      [&](const ballast::OwnedEvent& ev, uint64_t) {
        const ballast_event& e = ev.view();
        if (e.schema != BALLAST_SCHEMA_OP_TIMING_BATCH || std::string("step.timing") != e.topic ||
            e.source.rank != rank || e.payload == nullptr)
          return;
        const auto* b = static_cast<const ballast_op_timing_batch*>(e.payload);
        if (b->count > 0) out.push_back({b->ops[0].step, static_cast<double>(e.ts_ns) / 1e9});
      },
      [](const ballast::JournalProblem&) {});
  return out;
}

int64_t relayed_step(const std::string& json, int rank) {
  const auto event = nlohmann::json::parse(json, nullptr, false);
  if (!event.is_object() || !event.contains("datagram") || !event["datagram"].is_string()) return -1;
  const auto d = nlohmann::json::parse(event["datagram"].get<std::string>(), nullptr, false);
  return d.is_object() && d.value("type", "") == "step" && d.value("rank", -1) == rank ? d.value("step", int64_t(-1))
                                                                                       : -1;
}

std::vector<int64_t> relayed_steps_up_to(const std::string& ingest_journal, const std::string& node, uint64_t cursor,
                                         int rank) {
  std::map<uint64_t, int64_t> by_seq;
  for (const auto& i : ingested_json(ingest_journal, "job.rank_report"))
    if (i.node == node && i.seq <= cursor)
      if (const int64_t step = relayed_step(i.json, rank); step > 0) by_seq[i.seq] = step;
  std::vector<int64_t> steps;
  for (const auto& [seq, step] : by_seq) steps.push_back(step);
  return steps;
}

double log_time_s(const std::string& path, const std::string& what) {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.find(what) == std::string::npos || line.size() < 24) continue;
    std::tm tm{};
    strptime(line.substr(0, 19).c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
    return static_cast<double>(timegm(&tm)) + std::atoi(line.c_str() + 20) / 1000.0;
  }
  return 0;
}

int bus_count(const std::string& journal, const std::string& topic, const std::string& node) {
  int n = 0;
  ballast::read_journal(
      journal, ballast::JournalMode::skip_bad,
      [&](const ballast::OwnedEvent& ev, uint64_t) {
        const ballast_event& e = ev.view();
        if (topic != e.topic) return;
        std::string about = e.source.node ? e.source.node : "";
        if (e.schema == BALLAST_SCHEMA_FAULT_REPORT && e.payload)
          about = static_cast<const ballast_fault_report*>(e.payload)->subject;
        if (about == node) ++n;
      },
      [](const ballast::JournalProblem&) {});
  return n;
}

Counts bus_values(const std::string& journal) {
  Counts counts;
  ballast::read_journal(
      journal, ballast::JournalMode::skip_bad,
      [&](const ballast::OwnedEvent& ev, uint64_t) {
        const ballast_event& e = ev.view();
        if (e.schema != BALLAST_SCHEMA_METRIC_BATCH || e.source.node == nullptr || e.payload == nullptr) return;
        const auto* b = static_cast<const ballast_metric_batch*>(e.payload);
        if (b->count == 1) counts[e.source.node][static_cast<uint64_t>(b->samples[0].value)]++;
      },
      [](const ballast::JournalProblem&) {});
  return counts;
}

std::string last_json(const std::string& journal, const std::string& topic) {
  std::string last;
  ballast::read_journal(
      journal, ballast::JournalMode::skip_bad,
      [&](const ballast::OwnedEvent& ev, uint64_t) {
        const ballast_event& e = ev.view();
        if (e.schema == BALLAST_SCHEMA_JSON && topic == e.topic && e.payload)
          last.assign(static_cast<const char*>(e.payload), e.payload_size);
      },
      [](const ballast::JournalProblem&) {});
  return last;
}

std::vector<std::string> all_json(const std::string& journal, const std::string& topic) {
  std::vector<std::string> out;
  ballast::read_journal(
      journal, ballast::JournalMode::skip_bad,
      [&](const ballast::OwnedEvent& ev, uint64_t) {
        const ballast_event& e = ev.view();
        if (e.schema == BALLAST_SCHEMA_JSON && topic == e.topic && e.payload)
          out.emplace_back(static_cast<const char*>(e.payload), e.payload_size);
      },
      [](const ballast::JournalProblem&) {});
  return out;
}

std::string tls_table(const std::string& certs, const std::string& who) {
  return "tls = { ca = \"" + certs + "/ca.crt\", cert = \"" + certs + "/" + who + ".crt\", key = \"" + certs + "/" +
         who + ".key\" }";
}

std::string agent_config(const std::string& node, const std::string& certs, const std::vector<std::string>& controllers,
                         uint64_t count, int batch, int period_ms, const std::string& spool) {
  std::string list;
  for (auto& c : controllers) list += "\"" + c + "\", ";
  return "return { node = \"" + node +
         "\", role = \"agent\",\n"
         "  plugins = { { path = \"" EMIT_PLUGIN "\", config = { count = " +
         std::to_string(count) + ", batch = " + std::to_string(batch) + ", period_ms = " + std::to_string(period_ms) +
         " } } },\n"
         "  cluster = { controller = { " +
         list +
         "},\n"
         "    " +
         tls_table(certs, node) +
         ",\n"
         "    spool = { dir = \"" +
         spool + "\" }, heartbeat_ms = 250, silent_after_ms = 2000 } }\n";
}

std::string controller_config(const std::string& listen, const std::string& certs, const std::string& prefix,
                              const std::string& etcd_endpoint, int lease_s) {
  std::string etcd;
  if (!etcd_endpoint.empty())
    etcd = "    etcd = { endpoint = \"" + etcd_endpoint + "\", job = \"test" + std::to_string(getpid()) +
           "\", lease_s = " + std::to_string(lease_s) + " },\n";
  return "return { node = \"" + prefix.substr(prefix.rfind('/') + 1) + "\", role = \"controller\", journal = \"" +
         prefix +
         "-bus.journal\",\n"
         "  cluster = { listen = \"" +
         listen +
         "\",\n"
         "    " +
         tls_table(certs, "controller") + ",\n" + etcd + "    ingest_journal = \"" + prefix +
         "-ingest.journal\", durable = false, heartbeat_ms = 250, silent_after_ms = 2000 } }\n";
}

std::string etcdctl(const std::string& dir, const std::string& endpoint, const std::string& args) {
  const std::string out = dir + "/etcdctl.out";
  sh("ETCDCTL_API=3 etcdctl --endpoints=" + endpoint + " " + args + " >" + out + " 2>&1");
  return read_file(out);
}

std::string relay_candidate_config(const std::string& name, const std::string& dir, const std::string& listen,
                                   const std::string& certs, const std::string& etcd, const std::string& job_key,
                                   const std::string& conf, const std::string& job_dir, const std::string& sockets,
                                   int steps) {
  return "return { node = \"" + name + "\", role = \"controller\", journal = \"" + dir + "/" + name +
         "-bus.journal\",\n  plugins = { \"runner\" },\n"
         "  job = { name = \"" +
         job_key + "\", backend = \"slurm\", ranks = 2, standby = 0, dir = \"" + job_dir +
         "\", progress = false,\n    relay_socket = \"" + sockets + "\",\n    command = { \"python3\", \"" +
         BALLAST_SOURCE_DIR "/tests/plugins/scheduler/runner/channel_trainer.py\", \"--steps\", \"" +
         std::to_string(steps) +
         "\", \"--step-seconds\", \"0.1\", \"--checkpoint-every\", \"5\" },\n"
         "    slurm = { conf = \"" +
         conf + "\", nodes = { \"n1\", \"n2\" } } },\n  cluster = { listen = \"" + listen + "\", " +
         tls_table(certs, "controller") + ",\n    etcd = { endpoint = \"" + etcd + "\", job = \"" + job_key +
         "\", lease_s = 3 },\n    ingest_journal = \"" + dir + "/" + name +
         "-ingest.journal\", durable = false, heartbeat_ms = 250, silent_after_ms = 1500 } }\n";
}

Cluster::Cluster() {
  dir = scratch_dir("slurm");
  if (port < 0) return;  // no ports: not up
  int rc = sh("SLURM_TEST_PORT=" + std::to_string(port) + " " + engines() + "/slurm-up " + dir + " 4 >/dev/null");
  up = rc == 0;
  conf = dir + "/slurm.conf";
}

Cluster::~Cluster() { sh(engines() + "/slurm-down " + dir); }

ClusterEtcd::ClusterEtcd(const Cluster& c)
    : dir(c.dir + "/etcd"), endpoint("http://127.0.0.1:" + std::to_string(c.port + 70)) {
  up = sh(engines() + "/etcd-up " + dir + " " + std::to_string(c.port + 70) + " >/dev/null") == 0;
}

ClusterEtcd::~ClusterEtcd() { sh(engines() + "/etcd-down " + dir); }

Proc start_agent(const std::string& dir, const std::string& certs, const std::string& listen, const std::string& node,
                 int silent_after_ms, const std::string& extra, const std::string& netns) {
  std::string list;
  for (size_t at = 0; at <= listen.size();) {
    const size_t end = std::min(listen.find(',', at), listen.size());
    list += "\"" + listen.substr(at, end - at) + "\", ";
    at = end + 1;
  }
  write_file(dir + "/" + node + ".lua",
             "return { node = \"" + node + "\", role = \"agent\", " + extra + "\n  cluster = { controller = { " + list +
                 "}, " + tls_table(certs, node) + ",\n    spool = { dir = \"" + dir + "/spool-" + node +
                 "\" }, heartbeat_ms = 250, silent_after_ms = " + std::to_string(silent_after_ms) + " } }\n");
  return spawn({BALLAST_EXE, "run", "--json", dir + "/" + node + ".lua"}, dir + "/" + node + ".out",
               dir + "/" + node + ".err", netns);
}

}  // namespace cluster_test
