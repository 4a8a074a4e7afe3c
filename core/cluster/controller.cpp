#include "controller.hpp"

#include "group_commit.hpp"

#include "error.hpp"
#include "host.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <unordered_map>
#include <unordered_set>

namespace ballast::cluster {

namespace {

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// How often a loop looks at deadlines, heartbeats and silence.
constexpr int kTickMs = 100;
// A pass that applied fewer than kCoalesceBelow events waits out the rest of
// its window before the next: at a steady offered rate the next pass then
// takes what arrived meanwhile with one journal write (one fdatasync, dear on
// a VM, when durable) and one round of acknowledgements, not a wake-up per
// event. A busy loop's passes are longer and never wait; an idle one blocks
// in epoll_wait.
constexpr auto kCoalesce = std::chrono::microseconds(1000);
constexpr auto kCoalesceDurable = std::chrono::microseconds(4000);
constexpr size_t kCoalesceBelow = 256;

}  // namespace

struct Controller::Conn {
  uint64_t id = 0;
  std::unique_ptr<Link> link;
  enum class State { tls, hello, serving } state = State::tls;
  int64_t deadline_ms = 0;  // of the TLS handshake, then of the hello
  std::string node;
  NodeState* ns = nullptr;  // once serving (map nodes are never erased)
  uint64_t applied = 0;     // acknowledged
  uint64_t pending = 0;     // the highest sequence taken into the batch
  int64_t last_rx = 0, last_hb = 0;
  Batch batch;
  size_t published = 0;  // of the batch, in this pass
  uint64_t done = 0;     // the last sequence applied in this pass
  bool stopped = false;  // the bus stopped: close once acknowledged
  uint64_t pass = 0;     // the last pass that read it
  bool dirty = false;    // output queued since the last flush
  bool watching_out = false;
  bool closing = false;
};

struct Controller::Loop {
  int epoll_fd = -1, wake_fd = -1;
  std::thread thread;
  std::mutex mutex;  // incoming and pokes
  struct Incoming {
    uint64_t id;
    int fd;
    std::string address;
  };
  std::vector<Incoming> incoming;
  std::vector<uint64_t> pokes;  // connections with new actions, or no longer speaking for their node
  // The loop's own (its thread only):
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns;
  std::vector<Conn*> again;  // to serve in the next pass without waiting
  std::vector<Conn*> dirty, closing, held;
  std::unordered_set<NodeState*> holding;
  std::vector<std::vector<unsigned char>> wrapped;  // the journal's wrapper payloads
  std::vector<ballast_event> events;
  uint64_t pass = 0;
  int64_t last_tick = 0;

  ~Loop() {
    if (epoll_fd >= 0) ::close(epoll_fd);
    if (wake_fd >= 0) ::close(wake_fd);
  }
  void wake() {
    uint64_t one = 1;
    ssize_t n = write(wake_fd, &one, sizeof one);
    (void)n;
  }
  void poke(uint64_t conn) {
    {
      std::lock_guard lock(mutex);
      pokes.push_back(conn);
    }
    wake();
  }
  void watch(Conn& c, bool out) {
    epoll_event ev{};
    ev.events = EPOLLIN | (out ? EPOLLOUT : 0u);
    ev.data.u64 = c.id;
    epoll_ctl(epoll_fd, EPOLL_CTL_MOD, c.link->fd(), &ev);
    c.watching_out = out;
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
    if (fd >= 0) ::close(fd);
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
    ::close(listen_fd_);
    listen_fd_ = -1;
    return fail(BALLAST_EIO, "cluster.listen " + options_.listen + ": " + why);
  }
  if (pipe2(stop_pipe_, O_CLOEXEC) != 0) return fail(BALLAST_EIO, "pipe failed");
  // A socket per agent: room for the bound on connections, as far as the hard limit allows.
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0) {
    const rlim_t want = static_cast<rlim_t>(options_.max_connections) + 256;
    if (files.rlim_cur < want) {
      files.rlim_cur = std::min(want, files.rlim_max);
      setrlimit(RLIMIT_NOFILE, &files);
    }
  }
  const int loops =
      options_.loops > 0 ? options_.loops : std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 4);
  for (int i = 0; i < loops; ++i) {
    auto loop = std::make_unique<Loop>();
    loop->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    loop->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = 0;  // connection ids start at 1
    if (loop->epoll_fd < 0 || loop->wake_fd < 0 || epoll_ctl(loop->epoll_fd, EPOLL_CTL_ADD, loop->wake_fd, &ev) != 0)
      return fail(BALLAST_EIO, std::string("cluster: event loop: ") + std::strerror(errno));
    loops_.push_back(std::move(loop));
  }
  ballast_subscribe_options opts{sizeof opts, BALLAST_DELIVER_QUEUED, 0, 0};
  if (int r = host_.subscribe("recovery.action", &opts, on_action, this, "cluster", &action_subscription_);
      r != BALLAST_OK)
    return r;
  if (commits_) commits_->start();
  for (auto& loop : loops_) loop->thread = std::thread([this, l = loop.get()] { run_loop(*l); });
  acceptor_ = std::thread([this] { accept_loop(); });
  watcher_ = std::thread([this] { watch_silence(); });
  host_.log(BALLAST_LOG_INFO, "cluster",
            "controller listening on " + options_.listen + " (" + std::to_string(nodes_.size()) +
                " node(s) known from " + options_.ingest_journal + ", " + std::to_string(loops) + " event loop(s))");
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
  for (auto& loop : loops_) loop->wake();
  for (auto& loop : loops_)
    if (loop->thread.joinable()) loop->thread.join();
  if (watcher_.joinable()) watcher_.join();
  if (commits_) commits_->stop();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
  // Sockets accepted and not yet taken by a loop.
  for (auto& loop : loops_)
    for (auto& in : loop->incoming) ::close(in.fd);
  loops_.clear();
  ingest_.flush(options_.durable);
  ingest_.close();
}

