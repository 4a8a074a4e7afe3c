// Controller high availability through etcd: candidates campaign for
// /ballast/<job>/leader on a lease of lease_s seconds (kept alive every
// lease_s/3); the winner leads until its lease lapses. Everything the leader
// does that must not happen twice is a transaction conditional on its leader
// key's create revision (fencing): an agent's actions
// (/ballast/<job>/actions/<id>, deleted once acknowledged), the records of
// what plugins of this process do outside it (plugin.h's fence_action,
// /ballast/<job>/records/<plugin>/<id>; a plugin's snapshot record deletes
// its earlier ones in the same transaction), applied cursors
// (/ballast/<job>/cursor/<node>). A deposed leader's transactions fail, so
// it can neither act nor delete. A new leader reads the three prefixes when
// its term begins. Agents do not talk to etcd.
// Thread-safety: every member is thread-safe.
#pragma once

#include "controller.hpp"
#include "etcd.hpp"

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace ballast {
class Host;
}

namespace ballast::cluster {

struct EtcdOptions {
  std::string endpoint;  // http://127.0.0.1:2379, or https:// with `tls`
  EtcdTls tls;
  std::string job = "job";
  std::string name;   // this candidate, for logs
  std::string value;  // what the leader key holds: the controller's address
  int lease_s = 5;
};

class EtcdLeadership : public Leadership {
 public:
  // Bounds of what a new term reads of each part of the action log (the
  // agents' actions, each plugin's records): the newest records, each at most
  // this large (a larger one is skipped, named in the log).
  static constexpr size_t kMaxLogRecords = 4096;
  static constexpr size_t kMaxLogRecordBytes = 16 * 1024;
  // A `.snapshot` record holds a plugin's whole state (a Slurm job's every
  // node): up to 1 MiB, which etcd 3.4's default request bound (1.5 MiB)
  // takes once the gateway's base64 has grown it by a third.
  static constexpr size_t kMaxSnapshotBytes = 1024 * 1024;
  static constexpr size_t kMaxLogPlugins = 64;  // plugins' parts read, each up to kMaxLogRecords
  static int create(Host& host, EtcdOptions options, std::unique_ptr<EtcdLeadership>* out);
  ~EtcdLeadership() override;
  int start();
  void stop();
  nlohmann::json counters() const;

  bool is_leader() const override { return leader_.load(); }
  uint64_t epoch() const override { return static_cast<uint64_t>(revision_.load()); }
  int record_action(const std::string& node, uint64_t id, const std::string& action_json) override;
  int record_own_action(const std::string& plugin, uint64_t id, const std::string& record_json, bool snapshot) override;
  int commit(const std::map<std::string, uint64_t>& cursors, const std::vector<uint64_t>& acknowledged) override;
  std::map<std::string, uint64_t> cursors() const override;
  std::vector<LoggedAction> logged_actions() const override;

 private:
  EtcdLeadership(Host& host) : host_(host) {}
  void campaign_loop();
  void keepalive_loop();
  int read_records(Etcd& etcd, std::vector<std::pair<std::string, std::string>>* out, bool* complete);
  int fenced(const std::vector<std::pair<std::string, std::string>>& puts, const std::vector<Etcd::Delete>& deletes);
  void deposed(const std::string& why);
  std::string prefix() const { return "/ballast/" + options_.job + "/"; }

  Host& host_;
  EtcdOptions options_;
  std::atomic<bool> quit_{false};
  std::atomic<bool> leader_{false};
  std::atomic<int64_t> lease_{0};
  std::atomic<int64_t> revision_{0};
  mutable std::mutex mutex_;  // key_, the snapshots and the fencing client
  std::string key_;
  std::map<std::string, uint64_t> cursors_;
  std::vector<LoggedAction> actions_;
  std::unique_ptr<Etcd> client_;  // fenced writes
  std::thread campaign_, keepalive_;
  std::atomic<uint64_t> terms_{0}, fenced_off_{0}, etcd_errors_{0}, snapshots_{0};
  std::atomic<int64_t> elected_at_ms_{0};
};

}  // namespace ballast::cluster
