#include "agent.hpp"

#include "error.hpp"
#include "host.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;

namespace ballast::cluster {

namespace {

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t wall_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

int Agent::create(Host& host, AgentOptions options, std::unique_ptr<Agent>* out) {
  if (options.controllers.empty()) return fail(BALLAST_EINVAL, "cluster.controller: at least one host:port is needed");
  for (const auto& c : options.controllers) {
    std::string h, err;
    uint16_t p;
    if (!split_host_port(c, &h, &p, &err)) return fail(BALLAST_EINVAL, "cluster.controller " + err);
  }
  auto a = std::unique_ptr<Agent>(new Agent(host));
  if (int rc = TlsConfig::load(options.tls, false, &a->tls_); rc != BALLAST_OK) return rc;
  if (int rc = Spool::open(options.spool, options.node, &a->spool_); rc != BALLAST_OK) return rc;
  std::ifstream actions(fs::path(options.spool.dir) / "actions");
  actions >> a->applied_action_;
  a->options_ = std::move(options);
  a->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  // Subscribed before the host starts its plugins, so that their first
  // events are spooled too; the link starts with start().
  ballast_subscribe_options opts{sizeof opts, BALLAST_DELIVER_QUEUED, 0, 0};
  for (const auto& pattern : a->options_.forward) {
    uint64_t id = 0;
    if (int rc = host.subscribe(pattern.c_str(), &opts, on_event, a.get(), "cluster", &id); rc != BALLAST_OK) return rc;
    a->subscriptions_.push_back(id);
  }
  *out = std::move(a);
  return BALLAST_OK;
}

Agent::~Agent() {
  stop();
  if (wake_fd_ >= 0) close(wake_fd_);
}

int Agent::start() {
  thread_ = std::thread([this] { run(); });
  host_.log(BALLAST_LOG_INFO, "cluster",
            "agent " + options_.node + ": spool " + options_.spool.dir + " at sequence " +
                std::to_string(spool_->last_seq()) + ", acknowledged " + std::to_string(spool_->acked()));
  return BALLAST_OK;
}

void Agent::stop() {
  for (uint64_t id : subscriptions_) host_.unsubscribe(id);
  subscriptions_.clear();
  quit_.store(true);
  wake();
  if (thread_.joinable()) thread_.join();
}

void Agent::wake() {
  uint64_t one = 1;
  ssize_t n = write(wake_fd_, &one, sizeof one);
  (void)n;
}

int Agent::on_event(void* user, const ballast_event* event) {
  auto* self = static_cast<Agent*>(user);
  // What the controller sent is not sent back.
  if (event->source.plugin != nullptr && std::string_view(event->source.plugin) == "cluster") return 0;
  thread_local std::vector<unsigned char> frame;
  frame.clear();
  encode_frame(*event, &frame);
  uint64_t seq = 0;
  int rc = self->spool_->append(frame.data(), frame.size(), &seq);
  if (rc == BALLAST_EFULL) return 0;  // counted by the spool, reported by run()
  if (rc != BALLAST_OK) {
    self->spool_errors_.fetch_add(1);
    self->host_.log(BALLAST_LOG_ERROR, "cluster", std::string("spool: ") + last_error());
    return rc;
  }
  self->forwarded_.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard lock(self->queue_mutex_);
    bool contiguous = self->queue_.empty() || self->queue_.back().first + 1 == seq;
    if (contiguous && self->queue_bytes_ + frame.size() <= self->options_.memory_queue_bytes) {
      self->queue_bytes_ += frame.size();
      self->queue_.emplace_back(seq, frame);
    }
  }
  self->wake();
  return 0;
}

// Sleep up to ms; false when asked to quit.
bool Agent::wait(int ms) {
  pollfd p{wake_fd_, POLLIN, 0};
  int64_t until = now_ms() + ms;
  while (!quit_.load()) {
    int64_t left = until - now_ms();
    if (left <= 0) return true;
    poll(&p, 1, static_cast<int>(left));
    uint64_t v;
    ssize_t n = read(wake_fd_, &v, sizeof v);
    (void)n;
  }
  return false;
}

void Agent::run() {
  size_t next = 0;
  int failures = 0;
  while (!quit_.load()) {
    const std::string& address = options_.controllers[next++ % options_.controllers.size()];
    std::unique_ptr<Link> link;
    std::string error;
    if (Link::connect(*tls_, address, options_.connect_timeout_ms, &link, &error) != BALLAST_OK) {
      if (failures++ % 10 == 0) host_.log(BALLAST_LOG_WARN, "cluster", "cannot reach controller " + error);
      if (!wait(std::min(2000, 100 * failures))) break;
      continue;
    }
    failures = 0;
    connects_.fetch_add(1);
    session(*link);
  }
}

bool Agent::fill(Link& link, uint64_t* sent) {
  const uint64_t last = spool_->last_seq();
  while (*sent < last && link.queued_bytes() < (1u << 20)) {
    uint64_t need = *sent + 1;
    uint64_t disk_until = last;
    {
      std::lock_guard lock(queue_mutex_);
      if (!queue_.empty() && queue_.front().first <= need && need <= queue_.back().first) {
        for (size_t i = need - queue_.front().first; i < queue_.size() && link.queued_bytes() < (1u << 20); ++i) {
          link.send(MsgType::event, queue_[i].first, queue_[i].second.data(), queue_[i].second.size());
          *sent = queue_[i].first;
        }
        continue;
      }
      if (!queue_.empty() && queue_.front().first > need) disk_until = queue_.front().first - 1;
    }
    // Not in memory: read it back from the spool.
    size_t bytes = 0;
    int rc = spool_->read(need, disk_until, [&](uint64_t seq, const std::vector<unsigned char>& frame) {
      if (seq != *sent + 1) return false;
      link.send(MsgType::event, seq, frame.data(), frame.size());
      *sent = seq;
      resent_from_disk_.fetch_add(1, std::memory_order_relaxed);
      bytes += frame.size();
      return bytes < (1u << 20);
    });
    if (rc != BALLAST_OK || *sent < need) {
      // A sequence the spool cannot give back (a damaged segment): say so once
      // and go on after it, so that the stream does not stall.
      host_.log(BALLAST_LOG_ERROR, "cluster",
                "spool lost sequence " + std::to_string(need) + ": " + (rc != BALLAST_OK ? last_error() : "not found"));
      spool_errors_.fetch_add(1);
      *sent = need;
    }
  }
  return true;
}

// An action from the controller: carried out once (its id above the last
// carried out, kept in the spool folder across restarts), acknowledged always.
bool Agent::on_action(Link& link, const Message& m, std::string* error) {
  if (m.number > applied_action_) {
    OwnedEvent ev;
    size_t used = 0;
    std::string why;
    if (decode_frame(m.body, m.body_size, &ev, &used, &why) != BALLAST_OK) {
      *error = "bad action frame: " + why;
      return false;
    }
    if (host_.publish(ev.view(), "cluster") != BALLAST_OK)
      host_.log(BALLAST_LOG_WARN, "cluster", std::string("could not publish an action: ") + last_error());
    applied_action_ = m.number;
    std::ofstream(fs::path(options_.spool.dir) / "actions") << applied_action_ << "\n";
    actions_.fetch_add(1);
  } else {
    action_repeats_.fetch_add(1);
  }
  link.send(MsgType::action_ack, m.number);
  return true;
}

void Agent::session(Link& link) {
  std::string error;
  nlohmann::json hello = {{"node", options_.node}, {"overflow", spool_->overflow()}};
  std::string body = hello.dump();
  link.send(MsgType::hello, 0, body.data(), body.size());
  // The controller answers welcome (its last applied sequence from us) or refuse.
  bool welcomed = false, refused = false;
  uint64_t applied = 0;
  int64_t deadline = now_ms() + options_.connect_timeout_ms;
  while (!welcomed && !refused && now_ms() < deadline && !quit_.load()) {
    if (!link.pump(
            100, -1,
            [&](const Message& m) {
              // What follows the welcome in the same read (the actions not
              // acknowledged yet) is this session's already.
              if (welcomed && m.type == MsgType::action) return on_action(link, m, &error);
              if (m.type == MsgType::welcome) welcomed = true, applied = m.number;
              if (m.type == MsgType::refuse) {
                refused = true;
                error = std::string(reinterpret_cast<const char*>(m.body), m.body_size);
              }
              return !refused;
            },
            &error))
      break;
  }
  if (!welcomed) {
    host_.log(BALLAST_LOG_WARN, "cluster",
              "controller " + link.peer_address() + " did not accept us: " + (error.empty() ? "no answer" : error));
    wait(500);
    return;
  }
  if (applied > spool_->last_seq()) {
    host_.log(BALLAST_LOG_WARN, "cluster",
              "controller has applied up to sequence " + std::to_string(applied) + ", beyond this spool's " +
                  std::to_string(spool_->last_seq()) + " (spool lost?): numbering continues after it");
    spool_->skip_to(applied);
  }
  spool_->acknowledge(applied);
  uint64_t sent = std::max(applied, spool_->acked());
  host_.log(BALLAST_LOG_INFO, "cluster",
            "connected to controller " + link.peer_address() + "; resending after sequence " + std::to_string(sent));
  int64_t last_rx = now_ms(), last_hb = 0;
  for (;;) {
    if (quit_.load()) return;
    fill(link, &sent);
    int64_t now = now_ms();
    if (now - last_hb >= options_.heartbeat_ms) {
      uint64_t overflow = spool_->overflow();
      link.send(MsgType::heartbeat, static_cast<uint64_t>(wall_ns()), &overflow, sizeof overflow);
      last_hb = now;
      if (overflow > overflow_logged_) {
        host_.log(BALLAST_LOG_WARN, "cluster",
                  "spool full (" + std::to_string(options_.spool.max_bytes >> 20) +
                      " MiB): " + std::to_string(overflow) + " event(s) not spooled and lost so far");
        overflow_logged_ = overflow;
      }
    }
    bool ok = link.pump(
        static_cast<int>(std::max<int64_t>(1, options_.heartbeat_ms - (now - last_hb))), wake_fd_,
        [&](const Message& m) {
          last_rx = now_ms();
          switch (m.type) {
            case MsgType::ack: {
              spool_->acknowledge(m.number);
              std::lock_guard lock(queue_mutex_);
              while (!queue_.empty() && queue_.front().first <= m.number) {
                queue_bytes_ -= queue_.front().second.size();
                queue_.pop_front();
              }
              return true;
            }
            case MsgType::action:
              return on_action(link, m, &error);
            case MsgType::heartbeat:
              return true;
            default:
              error = "unexpected message type " + std::to_string(static_cast<int>(m.type));
              return false;
          }
        },
        &error);
    uint64_t v;
    ssize_t n = read(wake_fd_, &v, sizeof v);
    (void)n;
    if (!ok) {
      host_.log(BALLAST_LOG_WARN, "cluster", "link to controller " + link.peer_address() + " lost: " + error);
      return;
    }
    if (now_ms() - last_rx > options_.silent_after_ms) {
      host_.log(BALLAST_LOG_WARN, "cluster",
                "controller " + link.peer_address() + " silent for " + std::to_string(options_.silent_after_ms) +
                    " ms: reconnecting");
      return;
    }
  }
}

nlohmann::json Agent::counters() const {
  return {{"cluster.forwarded", forwarded_.load()},
          {"cluster.last_seq", spool_->last_seq()},
          {"cluster.acked", spool_->acked()},
          {"cluster.resent_from_disk", resent_from_disk_.load()},
          {"cluster.spool_overflow", spool_->overflow()},
          {"cluster.spool_bytes", spool_->bytes()},
          {"cluster.spool_errors", spool_errors_.load()},
          {"cluster.connects", connects_.load()},
          {"cluster.actions", actions_.load()},
          {"cluster.action_repeats", action_repeats_.load()}};
}

}  // namespace ballast::cluster