// Accept and hand each socket to a loop, in turn; above max_connections open
// refuse it at once.
void Controller::accept_loop() {
  size_t next = 0;
  int64_t last_full_log = 0;
  uint64_t full_refused = 0;
  while (!quit_.load()) {
    pollfd p[2] = {{listen_fd_, POLLIN, 0}, {stop_pipe_[0], POLLIN, 0}};
    if (poll(p, 2, 1000) <= 0) continue;
    if (p[1].revents) break;
    sockaddr_storage peer{};
    socklen_t len = sizeof peer;
    int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE) {
        host_.log(BALLAST_LOG_WARN, "cluster", std::string("accept: ") + std::strerror(errno));
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      continue;
    }
    char host[NI_MAXHOST] = "?", serv[NI_MAXSERV] = "?";
    getnameinfo(reinterpret_cast<sockaddr*>(&peer), len, host, sizeof host, serv, sizeof serv,
                NI_NUMERICHOST | NI_NUMERICSERV);
    const std::string address = std::string(host) + ":" + serv;
    if (open_.load() >= options_.max_connections) {
      ::close(fd);
      refused_.fetch_add(1);
      ++full_refused;
      if (now_ms() - last_full_log >= 1000) {
        host_.log(BALLAST_LOG_WARN, "cluster",
                  "refused connection from " + address + ": " + std::to_string(options_.max_connections) +
                      " connections open, the bound (" + std::to_string(full_refused) + " refused so)");
        last_full_log = now_ms();
      }
      continue;
    }
    open_.fetch_add(1);
    const uint64_t id = connections_.fetch_add(1) + 1;
    Loop& loop = *loops_[next++ % loops_.size()];
    {
      std::lock_guard lock(loop.mutex);
      loop.incoming.push_back({id, fd, address});
    }
    loop.wake();
  }
}

void Controller::run_loop(Loop& loop) {
  std::vector<epoll_event> events(512);
  std::vector<Conn*> ready, batched;
  while (!quit_.load()) {
    int n = epoll_wait(loop.epoll_fd, events.data(), static_cast<int>(events.size()), loop.again.empty() ? kTickMs : 0);
    if (n < 0 && errno != EINTR) {
      host_.log(BALLAST_LOG_ERROR, "cluster", std::string("epoll_wait: ") + std::strerror(errno));
      break;
    }
    const auto pass_start = std::chrono::steady_clock::now();
    ++loop.pass;
    ready.swap(loop.again);
    loop.again.clear();
    batched.clear();
    bool woken = false;
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u64 == 0) {
        woken = true;
        continue;
      }
      auto it = loop.conns.find(events[i].data.u64);
      if (it != loop.conns.end()) ready.push_back(it->second.get());
    }
    if (woken) take_incoming(loop, &ready);
    for (Conn* c : ready) step(loop, *c, &batched);
    const size_t applied = apply_pass(loop, batched);
    if (now_ms() - loop.last_tick >= kTickMs) tick(loop);
    flush(loop);
    finish_closing(loop);
    if (applied > 0 && applied < kCoalesceBelow)
      std::this_thread::sleep_until(pass_start + (options_.durable ? kCoalesceDurable : kCoalesce));
  }
  for (auto& [id, c] : loop.conns)
    if (!c->closing) {
      c->closing = true;
      loop.closing.push_back(c.get());
    }
  finish_closing(loop);
}

