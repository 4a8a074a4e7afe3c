// Group commit of the controller's applied cursors through a Leadership:
// every thread that needs cursors committed (a connection that published a
// batch, an action about to be recorded) hands over (node, sequence) pairs
// and waits; one thread writes whatever has gathered in one fenced
// transaction (at most Leadership::kMaxCursorsPerCommit nodes) and tells each
// waiter its outcome. So 100 nodes' batches cost one etcd round trip, not 100.
// Thread-safety: commit() from any thread; start/stop from the owner.
#pragma once

#include "controller.hpp"

#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ballast::cluster {

class GroupCommit {
 public:
  explicit GroupCommit(Leadership& leadership) : leadership_(leadership) {}
  ~GroupCommit() { stop(); }
  void start();
  // Fail every waiter with BALLAST_ESTATE and join the thread.
  void stop();
  // Block until transactions holding each node's cursor >= its sequence
  // committed (BALLAST_OK) or one failed (its status, with the message set).
  int commit(const std::map<std::string, uint64_t>& cursors);
  uint64_t transactions() const;

 private:
  struct Ticket {
    std::string node;
    uint64_t seq = 0;
    bool done = false;
    int rc = 0;
    std::string error;
  };
  void run();

  Leadership& leadership_;
  mutable std::mutex mutex_;
  std::condition_variable work_, done_;
  std::map<std::string, uint64_t> pending_;
  std::vector<Ticket*> waiting_;
  bool quit_ = false;
  uint64_t transactions_ = 0;
  std::thread thread_;
};

}  // namespace ballast::cluster
