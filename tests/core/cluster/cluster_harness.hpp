// Helpers of the cluster tests: processes, scripts of tools/engines, and the
// count of what the controllers' ingest journals hold.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "test_ports.hpp"

namespace cluster_test {

std::string engines();  // tools/engines of the source tree
// Run a shell command; its exit status.
int sh(const std::string& command);
std::string scratch_dir(const std::string& name);
void write_file(const std::string& path, const std::string& text);
std::string read_file(const std::string& path);

struct Proc {
  pid_t pid = -1;
  std::string out, err;  // files
  void signal(int sig) const;
  int wait();  // exit status (128+signal when killed)
};
// Start `argv` with stdout/stderr to out/err, in network namespace `netns` unless empty.
Proc spawn(const std::vector<std::string>& argv, const std::string& out, const std::string& err,
           const std::string& netns = "");

// Namespaces TAG1..TAGN (tools/engines/netns); false when the machine does not allow them.
bool netns_up(const std::string& tag, int n, int net);
void netns_down(const std::string& tag, int n);

// node -> seq -> how many times the ingest journal holds it.
using Counts = std::map<std::string, std::map<uint64_t, int>>;
Counts ingest_counts(const std::string& journal);
// Number of events of `topic` about `node` (source.node or a fault report's subject) in a bus journal.
int bus_count(const std::string& journal, const std::string& topic, const std::string& node);

// node -> value -> how many times a bus journal holds a one-sample metric.sample
// of that node with that value (the emit plugin's index).
Counts bus_values(const std::string& journal);
// The JSON payload of the last event of `topic` in a bus journal (null when none).
std::string last_json(const std::string& journal, const std::string& topic);
// The JSON payloads of every event of `topic` in a bus journal, in order.
std::vector<std::string> all_json(const std::string& journal, const std::string& topic);

// The JSON payloads of `topic` an ingest journal holds (the agents' events as they came), with
// each one's node and sequence, in the journal's order.
struct Ingested {
  std::string node;
  uint64_t seq = 0;
  std::string json;
};
std::vector<Ingested> ingested_json(const std::string& journal, const std::string& topic);

// The steps of `rank` an executor applied (its step.timing events in a bus journal), in order,
// with when each was published (wall s).
struct AppliedStep {
  int64_t step = 0;
  double at_s = 0;
};
std::vector<AppliedStep> applied_steps(const std::string& journal, int rank);

// The step of a job.rank_report event's JSON that relays a step report of `rank`; -1 for any other.
int64_t relayed_step(const std::string& json, int rank);
// The steps of `rank` relayed from `node` that a controller ingested (its ingest journal) at
// sequences up to `cursor`: that leader's, when its successor took over from that cursor. A
// sequence journaled again (resent, not acknowledged) is one report.
std::vector<int64_t> relayed_steps_up_to(const std::string& ingest_journal, const std::string& node, uint64_t cursor,
                                         int rank);

// Seconds since the epoch of the first line in the log at `path` that contains `what` (from its
// "YYYY-MM-DDTHH:MM:SS.mmmZ" stamp); 0 when there is none.
double log_time_s(const std::string& path, const std::string& what);

// Poll fn every 100 ms until true or timeout; its last value.
template <class F>
bool eventually(double timeout_s, F fn);

// The config's `tls = { ... }` table for `who` (a node or "controller"), with the certificates
// tools/engines/make-certs made in certs.
std::string tls_table(const std::string& certs, const std::string& who);

std::string agent_config(const std::string& node, const std::string& certs, const std::vector<std::string>& controllers,
                         uint64_t count, int batch, int period_ms, const std::string& spool);
std::string controller_config(const std::string& listen, const std::string& certs, const std::string& prefix,
                              const std::string& etcd_endpoint = "", int lease_s = 5);

// A 4-node Slurm of its own (tools/engines/slurm-up: munged, slurmctld on `port`, four slurmd
// n1..n4 on port+101..port+104), in a scratch folder; torn down with the object. The ports from
// `port` to port+127 are the test's (test::reserve_ports): port+60 is free for a controller.
struct Cluster {
  std::string dir, conf;
  bool up = false;
  int port = test::reserve_ports(128);
  Cluster();
  ~Cluster();
};

// A real etcd (tools/engines/etcd-up) in c.dir/etcd on the cluster's port + 70, stopped with
// this object; its log in dir/stdout.log.
struct ClusterEtcd {
  std::string dir, endpoint;
  bool up = false;
  explicit ClusterEtcd(const Cluster& c);
  ~ClusterEtcd();
};

// etcdctl against the etcd at `endpoint` (its output in dir/etcdctl.out); its stdout and stderr.
std::string etcdctl(const std::string& dir, const std::string& endpoint, const std::string& args);

// A controller candidate `name` (etcd at `etcd`, the job's key `job_key`, lease 3 s) listening
// at `listen`: a Slurm job (conf) of two ranks on n1 and n2, the channel trainer running `steps`
// steps of 0.1 s, its ranks reporting through their nodes' agents at `sockets` ("{node}": the
// node). Its journals: dir/NAME-bus.journal and dir/NAME-ingest.journal.
std::string relay_candidate_config(const std::string& name, const std::string& dir, const std::string& listen,
                                   const std::string& certs, const std::string& etcd, const std::string& job_key,
                                   const std::string& conf, const std::string& job_dir, const std::string& sockets,
                                   int steps);

// A real agent for `node` (`ballast run`) reporting to the controller at listen (a comma-separated list of
// candidates); its output beside its config. `extra`: more top-level fields of its config (Lua);
// `netns`: the network namespace it runs in ("": the machine's).
Proc start_agent(const std::string& dir, const std::string& certs, const std::string& listen, const std::string& node,
                 int silent_after_ms, const std::string& extra = "", const std::string& netns = "");

}  // namespace cluster_test

#include <chrono>
#include <thread>

template <class F>
bool cluster_test::eventually(double timeout_s, F fn) {
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    if (fn()) return true;
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}