// New sockets from the acceptor, and the pokes of other threads.
void Controller::take_incoming(Loop& loop, std::vector<Conn*>* ready) {
  uint64_t v;
  ssize_t got = read(loop.wake_fd, &v, sizeof v);
  (void)got;
  std::vector<Loop::Incoming> incoming;
  std::vector<uint64_t> pokes;
  {
    std::lock_guard lock(loop.mutex);
    incoming.swap(loop.incoming);
    pokes.swap(loop.pokes);
  }
  for (auto& in : incoming) {
    auto c = std::make_unique<Conn>();
    c->id = in.id;
    c->link = Link::accept(*tls_, in.fd, in.address);
    c->deadline_ms = now_ms() + options_.handshake_timeout_ms;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = c->id;
    if (epoll_ctl(loop.epoll_fd, EPOLL_CTL_ADD, in.fd, &ev) != 0) {
      host_.log(BALLAST_LOG_WARN, "cluster",
                "connection from " + in.address + " dropped: epoll: " + std::strerror(errno));
      open_.fetch_sub(1);
      continue;
    }
    ready->push_back(c.get());
    loop.conns.emplace(c->id, std::move(c));
  }
  for (uint64_t id : pokes) {
    auto it = loop.conns.find(id);
    if (it != loop.conns.end()) poked(loop, *it->second);
  }
}

// A connection the socket (or the last pass) says is ready: its handshake, or
// what it has to read.
void Controller::step(Loop& loop, Conn& c, std::vector<Conn*>* batched) {
  if (c.closing || c.pass == loop.pass) return;
  c.pass = loop.pass;
  std::string error;
  if (c.state == Conn::State::tls) {
    int r = c.link->handshake_step(&error);
    if (r < 0) {
      refused_.fetch_add(1);
      host_.log(BALLAST_LOG_WARN, "cluster", "refused connection from " + c.link->peer_address() + ": " + error);
      close(loop, c);
      return;
    }
    if (r == 0) {
      if (c.link->wants_write() != c.watching_out) loop.watch(c, c.link->wants_write());
      return;
    }
    c.state = Conn::State::hello;
    c.deadline_ms = now_ms() + options_.handshake_timeout_ms;
  }
  // A batch not applied yet (its node busy on another loop) holds frames in
  // the link's buffer: nothing is read until it is.
  if (!c.batch.items.empty()) {
    batched->push_back(&c);
    return;
  }
  bool more = false;
  bool ok = c.link->receive(
      kReadPerPass, [&](const Message& m) { return on_message(loop, c, m, &error); }, &more, &error);
  if (!c.batch.items.empty()) batched->push_back(&c);
  if (more) loop.again.push_back(&c);
  if (c.link->wants_write()) send(loop, c, std::nullopt);
  if (ok || c.closing) return;
  if (c.state == Conn::State::hello) return refuse(loop, c, error.empty() ? "no hello" : error);
  host_.log(BALLAST_LOG_WARN, "cluster", "node " + c.node + ": link lost: " + error);
  close(loop, c);
}

