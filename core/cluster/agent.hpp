// The agent role: forwards the events of this node that job-level plugins
// need to the controller, and publishes the actions the controller sends back.
//
// Each forwarded event is spooled (spool.hpp) with the node's next sequence
// number before it is sent; the controller acknowledges by sequence, and
// after a reconnect the agent resends everything above the controller's
// acknowledgement (from memory, else from the spool on disk). Heartbeats go
// both ways on the same connection; a controller silent for silent_after_ms
// is dropped and the next address of `controllers` tried (HA: only the leader
// accepts). Actions carry an id that grows across controller restarts; an
// action at or below the last one carried out is acknowledged, not repeated.
// Thread-safety: start/stop from the owning thread; counters() from any.
#pragma once

#include "link.hpp"
#include "spool.hpp"

#include <nlohmann/json.hpp>

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ballast {
class Host;
}

namespace ballast::cluster {

struct AgentOptions {
  std::string node;
  std::vector<std::string> controllers;  // host:port, tried in turn
  TlsFiles tls;
  SpoolOptions spool;
  std::vector<std::string> forward = {"metric.*",    "step.*",    "fault.*", "collective.*",
                                      "straggler.*", "startup.*", "trace.*", "job.*"};
  int heartbeat_ms = 1000;
  int silent_after_ms = 5000;
  int connect_timeout_ms = 3000;
  size_t memory_queue_bytes = 4u << 20;  // unacknowledged frames kept in memory; the rest are read back from disk
};

class Agent {
 public:
  static int create(Host& host, AgentOptions options, std::unique_ptr<Agent>* out);
  ~Agent();
  int start();
  void stop();
  nlohmann::json counters() const;

 private:
  Agent(Host& host) : host_(host) {}
  static int on_event(void* user, const ballast_event* event);
  void run();
  void session(Link& link);
  bool on_action(Link& link, const Message& m, std::string* error);
  bool fill(Link& link, uint64_t* sent);
  bool wait(int ms);
  void wake();

  Host& host_;
  AgentOptions options_;
  std::unique_ptr<TlsConfig> tls_;
  std::unique_ptr<Spool> spool_;
  std::vector<uint64_t> subscriptions_;
  std::mutex queue_mutex_;
  std::deque<std::pair<uint64_t, std::vector<unsigned char>>> queue_;  // contiguous sequences, unacknowledged
  size_t queue_bytes_ = 0;
  uint64_t applied_action_ = 0;
  int wake_fd_ = -1;
  std::atomic<bool> quit_{false};
  std::thread thread_;
  std::atomic<uint64_t> forwarded_{0}, resent_from_disk_{0}, connects_{0}, actions_{0}, action_repeats_{0},
      spool_errors_{0};
  uint64_t overflow_logged_ = 0;
};

}  // namespace ballast::cluster
