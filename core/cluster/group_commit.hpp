// Group commit through a Leadership: every thread that needs cursors
// committed (a connection that published a batch, an action about to be
// recorded) hands over (node, sequence) pairs and waits; an event loop that
// read an agent's action acknowledgement hands over the action's id and does
// not wait. One thread writes whatever has gathered in one fenced
// transaction (at most Leadership::kMaxOpsPerCommit cursors and deletions of
// acknowledged actions' records) and tells each waiter its outcome. So 100
// nodes' batches cost one etcd round trip, not 100, and an acknowledgement
// never holds a loop's other connections for one.
// Thread-safety: commit() and forget() from any thread; start/stop from the
// owner.
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
  // Delete these acknowledged actions' records in a coming transaction;
  // returns at once. A transaction that fails is tried again while this
  // controller leads; once deposed the records stay, and the successor's
  // resend is acknowledged again (the agent carries out an action once).
  void forget(const std::vector<uint64_t>& ids);
  uint64_t transactions() const;
  uint64_t forgotten() const;  // acknowledged actions whose records were deleted

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
  std::vector<uint64_t> forget_;
  std::vector<Ticket*> waiting_;
  bool quit_ = false;
  uint64_t transactions_ = 0, forgotten_ = 0;
  std::thread thread_;
};

}  // namespace ballast::cluster