bool Controller::on_message(Loop& loop, Conn& c, const Message& m, std::string* error) {
  if (c.state == Conn::State::hello) return on_hello(loop, c, m, error);
  c.last_rx = now_ms();
  switch (m.type) {
    case MsgType::event: {
      if (m.number <= c.pending) {
        duplicates_.fetch_add(1, std::memory_order_relaxed);
        return true;
      }
      if (m.number != c.pending + 1) {
        gaps_.fetch_add(1);
        host_.log(BALLAST_LOG_WARN, "cluster",
                  "node " + c.node + ": sequence " + std::to_string(m.number) + " follows " +
                      std::to_string(c.pending) + " (the agent lost its spool?)");
      }
      Item item{m.number, true, {}, m.body, m.body_size, 0};
      std::string why;
      if (decode_frame_into(m.body, m.body_size, &c.batch.memory, &item.event, &item.decoded_size, &why) !=
          BALLAST_OK) {
        bad_frames_.fetch_add(1);
        item.good = false;
        host_.log(BALLAST_LOG_WARN, "cluster",
                  "node " + c.node + " sequence " + std::to_string(m.number) + ": bad frame skipped: " + why);
      }
      c.batch.items.push_back(std::move(item));
      c.pending = m.number;
      return true;
    }
    case MsgType::heartbeat:
      if (m.body_size == sizeof(uint64_t)) {
        uint64_t o;
        std::memcpy(&o, m.body, sizeof o);
        std::lock_guard lock(mutex_);
        if (o > c.ns->overflow) {
          host_.log(BALLAST_LOG_WARN, "cluster",
                    "node " + c.node + " lost " + std::to_string(o) + " event(s) to a full spool");
          nlohmann::json j = {{"node", c.node}, {"overflow", o}};
          host_.publish_json("node.spool_overflow", j.dump(), "cluster");
        }
        c.ns->overflow = o;
      }
      return true;
    case MsgType::action_ack: {
      std::vector<uint64_t> done;
      {
        std::lock_guard lock(mutex_);
        auto& q = c.ns->actions;
        while (!q.empty() && q.front().first <= m.number) {
          done.push_back(q.front().first);
          q.pop_front();
        }
      }
      // The records go in the next group commit: this loop does not wait for etcd.
      if (commits_) commits_->forget(done);
      return true;
    }
    default:
      *error = "unexpected message type " + std::to_string(static_cast<int>(m.type));
      return false;
  }
}

// The first message must be HELLO naming the node of the certificate; then
// this connection speaks for the node, and an older one is dropped.
bool Controller::on_hello(Loop& loop, Conn& c, const Message& m, std::string* error) {
  if (m.type != MsgType::hello) {
    *error = "first message is not hello";
    return false;
  }
  auto j = nlohmann::json::parse(m.body, m.body + m.body_size, nullptr, false);
  if (!j.is_object() || !j.contains("node") || !j["node"].is_string()) {
    *error = "hello without a node name";
    return false;
  }
  const std::string node = j["node"].get<std::string>();
  uint64_t overflow = 0;
  if (j.contains("overflow") && j["overflow"].is_number_unsigned()) overflow = j["overflow"].get<uint64_t>();
  if (node != c.link->peer_name()) {
    refuse(loop, c, "node '" + node + "' does not match its certificate's name '" + c.link->peer_name() + "'");
    return false;
  }
  if (leadership_ && !leadership_->is_leader()) {
    refuse(loop, c, "this controller is not the leader");
    return false;
  }
  if (leadership_) take_over();
  uint64_t applied = 0;
  int64_t silent_for_ms = -1;  // the node was node.silent this long, or -1
  {
    std::lock_guard lock(mutex_);
    NodeState& n = nodes_[node];
    if (n.conn != 0) n.loop->poke(n.conn);
    n.loop = &loop;
    n.conn = c.id;
    c.ns = &n;
    c.node = node;
    applied = n.applied;
    if (n.silent) silent_for_ms = now_ms() - n.last_heard_ms;
    n.last_heard_ms = now_ms();
    n.silent = false;
    n.overflow = overflow;
  }
  c.state = Conn::State::serving;
  c.applied = c.pending = applied;
  c.last_rx = c.last_hb = now_ms();
  send(loop, c, MsgType::welcome, applied);
  send(loop, c, MsgType::heartbeat, static_cast<uint64_t>(c.last_hb));
  {
    // The unacknowledged actions, after the welcome (an agent reads nothing else before it).
    std::lock_guard lock(mutex_);
    for (auto& [id, frame] : c.ns->actions) {
      send(loop, c, MsgType::action, id, frame.data(), frame.size());
      c.ns->next_action = id;
      actions_sent_.fetch_add(1);
    }
  }
  if (silent_for_ms >= 0) publish_back(node, silent_for_ms);
  host_.log(BALLAST_LOG_INFO, "cluster",
            "node " + node + " connected from " + c.link->peer_address() + " (applied up to " +
                std::to_string(applied) + ")");
  publish_node("node.connected", node, {{"node", node}, {"term", leadership_ ? leadership_->epoch() : uint64_t(0)}});
  return true;
}

