// The job channel's relay on a node (docs/job-channel.md, "Through the
// node's agent"): the runner plugin loaded by a cluster agent with a
// `relay` table binds a node-local Unix datagram socket, checks each report
// a rank sends there with the executor's own parser (parse_report), and
// publishes the good ones on the agent's bus as `job.rank_report`, which the
// agent forwards to the controller like any other event (spooled, numbered,
// resent). A bad datagram is counted and logged with what was wrong, never
// forwarded.
#pragma once

#include <ballast/plugin.h>

#include <sys/types.h>

#include <atomic>
#include <set>
#include <string>
#include <thread>

namespace ballast::runner {

struct RelayConfig {
  std::string socket;    // the path; "{node}" is replaced by the node's name
  unsigned mode = 0600;  // of the socket file: who may send reports
  std::set<uid_t> uids;  // senders allowed besides this process's user and root
};

// Parse the plugin's `relay` table (JSON). Throws std::runtime_error naming the field.
RelayConfig parse_relay_config(const std::string& json);

// A node's relay socket: "{node}" in the configured path replaced by its name
// (the agent binds it, the executor hands it to the node's ranks).
std::string relay_socket_of(std::string path, const std::string& node);

// Refused reports are counted always and logged for the first 100, then
// every 1000th: a flood of bad datagrams must not flood the log.
inline bool log_refusal(uint64_t refused) { return refused <= 100 || refused % 1000 == 0; }

class Relay {
 public:
  Relay(const ballast_host_api* host, RelayConfig cfg);
  ~Relay();
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;
  bool start(std::string* error);
  void stop();
  const std::string& path() const { return path_; }

 private:
  void run();
  void receive();
  void refuse(const std::string& why);
  void log(int level, const std::string& msg);

  const ballast_host_api* host_;
  RelayConfig cfg_;
  std::string node_, path_;
  ino_t inode_ = 0;
  int fd_ = -1;
  int wake_[2] = {-1, -1};
  std::atomic<bool> quit_{false};
  std::thread thread_;
  uint64_t refused_ = 0;
};

}  // namespace ballast::runner
