// The controller role: accepts the agents' authenticated connections,
// applies each node's events once, in order, and sends actions back.
//
// Serving: an acceptor thread hands each accepted socket to one of a few
// event loops (one per core, at most 4), each serving its connections with
// epoll and non-blocking OpenSSL: the TLS handshake and the HELLO within
// handshake_timeout_ms (a stalled peer only loses its own connection), then
// per pass over the ready connections one ingest-journal write (one flush,
// one fdatasync when durable) and, with a Leadership, one group commit of the
// cursors, then the acknowledgements. A connection reads at most
// kReadPerPass bytes a pass (its buffer holds that and one message of at most
// kMaxMessageBody), queues at most kMaxQueuedOut bytes for a peer that does
// not read, and at most max_connections are open at once.
//
// Applying an event (node, seq): seq <= the node's last applied -> a
// duplicate, acknowledged and dropped; otherwise it is published on this
// host's bus under its original source and recorded, then acknowledged.
// Alone, the record is the ingest journal (core/journal, wrapped as in
// wire.hpp; written after the publish, flushed, fdatasync when `durable`): a
// restarted controller reads each node's last sequence from it. With a
// Leadership the record is the cursors the leader commits in transactions
// fenced on its term (grouped across nodes, group_commit.hpp), after the
// publish; an action is recorded only after the cursors of everything
// published before it, so a leader killed before its commit leaves no trace
// of the events it published and its successor applies them, once (see
// apply() for the argument). What could not be published (the bus stopping)
// is not recorded nor acknowledged: the agent resends it.
// A node with no message for silent_after_ms becomes
// `node.silent` (a fault report, kind "silent", detector "cluster"); liveness
// comes from these heartbeats, never from the resource manager.
// Actions: a recovery.action whose subject is a node goes to that node's agent
// with an id (epoch << 24 | counter) and is resent until acknowledged. With a
// Leadership (etcd, leader.hpp), only the leader accepts agents, and each
// action is first recorded through it (fencing): an action it refuses is not
// sent.
// Thread-safety: start/stop from the owning thread; counters() from any.
#pragma once

#include "link.hpp"

#include "journal.hpp"

#include <nlohmann/json.hpp>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <memory_resource>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace ballast {
class Host;
}

namespace ballast::cluster {

class GroupCommit;

// What HA adds to a controller (leader.hpp implements it over etcd).
class Leadership {
 public:
  struct LoggedAction {
    std::string node;
    uint64_t id;
    std::string json;  // event_to_json of the recovery.action
  };
  virtual ~Leadership() = default;
  virtual bool is_leader() const = 0;
  // A number that grows with every term (the leader key's revision).
  virtual uint64_t epoch() const = 0;
  // Record an action in the shared log, only while this controller leads.
  // BALLAST_ESTATE when deposed: the action must not run.
  virtual int record_action(const std::string& node, uint64_t id, const std::string& action_json) = 0;
  // Record an action this controller's own process carries out (a plugin's
  // fence_action, plugin.h: {"node","plugin","kind","record","term"}) under
  // the same ids, in the plugin's part of the log, only while this
  // controller leads. BALLAST_ESTATE when deposed: the action must not run.
  // Kept: such records are the log of what the leaders did outside their
  // process, until the plugin's next snapshot: a `snapshot` record (a kind
  // ending in ".snapshot") is the plugin's whole state, and the same
  // transaction deletes every earlier record of the plugin.
  virtual int record_own_action(const std::string& plugin, uint64_t id, const std::string& record_json,
                                bool snapshot) = 0;
  // In one transaction fenced on this term: each node's events up to its
  // sequence are applied (cursors), and the records of the actions their
  // agents acknowledged are deleted (at most kMaxOpsPerCommit of both).
  // BALLAST_ESTATE when deposed: the events must not be published or
  // acknowledged; the actions' records stay (a successor sends them again,
  // and the agent, which carries out an action once, acknowledges again).
  static constexpr size_t kMaxOpsPerCommit = 128;  // etcd 3.4's --max-txn-ops
  virtual int commit(const std::map<std::string, uint64_t>& cursors, const std::vector<uint64_t>& acknowledged) = 0;
  // What the previous leaders left, read when this term began.
  virtual std::map<std::string, uint64_t> cursors() const = 0;
  virtual std::vector<LoggedAction> logged_actions() const = 0;
};

struct ControllerOptions {
  std::string listen = "127.0.0.1:7700";
  TlsFiles tls;
  std::string ingest_journal;
  bool durable = true;
  int heartbeat_ms = 1000;
  int silent_after_ms = 5000;
  int handshake_timeout_ms = 5000;
  int max_connections = 16384;
  int loops = 0;  // event-loop threads; 0 = one per core, at most 4
};

class Controller {
 public:
  static int create(Host& host, ControllerOptions options, Leadership* leadership, std::unique_ptr<Controller>* out);
  ~Controller();
  int start();
  void stop();
  nlohmann::json counters() const;
  // The node's last applied sequence (0 = none).
  uint64_t applied(const std::string& node) const;
  // plugin.h's fence_action with a Leadership: after the cursors of every
  // event this bus published are committed (as for an agent's action), the
  // record goes to the action log in a transaction fenced on this term.
  // BALLAST_EFENCED when this controller does not lead (or no longer does).
  int fence_action(const std::string& plugin, const std::string& kind, const nlohmann::json& record);