void Controller::refuse(Loop& loop, Conn& c, const std::string& why) {
  refused_.fetch_add(1);
  host_.log(BALLAST_LOG_WARN, "cluster", "refused connection from " + c.link->peer_address() + ": " + why);
  send(loop, c, MsgType::refuse, 0, why.data(), why.size());
  close(loop, c);
}

// Another thread's word: new actions for the node, or this connection no
// longer speaks for it (a newer one, a new term).
void Controller::poked(Loop& loop, Conn& c) {
  if (c.closing || c.state != Conn::State::serving) return;
  std::lock_guard lock(mutex_);
  if (c.ns->conn != c.id) {
    close(loop, c);
    return;
  }
  for (auto& [id, frame] : c.ns->actions)
    if (id > c.ns->next_action) {
      send(loop, c, MsgType::action, id, frame.data(), frame.size());
      c.ns->next_action = id;
      actions_sent_.fetch_add(1);
    }
}

// Deadlines, heartbeats, silence and leadership, every kTickMs.
void Controller::tick(Loop& loop) {
  const int64_t now = now_ms();
  loop.last_tick = now;
  const bool leads = !leadership_ || leadership_->is_leader();
  std::lock_guard lock(mutex_);
  for (auto& [id, cp] : loop.conns) {
    Conn& c = *cp;
    if (c.closing) continue;
    if (c.state == Conn::State::tls) {
      if (now > c.deadline_ms) {
        refused_.fetch_add(1);
        host_.log(BALLAST_LOG_WARN, "cluster",
                  "refused connection from " + c.link->peer_address() + ": TLS handshake timed out after " +
                      std::to_string(options_.handshake_timeout_ms) + " ms");
        close(loop, c);
      }
    } else if (c.state == Conn::State::hello) {
      if (now > c.deadline_ms) refuse(loop, c, "no hello");
    } else if (!leads) {
      host_.log(BALLAST_LOG_WARN, "cluster", "node " + c.node + ": closing, this controller no longer leads");
      close(loop, c);
    } else if (now - c.last_rx > options_.silent_after_ms) {
      host_.log(BALLAST_LOG_WARN, "cluster", "node " + c.node + ": silent, closing its connection");
      close(loop, c);
    } else {
      if (c.ns->conn == c.id) c.ns->last_heard_ms = std::max(c.ns->last_heard_ms, c.last_rx);
      if (now - c.last_hb >= options_.heartbeat_ms) {
        send(loop, c, MsgType::heartbeat, static_cast<uint64_t>(now));
        c.last_hb = now;
      }
    }
  }
}

// Queue a message (none: only mark the connection for the flush).
void Controller::send(Loop& loop, Conn& c, std::optional<MsgType> type, uint64_t number, const void* body,
                      size_t body_size) {
  if (type) c.link->send(*type, number, body, body_size);
  if (!c.dirty) {
    c.dirty = true;
    loop.dirty.push_back(&c);
  }
}

// Write what each connection queued this pass; watch for writability where
// the socket took less.
void Controller::flush(Loop& loop) {
  for (Conn* c : loop.dirty) {
    c->dirty = false;
    if (c->closing) continue;
    std::string error;
    if (!c->link->flush(&error)) {
      host_.log(
          BALLAST_LOG_WARN, "cluster",
          (c->state == Conn::State::serving ? "node " + c->node : c->link->peer_address()) + ": link lost: " + error);
      close(loop, *c);
      continue;
    }
    if (c->link->queued_bytes() > kMaxQueuedOut) {
      host_.log(BALLAST_LOG_WARN, "cluster",
                "node " + c->node + ": " + std::to_string(c->link->queued_bytes()) +
                    " bytes queued for a peer that does not read: closing its connection");
      close(loop, *c);
      continue;
    }
    if (c->link->wants_write() != c->watching_out) loop.watch(*c, c->link->wants_write());
  }
  loop.dirty.clear();
}

// Mark for closing at the end of the pass (its batch, if any, still applied).
void Controller::close(Loop& loop, Conn& c) {
  if (c.closing) return;
  c.closing = true;
  loop.closing.push_back(&c);
}

