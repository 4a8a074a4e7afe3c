#include "controller.hpp"

#include "group_commit.hpp"

#include "error.hpp"
#include "host.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

namespace ballast::cluster {

namespace {

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

struct Controller::Conn {
  int fd = -1;  // handed to the Link by serve()
  std::string address;
  int wake_fd = -1;
  std::string node;
  std::atomic<bool> kicked{false};
  std::atomic<bool> done{false};
  std::thread thread;
  ~Conn() {
    if (wake_fd >= 0) close(wake_fd);
  }
  void wake() {
    uint64_t one = 1;
    ssize_t n = write(wake_fd, &one, sizeof one);
    (void)n;
  }
};

int Controller::create(Host& host, ControllerOptions options, Leadership* leadership,
                       std::unique_ptr<Controller>* out) {
  if (options.ingest_journal.empty())
    return fail(BALLAST_EINVAL, "cluster.ingest_journal: the controller needs a journal path");
  auto c = std::unique_ptr<Controller>(new Controller(host));
  if (int rc = TlsConfig::load(options.tls, true, &c->tls_); rc != BALLAST_OK) return rc;
  // The dedup state: the last sequence applied from each node.
  int rc = read_journal(
      options.ingest_journal, JournalMode::skip_bad,
      [&](const OwnedEvent& ev, uint64_t) {
        Spooled sp;
        if (!unwrap_spooled(ev.view(), &sp)) return;
        auto& n = c->nodes_[sp.node];
        n.applied = std::max(n.applied, sp.seq);
      },
      [&](const JournalProblem& p) {
        host.log(BALLAST_LOG_WARN, "cluster",
                 options.ingest_journal + " at byte " + std::to_string(p.offset) + ": " + p.reason);
      });
  if (rc != BALLAST_OK && rc != BALLAST_ENOTFOUND) return rc;
  if (int r = c->ingest_.open(options.ingest_journal); r != BALLAST_OK) return r;
  c->options_ = std::move(options);
  c->leadership_ = leadership;
  if (leadership) c->commits_ = std::make_unique<GroupCommit>(*leadership);
  // Action ids grow across restarts: the epoch is the start time (or the term).
  c->epoch_ = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  for (auto& [name, n] : c->nodes_) n.last_heard_ms = now_ms();
  *out = std::move(c);
  return BALLAST_OK;
}

Controller::Controller(Host& host) : host_(host) {}

Controller::~Controller() {
  stop();
  for (int fd : stop_pipe_)
    if (fd >= 0) close(fd);
}

int Controller::start() {
  std::string host, error;
  uint16_t port = 0;
  if (!split_host_port(options_.listen, &host, &port, &error)) return fail(BALLAST_EINVAL, "cluster.listen " + error);
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0)
    return fail(BALLAST_EINVAL, "cluster.listen " + options_.listen + ": " + gai_strerror(rc));
  listen_fd_ = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  int rc = bind(listen_fd_, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  if (rc != 0 || listen(listen_fd_, 1024) != 0) {
    std::string why = std::strerror(errno);
    close(listen_fd_);
    listen_fd_ = -1;
    return fail(BALLAST_EIO, "cluster.listen " + options_.listen + ": " + why);
  }
  if (pipe2(stop_pipe_, O_CLOEXEC) != 0) return fail(BALLAST_EIO, "pipe failed");
  ballast_subscribe_options opts{sizeof opts, BALLAST_DELIVER_QUEUED, 0, 0};
  if (int r = host_.subscribe("recovery.action", &opts, on_action, this, "cluster", &action_subscription_);
      r != BALLAST_OK)
    return r;
  if (commits_) commits_->start();
  acceptor_ = std::thread([this] { accept_loop(); });
  watcher_ = std::thread([this] { watch_silence(); });
  host_.log(BALLAST_LOG_INFO, "cluster",
            "controller listening on " + options_.listen + " (" + std::to_string(nodes_.size()) +
                " node(s) known from " + options_.ingest_journal + ")");
  return BALLAST_OK;
}

void Controller::stop() {
  if (quit_.exchange(true)) return;
  if (action_subscription_ != 0) host_.unsubscribe(action_subscription_);
  if (stop_pipe_[1] >= 0) {
    char c = 0;
    ssize_t n = write(stop_pipe_[1], &c, 1);
    (void)n;
  }
  quit_cv_.notify_all();
  if (acceptor_.joinable()) acceptor_.join();
  if (watcher_.joinable()) watcher_.join();
  reap(true);
  if (commits_) commits_->stop();
  if (listen_fd_ >= 0) close(listen_fd_);
  listen_fd_ = -1;
  ingest_.flush(options_.durable);
  ingest_.close();
}

// Join finished connection threads (all of them, after waking them, when `all`).
void Controller::reap(bool all) {
  std::vector<std::unique_ptr<Conn>> finished;
  {
    std::lock_guard lock(mutex_);
    for (auto& c : conns_)
      if (all) c->wake();
    for (auto it = conns_.begin(); it != conns_.end();) {
      if (all || (*it)->done.load()) {
        finished.push_back(std::move(*it));
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& c : finished)
    if (c->thread.joinable()) c->thread.join();
}

void Controller::accept_loop() {
  while (!quit_.load()) {
    pollfd p[2] = {{listen_fd_, POLLIN, 0}, {stop_pipe_[0], POLLIN, 0}};
    if (poll(p, 2, 1000) <= 0) {
      reap(false);
      continue;
    }
    if (p[1].revents) break;
    sockaddr_storage peer{};
    socklen_t len = sizeof peer;
    int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_CLOEXEC);
    if (fd < 0) continue;
    char host[NI_MAXHOST] = "?", serv[NI_MAXSERV] = "?";
    getnameinfo(reinterpret_cast<sockaddr*>(&peer), len, host, sizeof host, serv, sizeof serv,
                NI_NUMERICHOST | NI_NUMERICSERV);
    auto conn = std::make_unique<Conn>();
    conn->fd = fd;
    conn->address = std::string(host) + ":" + serv;
    conn->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    Conn* raw = conn.get();
    connections_.fetch_add(1);
    {
      std::lock_guard lock(mutex_);
      conns_.push_back(std::move(conn));
    }
    raw->thread = std::thread([this, raw] {
      serve(raw);
      raw->done.store(true);
    });
    reap(false);
  }
}

void Controller::serve(Conn* conn) {
  std::unique_ptr<Link> link;
  std::string error;
  if (Link::accept(*tls_, conn->fd, conn->address, options_.handshake_timeout_ms, &link, &error) != BALLAST_OK) {
    refused_.fetch_add(1);
    host_.log(BALLAST_LOG_WARN, "cluster", "refused connection from " + conn->address + ": " + error);
    return;
  }
  // The first message must be HELLO naming the node of the certificate.
  std::string node;
  bool said_hello = false;
  int64_t deadline = now_ms() + options_.handshake_timeout_ms;
  uint64_t overflow = 0;
  while (!said_hello && now_ms() < deadline && !quit_.load()) {
    if (!link->pump(
            100, -1,
            [&](const Message& m) {
              if (m.type != MsgType::hello) {
                error = "first message is not hello";
                return false;
              }
              auto j = nlohmann::json::parse(m.body, m.body + m.body_size, nullptr, false);
              if (!j.is_object() || !j.contains("node") || !j["node"].is_string()) {
                error = "hello without a node name";
                return false;
              }
              node = j["node"].get<std::string>();
              if (j.contains("overflow") && j["overflow"].is_number_unsigned())
                overflow = j["overflow"].get<uint64_t>();
              said_hello = true;
              return true;
            },
            &error))
      break;
  }
  auto refuse = [&](const std::string& why) {
    refused_.fetch_add(1);
    host_.log(BALLAST_LOG_WARN, "cluster", "refused connection from " + conn->address + ": " + why);
    link->send(MsgType::refuse, 0, why.data(), why.size());
    std::string ignored;
    link->pump(
        0, -1, [](const Message&) { return true; }, &ignored);
  };
  if (!said_hello) return refuse(error.empty() ? "no hello" : error);
  if (node != link->peer_name())
    return refuse("node '" + node + "' does not match its certificate's name '" + link->peer_name() + "'");
  if (leadership_ && !leadership_->is_leader()) return refuse("this controller is not the leader");
  if (leadership_) take_over();

  // This connection now speaks for the node; an older one is dropped.
  uint64_t applied = 0;
  int64_t silent_for_ms = -1;  // the node was node.silent this long, or -1
  {
    std::lock_guard lock(mutex_);
    NodeState& n = nodes_[node];
    if (n.conn != nullptr) {
      n.conn->kicked.store(true);
      n.conn->wake();
    }
    n.conn = conn;
    conn->node = node;
    applied = n.applied;
    if (n.silent) silent_for_ms = now_ms() - n.last_heard_ms;
    n.last_heard_ms = now_ms();
    n.silent = false;
    n.overflow = overflow;
    for (auto& [id, frame] : n.actions) {
      link->send(MsgType::action, id, frame.data(), frame.size());
      n.next_action = id;
    }
  }
  link->send(MsgType::welcome, applied);
  if (silent_for_ms >= 0) publish_back(node, silent_for_ms);
  host_.log(BALLAST_LOG_INFO, "cluster",
            "node " + node + " connected from " + conn->address + " (applied up to " + std::to_string(applied) + ")");
  publish_node("node.connected", node, {{"node", node}, {"term", leadership_ ? leadership_->epoch() : uint64_t(0)}});

  Batch batch;
  uint64_t pending = applied;  // the highest sequence taken into the batch
  int64_t last_hb = 0, last_rx = now_ms();
  bool broken = false;
  while (!quit_.load() && !conn->kicked.load() && !broken) {
    if (leadership_ && !leadership_->is_leader()) {
      host_.log(BALLAST_LOG_WARN, "cluster", "node " + node + ": closing, this controller no longer leads");
      break;
    }
    int64_t now = now_ms();
    if (now - last_hb >= options_.heartbeat_ms) {
      link->send(MsgType::heartbeat, static_cast<uint64_t>(now));
      last_hb = now;
    }
    bool ok = link->pump(
        static_cast<int>(std::max<int64_t>(1, options_.heartbeat_ms - (now - last_hb))), conn->wake_fd,
        [&](const Message& m) {
          last_rx = now_ms();
          switch (m.type) {
            case MsgType::event: {
              if (m.number <= pending) {
                duplicates_.fetch_add(1, std::memory_order_relaxed);
                return true;
              }
              if (m.number != pending + 1) {
                gaps_.fetch_add(1);
                host_.log(BALLAST_LOG_WARN, "cluster",
                          "node " + node + ": sequence " + std::to_string(m.number) + " follows " +
                              std::to_string(pending) + " (the agent lost its spool?)");
              }
              Item item{m.number, true, {}, m.body, m.body_size, 0};
              std::string why;
              if (decode_frame_into(m.body, m.body_size, &batch.memory, &item.event, &item.decoded_size, &why) !=
                  BALLAST_OK) {
                bad_frames_.fetch_add(1);
                item.good = false;
                host_.log(BALLAST_LOG_WARN, "cluster",
                          "node " + node + " sequence " + std::to_string(m.number) + ": bad frame skipped: " + why);
              }
              batch.items.push_back(std::move(item));
              pending = m.number;
              return true;
            }
            case MsgType::heartbeat:
              if (m.body_size == sizeof(uint64_t)) {
                uint64_t o;
                std::memcpy(&o, m.body, sizeof o);
                std::lock_guard lock(mutex_);
                NodeState& n = nodes_[node];
                if (o > n.overflow) {
                  host_.log(BALLAST_LOG_WARN, "cluster",
                            "node " + node + " lost " + std::to_string(o) + " event(s) to a full spool");
                  nlohmann::json j = {{"node", node}, {"overflow", o}};
                  host_.publish_json("node.spool_overflow", j.dump(), "cluster");
                }
                n.overflow = o;
              }
              return true;
            case MsgType::action_ack: {
              std::vector<uint64_t> done;
              {
                std::lock_guard lock(mutex_);
                auto& q = nodes_[node].actions;
                while (!q.empty() && q.front().first <= m.number) {
                  done.push_back(q.front().first);
                  q.pop_front();
                }
              }
              if (leadership_)
                for (uint64_t id : done) leadership_->forget_action(id);
              return true;
            }
            default:
              error = "unexpected message type " + std::to_string(static_cast<int>(m.type));
              return false;
          }
        },
        &error);
    uint64_t v;
    ssize_t n = read(conn->wake_fd, &v, sizeof v);
    (void)n;
    if (!batch.items.empty()) {
      NodeState* ns_ptr;
      {
        std::lock_guard lock(mutex_);
        ns_ptr = &nodes_[node];  // map nodes are never erased: the pointer stays valid
      }
      std::unique_lock apply_lock(ns_ptr->apply_mutex);
      {
        std::lock_guard lock(mutex_);
        applied = std::max(applied, ns_ptr->applied);  // another connection of this node may have gone on
      }
      std::erase_if(batch.items, [&](const Item& item) {
        if (item.seq > applied) return false;
        duplicates_.fetch_add(1, std::memory_order_relaxed);
        return true;
      });
      uint64_t done = applied;
      bool stopped = false;
      if (!batch.items.empty()) {
        if (apply(node, batch, &done) != BALLAST_OK) {
          // Not acknowledged: the agent resends what this bus has not seen.
          std::lock_guard lock(mutex_);
          nodes_[node].applied = std::max(nodes_[node].applied, leadership_ ? nodes_[node].published : 0);
          break;
        }
        stopped = done < batch.items.back().seq;
      }
      applied_events_.fetch_add(done - applied, std::memory_order_relaxed);
      batch.items.clear();
      batch.memory.release();
      {
        std::lock_guard lock(mutex_);
        nodes_[node].applied = done;
      }
      applied = done;
      link->send(MsgType::ack, applied);
      if (stopped) {
        std::string ignored;
        link->pump(
            0, -1, [](const Message&) { return true; }, &ignored);
        break;
      }
    }
    {
      std::lock_guard lock(mutex_);
      NodeState& ns = nodes_[node];
      ns.last_heard_ms = last_rx;
      // Actions queued since the last round.
      for (auto& [id, frame] : ns.actions)
        if (id > ns.next_action) {
          link->send(MsgType::action, id, frame.data(), frame.size());
          ns.next_action = id;
          actions_sent_.fetch_add(1);
        }
    }
    if (!ok) {
      host_.log(BALLAST_LOG_WARN, "cluster", "node " + node + ": link lost: " + error);
      broken = true;
    } else if (now_ms() - last_rx > options_.silent_after_ms) {
      host_.log(BALLAST_LOG_WARN, "cluster", "node " + node + ": silent, closing its connection");
      broken = true;
    }
  }
  std::lock_guard lock(mutex_);
  NodeState& ns = nodes_[node];
  if (ns.conn == conn) {
    ns.conn = nullptr;
    ns.next_action = 0;  // resent on the next connection
  }
}

// Apply a batch (its sequences all above the node's applied cursor *done);
// *done becomes the last sequence applied.
//
// Without HA the ingest journal is the record of what is applied: publish,
// then journal and flush. What is not published (the bus stopping) is
// neither journaled nor acknowledged; a controller killed between the publish
// and the journal's write publishes that batch again when restarted (its bus
// that saw it first died with it).
//
// With HA, what is applied is what etcd says: the cursors each term commits,
// in transactions fenced on its leadership. A leader journals a batch, then
// publishes it, then commits the cursor (grouped with other nodes'), then
// acknowledges. Its bus is in memory: what a leader killed before its commit
// published died with its bus and the successor applies it. What could
// outlive the bus is an action, and an action is recorded only after the
// cursors of everything published before it are committed (on_action). So
// the record (cursors + actions) always reflects each event exactly once: a
// term applies the sequences between the cursor it read when it began and
// the last cursor it committed. An uncertain commit (etcd applied it, the
// leader died before hearing so) covers only published events: nothing lost.
// The ingest journal holds what was prepared; its entries above the next
// term's starting cursor were never applied.
int Controller::apply(const std::string& node, Batch& batch, uint64_t* done) {
  const uint64_t before = *done;
  if (leadership_ && journal(node, batch, batch.items.size()) != BALLAST_OK) return BALLAST_EIO;
  size_t published = 0;
  for (auto& item : batch.items) {
    if (item.good) {
      const ballast_event& ev = item.event;
      if (host_.publish_decoded(ev, ev.source.plugin ? ev.source.plugin : "cluster", item.frame, item.decoded_size) !=
          BALLAST_OK) {
        host_.log(BALLAST_LOG_WARN, "cluster",
                  "node " + node + ": sequence " + std::to_string(item.seq) + " and later not applied (" +
                      last_error() + "); the agent resends them");
        break;
      }
    }
    ++published;
  }
  *done = published > 0 ? batch.items[published - 1].seq : before;
  if (!leadership_) return journal(node, batch, published);
  {
    std::lock_guard lock(mutex_);
    nodes_[node].published = *done;  // this bus saw them, committed or not
  }
  if (*done > before && commits_->commit({{node, *done}}) != BALLAST_OK) {
    host_.log(BALLAST_LOG_WARN, "cluster",
              "node " + node + ": cursor " + std::to_string(*done) + " not committed (" + last_error() +
                  "); not acknowledged");
    return BALLAST_ESTATE;
  }
  return BALLAST_OK;
}

// The first `count` events of the batch into the ingest journal in one write,
// flushed (fdatasync when durable).
int Controller::journal(const std::string& node, Batch& batch, size_t count) {
  if (batch.wrapped.size() < count) batch.wrapped.resize(count);
  batch.events.clear();
  for (size_t i = 0; i < count; ++i) {
    const Item& item = batch.items[i];
    batch.events.push_back(wrap_spooled(node.c_str(), item.seq, item.frame, item.frame_size, &batch.wrapped[i]));
  }
  if (ingest_.append_batch(batch.events.data(), batch.events.size()) != BALLAST_OK) {
    host_.log(BALLAST_LOG_ERROR, "cluster", std::string("ingest journal: ") + last_error());
    return BALLAST_EIO;
  }
  if (ingest_.flush(options_.durable) != BALLAST_OK) {
    host_.log(BALLAST_LOG_ERROR, "cluster", std::string("ingest journal flush: ") + last_error());
    return BALLAST_EIO;
  }
  return BALLAST_OK;
}

// A new term: continue from the cursors and the unacknowledged actions the
// previous leaders committed to etcd.
void Controller::take_over() {
  uint64_t term = leadership_->epoch();
  {
    std::lock_guard lock(mutex_);
    if (term == term_seen_) return;
    term_seen_ = term;
  }
  auto cursors = leadership_->cursors();
  auto actions = leadership_->logged_actions();
  std::lock_guard lock(mutex_);
  // The committed cursors are what is applied, and what this controller's bus
  // saw in an earlier term of its own (it would not see it twice); its journal
  // may hold more (prepared, never published). Connections of an earlier term
  // are closed: their agents reconnect into this one.
  for (auto& [node, n] : nodes_) {
    auto it = cursors.find(node);
    n.applied = std::max(it == cursors.end() ? 0 : it->second, n.published);
    if (n.conn != nullptr) {
      n.conn->kicked.store(true);
      n.conn->wake();
    }
  }
  for (auto& [node, seq] : cursors) {
    NodeState& n = nodes_[node];
    n.applied = std::max(seq, n.published);
    n.last_heard_ms = now_ms();
  }
  for (auto& a : actions) {
    OwnedEvent ev;
    std::string why;
    if (event_from_json(nlohmann::json::parse(a.json, nullptr, false), &ev, &why) != BALLAST_OK) {
      host_.log(BALLAST_LOG_WARN, "cluster", "logged action " + std::to_string(a.id) + " unreadable: " + why);
      continue;
    }
    std::vector<unsigned char> frame;
    encode_frame(ev.view(), &frame);
    // A node known only from its pending actions is heard of as of this term's start.
    if (nodes_.count(a.node) == 0) nodes_[a.node].last_heard_ms = now_ms();
    auto& q = nodes_[a.node].actions;
    bool have = false;
    for (auto& [id, f] : q) have = have || id == a.id;
    if (!have) q.emplace_back(a.id, std::move(frame));
  }
}

void Controller::watch_silence() {
  std::unique_lock lock(mutex_);
  while (!quit_.load()) {
    quit_cv_.wait_for(lock, std::chrono::milliseconds(100));
    int64_t now = now_ms();
    for (auto& [name, n] : nodes_) {
      if (n.silent || now - n.last_heard_ms <= options_.silent_after_ms) continue;
      n.silent = true;
      silent_.fetch_add(1);
      ballast_fault_report r{};
      r.size = sizeof r;
      r.stage = BALLAST_FAULT_SUSPECTED;
      r.subject = name.c_str();
      r.rank = -1;
      r.kind = "silent";
      r.confidence = 1.0;
      r.score = static_cast<double>(now - n.last_heard_ms) / 1000.0;
      r.detected_ns =
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
              .count();
      r.since_ns = r.detected_ns - (now - n.last_heard_ms) * 1000000;
      r.detector = "cluster";
      ballast_event ev{};
      ev.size = sizeof ev;
      ev.schema = BALLAST_SCHEMA_FAULT_REPORT;
      ev.topic = "node.silent";
      ev.source.node = name.c_str();
      ev.source.rank = -1;
      ev.payload = &r;
      ev.payload_size = sizeof r;
      host_.log(BALLAST_LOG_WARN, "cluster",
                "node " + name + " silent for " + std::to_string(now - n.last_heard_ms) + " ms: node.silent");
      lock.unlock();
      host_.publish(ev, "cluster");
      lock.lock();
      break;  // nodes_ may have changed; the next round goes on
    }
  }
}

// A node.silent node heard again (its agent reconnected, authenticated,
// after its link or its machine came back): node.back, which the executor's
// Slurm backend resumes a drained node on. JSON: {"node", "silent_ms"}.
void Controller::publish_back(const std::string& node, int64_t silent_ms) {
  back_.fetch_add(1);
  host_.log(BALLAST_LOG_INFO, "cluster",
            "node " + node + " is back after " + std::to_string(silent_ms) + " ms silent: node.back");
  publish_node("node.back", node, {{"node", node}, {"silent_ms", silent_ms}});
}

// A JSON event about an agent's node, from that node.
void Controller::publish_node(const char* topic, const std::string& node, const nlohmann::json& j) {
  const std::string text = j.dump();
  ballast_event ev{};
  ev.size = sizeof ev;
  ev.schema = BALLAST_SCHEMA_JSON;
  ev.topic = topic;
  ev.source.node = node.c_str();
  ev.source.rank = -1;
  ev.payload = text.data();
  ev.payload_size = text.size();
  host_.publish(ev, "cluster");
}

int Controller::on_action(void* user, const ballast_event* event) {
  auto* self = static_cast<Controller*>(user);
  if (event->schema != BALLAST_SCHEMA_RECOVERY_ACTION || event->payload == nullptr) return 0;
  const auto* a = static_cast<const ballast_recovery_action*>(event->payload);
  if (a->subject == nullptr) return 0;
  std::string node = a->subject;
  std::unique_lock lock(self->mutex_);
  auto it = self->nodes_.find(node);
  if (it == self->nodes_.end()) return 0;  // not an agent's node: the executor's business
  const uint64_t id = self->next_action_id();
  std::vector<unsigned char> frame;
  encode_frame(*event, &frame);
  lock.unlock();
  if (self->leadership_) {
    // Whatever this bus published before the action (which may have caused
    // it) is committed first: an action never outlives the events behind it.
    std::map<std::string, uint64_t> published;
    {
      std::lock_guard state_lock(self->mutex_);
      for (auto& [name, n] : self->nodes_)
        if (n.published > 0) published[name] = n.published;
    }
    if (self->commits_->commit(published) != BALLAST_OK) {
      self->actions_fenced_off_.fetch_add(1);
      self->host_.log(BALLAST_LOG_WARN, "cluster",
                      std::string("action for ") + node + " not sent (cursors not committed): " + last_error());
      return 0;
    }
    nlohmann::json j = event_to_json(*event);
    if (self->leadership_->record_action(node, id, j.dump()) != BALLAST_OK) {
      self->actions_fenced_off_.fetch_add(1);
      self->host_.log(BALLAST_LOG_WARN, "cluster",
                      std::string("action for ") + node + " not sent (fenced off): " + last_error());
      return 0;
    }
  }
  lock.lock();
  auto& m = self->nodes_[node];
  m.actions.emplace_back(id, std::move(frame));
  if (m.conn) m.conn->wake();
  return 0;
}

// Ids grow across restarts and terms: the epoch (start time, or the term's
// revision) above a counter.
uint64_t Controller::next_action_id() {
  const uint64_t epoch = leadership_ ? leadership_->epoch() : epoch_;
  return (epoch << 24) | ((action_counter_.fetch_add(1) + 1) & 0xffffff);
}

int Controller::fence_action(const std::string& plugin, const std::string& kind, const nlohmann::json& record) {
  if (!leadership_) return BALLAST_OK;
  const std::string what = kind + " (" + plugin + ")";
  auto refused = [&](int rc) {
    const std::string why = last_error();
    return fail(rc == BALLAST_ESTATE ? BALLAST_EFENCED : rc, what + " fenced off: " + why);
  };
  if (!leadership_->is_leader())
    return fail(BALLAST_EFENCED, what + " fenced off: " + host_.node() + " is not the leader");
  // As for an agent's action (on_action): what this bus published before it
  // is committed first.
  std::map<std::string, uint64_t> published;
  {
    std::lock_guard lock(mutex_);
    for (auto& [name, n] : nodes_)
      if (n.published > 0) published[name] = n.published;
  }
  if (!published.empty())
    if (int rc = commits_->commit(published); rc != BALLAST_OK) return refused(rc);
  const nlohmann::json j = {
      {"node", host_.node()}, {"plugin", plugin}, {"kind", kind}, {"record", record}, {"term", leadership_->epoch()}};
  if (int rc = leadership_->record_own_action(next_action_id(), j.dump()); rc != BALLAST_OK) return refused(rc);
  return BALLAST_OK;
}

uint64_t Controller::applied(const std::string& node) const {
  std::lock_guard lock(mutex_);
  auto it = nodes_.find(node);
  return it == nodes_.end() ? 0 : it->second.applied;
}

nlohmann::json Controller::counters() const {
  size_t connected = 0;
  {
    std::lock_guard lock(mutex_);
    for (auto& [k, n] : nodes_) connected += n.conn != nullptr;
  }
  nlohmann::json j = {{"cluster.applied", applied_events_.load()},
                      {"cluster.duplicates", duplicates_.load()},
                      {"cluster.gaps", gaps_.load()},
                      {"cluster.refused", refused_.load()},
                      {"cluster.bad_frames", bad_frames_.load()},
                      {"cluster.node_silent", silent_.load()},
                      {"cluster.node_back", back_.load()},
                      {"cluster.actions_sent", actions_sent_.load()},
                      {"cluster.actions_fenced_off", actions_fenced_off_.load()},
                      {"cluster.connections", connections_.load()},
                      {"cluster.connected", connected}};
  if (commits_) j["cluster.cursor_commits"] = commits_->transactions();
  return j;
}

}  // namespace ballast::cluster