  struct Conn;
  struct Loop;

  static constexpr size_t kReadPerPass = 256 << 10;
  static constexpr size_t kMaxQueuedOut = 8 << 20;

 private:
  struct NodeState {
    // Held while a batch of this node is applied: a reconnecting agent can
    // have two connections for a moment, and only one may apply a sequence.
    std::mutex apply_mutex;
    uint64_t applied = 0;    // under mutex_
    uint64_t published = 0;  // with HA: the last sequence this bus saw (committed or not)
    int64_t last_heard_ms = 0;
    bool silent = false;
    uint64_t overflow = 0;
    Loop* loop = nullptr;  // the connection that speaks for the node: its loop and id (0 = none)
    uint64_t conn = 0;
    uint64_t next_action = 0;
    std::deque<std::pair<uint64_t, std::vector<unsigned char>>> actions;  // unacknowledged
  };

  struct Item {
    uint64_t seq;
    bool good;                   // a frame that decoded; a bad one is journaled, not published
    ballast_event event;         // decoded into the batch's memory
    const unsigned char* frame;  // in the link's input buffer: valid until its next receive
    size_t frame_size;
    size_t decoded_size;  // the bytes of the frame the event was decoded from
  };
  // One connection's batch of a pass.
  struct Batch {
    std::vector<Item> items;
    std::pmr::monotonic_buffer_resource memory;  // the items' events: released with them
  };

  explicit Controller(Host& host);
  // The events applied.
  size_t apply_pass(Loop& loop, std::vector<Conn*>& batched);
  int journal(Loop& loop, const std::vector<Conn*>& conns, bool all_items);
  void accept_loop();
  void run_loop(Loop& loop);
  void take_incoming(Loop& loop, std::vector<Conn*>* ready);
  void step(Loop& loop, Conn& c, std::vector<Conn*>* batched);
  bool on_message(Loop& loop, Conn& c, const Message& m, std::string* error);
  bool on_hello(Loop& loop, Conn& c, const Message& m, std::string* error);
  void refuse(Loop& loop, Conn& c, const std::string& why);
  void tick(Loop& loop);
  void poked(Loop& loop, Conn& c);
  void send(Loop& loop, Conn& c, std::optional<MsgType> type, uint64_t number = 0, const void* body = nullptr,
            size_t body_size = 0);
  void flush(Loop& loop);
  void close(Loop& loop, Conn& c);
  void finish_closing(Loop& loop);
  void watch_silence();
  void publish_back(const std::string& node, int64_t silent_ms);
  void publish_node(const char* topic, const std::string& node, const nlohmann::json& j);
  static int on_action(void* user, const ballast_event* event);
  void take_over();
  uint64_t next_action_id();

  Host& host_;
  ControllerOptions options_;
  Leadership* leadership_ = nullptr;
  std::unique_ptr<GroupCommit> commits_;  // with a Leadership
  std::unique_ptr<TlsConfig> tls_;
  JournalWriter ingest_;
  int listen_fd_ = -1;
  int stop_pipe_[2] = {-1, -1};
  std::atomic<bool> quit_{false};
  std::thread acceptor_, watcher_;
  std::vector<std::unique_ptr<Loop>> loops_;
  mutable std::mutex mutex_;  // nodes_
  std::mutex records_mutex_;  // fence_action's records, one at a time
  std::condition_variable quit_cv_;
  std::map<std::string, NodeState> nodes_;
  uint64_t action_subscription_ = 0;
  uint64_t epoch_ = 0;
  uint64_t term_seen_ = 0;
  std::atomic<uint64_t> action_counter_{0};
  std::atomic<int> open_{0};  // connections open
  std::atomic<uint64_t> applied_events_{0}, duplicates_{0}, gaps_{0}, refused_{0}, bad_frames_{0}, silent_{0}, back_{0},
      actions_sent_{0}, actions_fenced_off_{0}, connections_{0}, passes_{0};
};

}  // namespace ballast::cluster