void Controller::finish_closing(Loop& loop) {
  if (loop.closing.empty()) return;
  std::erase_if(loop.again, [](Conn* c) { return c->closing; });
  for (Conn* c : loop.closing) {
    if (c->state == Conn::State::serving) {
      std::lock_guard lock(mutex_);
      if (c->ns->conn == c->id) {
        c->ns->conn = 0;
        c->ns->loop = nullptr;
        c->ns->next_action = 0;  // resent on the next connection
      }
    }
    std::string ignored;
    c->link->flush(&ignored);  // a refusal's reason, the last acknowledgement
    epoll_ctl(loop.epoll_fd, EPOLL_CTL_DEL, c->link->fd(), nullptr);
    loop.conns.erase(c->id);
    open_.fetch_sub(1);
  }
  loop.closing.clear();
}

// Apply the batches of a pass (each of their sequences above its node's
// applied cursor once the duplicates are dropped): the node's apply_mutex
// held for each (a node busy on another loop waits for the next pass).
//
// Without HA the ingest journal is the record of what is applied: publish,
// then journal and flush, once for the whole pass. What is not published (the
// bus stopping) is neither journaled nor acknowledged; a controller killed
// between the publish and the journal's write publishes that batch again when
// restarted (its bus that saw it first died with it).
//
// With HA, what is applied is what etcd says: the cursors each term commits,
// in transactions fenced on its leadership. A leader journals the pass's
// batches, then publishes them, then commits their cursors (in one group
// commit, with other loops' and actions'), then acknowledges. Its bus is in
// memory: what a leader killed before its commit published died with its bus
// and the successor applies it. What could outlive the bus is an action, and
// an action is recorded only after the cursors of everything published before
// it are committed (on_action). So the record (cursors + actions) always
// reflects each event exactly once: a term applies the sequences between the
// cursor it read when it began and the last cursor it committed. An uncertain
// commit (etcd applied it, the leader died before hearing so) covers only
// published events: nothing lost. The ingest journal holds what was prepared;
// its entries above the next term's starting cursor were never applied.
size_t Controller::apply_pass(Loop& loop, std::vector<Conn*>& batched) {
  if (batched.empty()) return 0;
  auto& held = loop.held;
  held.clear();
  loop.holding.clear();
  for (Conn* c : batched) {
    if (loop.holding.count(c->ns) != 0 || !c->ns->apply_mutex.try_lock()) {
      loop.again.push_back(c);
      continue;
    }
    loop.holding.insert(c->ns);
    held.push_back(c);
  }
  if (held.empty()) return 0;
  passes_.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard lock(mutex_);
    for (Conn* c : held) c->applied = std::max(c->applied, c->ns->applied);  // another connection may have gone on
  }
  for (Conn* c : held) {
    std::erase_if(c->batch.items, [&](const Item& item) {
      if (item.seq > c->applied) return false;
      duplicates_.fetch_add(1, std::memory_order_relaxed);
      return true;
    });
    c->published = 0;
    c->done = c->applied;
  }
  // Not acknowledged: the agent resends what this bus has not seen.
  auto give_up = [&] {
    std::lock_guard lock(mutex_);
    for (Conn* c : held) {
      if (leadership_) c->ns->applied = std::max(c->ns->applied, c->ns->published);
      close(loop, *c);
    }
  };
  bool ok = !leadership_ || journal(loop, held, true) == BALLAST_OK;
  if (ok) {
    for (Conn* c : held) {
      for (auto& item : c->batch.items) {
        if (item.good) {
          const ballast_event& ev = item.event;
          if (host_.publish_decoded(ev, ev.source.plugin ? ev.source.plugin : "cluster", item.frame,
                                    item.decoded_size) != BALLAST_OK) {
            host_.log(BALLAST_LOG_WARN, "cluster",
                      "node " + c->node + ": sequence " + std::to_string(item.seq) + " and later not applied (" +
                          last_error() + "); the agent resends them");
            c->stopped = true;
            break;
          }
        }
        ++c->published;
      }
      if (c->published > 0) c->done = c->batch.items[c->published - 1].seq;
    }
    if (!leadership_) {
      ok = journal(loop, held, false) == BALLAST_OK;
    } else {
      std::map<std::string, uint64_t> cursors;
      {
        std::lock_guard lock(mutex_);
        for (Conn* c : held) {
          c->ns->published = std::max(c->ns->published, c->done);  // this bus saw them, committed or not
          if (c->done > c->applied) cursors[c->node] = c->done;
        }
      }
      if (!cursors.empty() && commits_->commit(cursors) != BALLAST_OK) {
        host_.log(BALLAST_LOG_WARN, "cluster",
                  std::to_string(cursors.size()) + " node(s)' cursors not committed (" + last_error() +
                      "); not acknowledged");
        ok = false;
      }
    }
  }
  size_t applied = 0;
  if (!ok) {
    give_up();
  } else {
    std::lock_guard lock(mutex_);
    for (Conn* c : held) {
      applied += c->done - c->applied;
      applied_events_.fetch_add(c->done - c->applied, std::memory_order_relaxed);
      c->ns->applied = c->done;
      c->applied = c->done;
    }
  }
  for (Conn* c : held) {
    c->ns->apply_mutex.unlock();
    c->batch.items.clear();
    c->batch.memory.release();
    if (!ok) continue;
    send(loop, *c, MsgType::ack, c->applied);
    if (c->stopped) close(loop, *c);
  }
  return applied;
}

// The pass's events (all of each batch, or what was published) into the
// ingest journal in one write, flushed (fdatasync when durable).
int Controller::journal(Loop& loop, const std::vector<Conn*>& conns, bool all_items) {
  size_t count = 0;
  for (Conn* c : conns) count += all_items ? c->batch.items.size() : c->published;
  if (count == 0) return BALLAST_OK;
  if (loop.wrapped.size() < count) loop.wrapped.resize(count);
  loop.events.clear();
  for (Conn* c : conns) {
    const size_t n = all_items ? c->batch.items.size() : c->published;
    for (size_t i = 0; i < n; ++i) {
      const Item& item = c->batch.items[i];
      loop.events.push_back(
          wrap_spooled(c->node.c_str(), item.seq, item.frame, item.frame_size, &loop.wrapped[loop.events.size()]));
    }
  }
  if (ingest_.append_batch(loop.events.data(), loop.events.size()) != BALLAST_OK) {
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
    if (n.conn != 0) {
      n.loop->poke(n.conn);
      n.conn = 0;
      n.loop = nullptr;
      n.next_action = 0;
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
  if (m.conn != 0) m.loop->poke(m.conn);
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
  // Worded by the cause: not leading (or the term lost), a record a successor
  // could not read back (its size and bound in why), or what failed.
  auto refused = [&](int rc, bool record) {
    const std::string why = last_error();
    if (rc == BALLAST_ESTATE || rc == BALLAST_EFENCED) return fail(BALLAST_EFENCED, what + " fenced off: " + why);
    if (rc == BALLAST_EINVAL && record) return fail(rc, what + " refused, too large for the action log: " + why);
    return fail(rc, what + " not recorded: " + why);
  };
  // The plugin's name is a part of the log's keys (records/<plugin>/<id>).
  if (plugin.empty() || plugin.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") !=
                            std::string::npos)
    return fail(BALLAST_EINVAL, what + ": the plugin's name is not [A-Za-z0-9_.-]+, not a key of the action log");
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
    if (int rc = commits_->commit(published); rc != BALLAST_OK) return refused(rc, false);
  const nlohmann::json j = {
      {"node", host_.node()}, {"plugin", plugin}, {"kind", kind}, {"record", record}, {"term", leadership_->epoch()}};
  const bool snapshot = Host::snapshot_kind(kind);
  // One record at a time: ids then grow in the order etcd commits them, so
  // that a snapshot deletes only what came before it.
  std::lock_guard order(records_mutex_);
  if (int rc = leadership_->record_own_action(plugin, next_action_id(), j.dump(), snapshot); rc != BALLAST_OK)
    return refused(rc, true);
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
    for (auto& [k, n] : nodes_) connected += n.conn != 0;
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
                      {"cluster.ingest_passes", passes_.load()},
                      {"cluster.connected", connected}};
  if (commits_) {
    j["cluster.cursor_commits"] = commits_->transactions();
    j["cluster.acks_committed"] = commits_->forgotten();
  }
  return j;
}

}  // namespace ballast::cluster
