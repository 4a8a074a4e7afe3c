#include "relay.hpp"

#include "channel.hpp"

#include <ballast/events.h>

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <stdexcept>

namespace ballast::runner {

namespace {

constexpr size_t kMaxDatagram = 64 * 1024;
// The agent does not know the job's size: ranks are checked against it by
// the executor, which also checks that the rank runs on this node.
constexpr int kAnyRank = 1 << 24;

int64_t wall_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

}  // namespace

RelayConfig parse_relay_config(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw std::runtime_error("relay: want a table { socket = \"/run/ballast/job.sock\", mode = \"0660\" }");
  RelayConfig c;
  for (const auto& [k, v] : j.items()) {
    if (k == "socket") {
      if (!v.is_string() || v.get<std::string>().empty() || v.get<std::string>()[0] != '/')
        throw std::runtime_error("relay.socket: want an absolute path, got " + v.dump());
      c.socket = v.get<std::string>();
    } else if (k == "mode") {
      const std::string m = v.is_string() ? v.get<std::string>() : "";
      char* end = nullptr;
      const unsigned long mode = std::strtoul(m.c_str(), &end, 8);
      if (m.empty() || *end != '\0' || (mode & ~0777ul) != 0 || (mode & 0600) != 0600)
        throw std::runtime_error(
            "relay.mode: want an octal string such as \"0660\" that lets the agent's user "
            "read and write, got " +
            v.dump());
      c.mode = unsigned(mode);
    } else if (k == "uids") {
      if (!v.is_array()) throw std::runtime_error("relay.uids: want a list of user ids");
      for (const auto& u : v) {
        if (!u.is_number_unsigned()) throw std::runtime_error("relay.uids: " + u.dump() + " is not a user id");
        c.uids.insert(uid_t(u.get<uint64_t>()));
      }
    } else {
      throw std::runtime_error("relay." + k + ": unknown field");
    }
  }
  if (c.socket.empty()) throw std::runtime_error("relay.socket: missing (the path ranks send their reports to)");
  return c;
}

Relay::Relay(const ballast_host_api* host, RelayConfig cfg) : host_(host), cfg_(std::move(cfg)) {
  const char* name =
      BALLAST_COVERS(host->size, ballast_host_api, node_name) && host->node_name ? host->node_name(host) : nullptr;
  char buf[256] = "";
  if (!name && gethostname(buf, sizeof buf - 1) == 0) name = buf;
  node_ = name ? name : "";
  path_ = relay_socket_of(cfg_.socket, node_);
}

std::string relay_socket_of(std::string path, const std::string& node) {
  for (size_t at; (at = path.find("{node}")) != std::string::npos;) path.replace(at, 6, node);
  return path;
}

Relay::~Relay() { stop(); }

bool Relay::start(std::string* error) {
  sockaddr_un sa{};
  if (path_.size() >= sizeof sa.sun_path) {
    *error = "relay.socket: path too long (" + std::to_string(path_.size()) + " bytes): " + path_;
    return false;
  }
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path_).parent_path(), ec);
  if (ReportSocket::answers(path_)) {
    *error = "relay.socket: another process answers at " + path_;
    return false;
  }
  struct stat st {};
  if (lstat(path_.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      *error = "relay.socket: " + path_ + " exists and is not a socket";
      return false;
    }
    unlink(path_.c_str());  // left by an agent that is gone
  }
  fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  const int on = 1, buf = 4 << 20;
  if (fd_ < 0 || pipe2(wake_, O_NONBLOCK | O_CLOEXEC) != 0) {
    *error = std::string("relay: socket: ") + std::strerror(errno);
    stop();
    return false;
  }
  setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
  setsockopt(fd_, SOL_SOCKET, SO_PASSCRED, &on, sizeof on);  // each datagram's sender, for the uid check
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path, path_.c_str(), path_.size() + 1);
  // Bound under a umask that leaves nobody else a window to send before the chmod.
  const mode_t old = umask(0177);
  const bool bound = bind(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
  umask(old);
  if (!bound || chmod(path_.c_str(), cfg_.mode) != 0) {
    *error = "relay: bind " + path_ + ": " + std::strerror(errno);
    stop();
    return false;
  }
  if (lstat(path_.c_str(), &st) == 0) inode_ = st.st_ino;
  quit_ = false;
  thread_ = std::thread([this] { run(); });
  log(BALLAST_LOG_INFO, "relaying the job channel of node " + node_ + " from " + path_);
  return true;
}

void Relay::stop() {
  quit_ = true;
  if (wake_[1] >= 0) (void)!write(wake_[1], "x", 1);
  if (thread_.joinable()) thread_.join();
  struct stat st {};
  if (inode_ != 0 && lstat(path_.c_str(), &st) == 0 && st.st_ino == inode_) unlink(path_.c_str());
  inode_ = 0;
  for (int* fd : {&fd_, &wake_[0], &wake_[1]})
    if (*fd >= 0) {
      close(*fd);
      *fd = -1;
    }
}

void Relay::run() {
  while (!quit_) {
    pollfd fds[2] = {{fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0 && errno != EINTR) break;
    if (quit_) break;
    receive();
  }
}

// Every datagram waiting now: checked, then published or refused.
void Relay::receive() {
  std::string buf(kMaxDatagram + 1, '\0');
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(ucred))];
  for (int i = 0; i < 10000; ++i) {
    iovec iov{buf.data(), buf.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t n = recvmsg(fd_, &msg, MSG_TRUNC);
    if (n < 0) return;
    const int64_t received = wall_ns();
    const ucred* cred = nullptr;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS)
        cred = reinterpret_cast<const ucred*>(CMSG_DATA(c));
    if (!cred) {
      refuse("a datagram without its sender's credentials");
      continue;
    }
    if (cred->uid != 0 && cred->uid != getuid() && cfg_.uids.count(cred->uid) == 0) {
      refuse("sender uid " + std::to_string(cred->uid) + " (pid " + std::to_string(cred->pid) +
             ") is not allowed (relay.uids)");
      continue;
    }
    if (size_t(n) > kMaxDatagram) {
      refuse("report of " + std::to_string(n) + " bytes, larger than 64 KiB (pid " + std::to_string(cred->pid) + ")");
      continue;
    }
    const std::string datagram(buf.data(), size_t(n));
    std::string why;
    const auto report = parse_report(datagram, kAnyRank, &why);
    if (!report) {
      refuse(why + " (pid " + std::to_string(cred->pid) + ")");
      continue;
    }
    const std::string body =
        nlohmann::json{{"node", node_}, {"received_ns", received}, {"pid", cred->pid}, {"datagram", datagram}}.dump(
            -1, ' ', false, nlohmann::json::error_handler_t::replace);
    ballast_event e{};
    e.size = sizeof e;
    e.schema = BALLAST_SCHEMA_JSON;
    e.topic = "job.rank_report";
    e.source.rank = report->rank;
    e.payload = body.data();
    e.payload_size = body.size();
    if (host_->publish(host_, &e) == BALLAST_OK) {
      host_->counter_add(host_, "relay.forwarded", 1);
    } else {
      host_->counter_add(host_, "relay.publish_failed", 1);
      log(BALLAST_LOG_ERROR, std::string("relay: publish failed: ") + host_->last_error(host_));
    }
  }
}

void Relay::refuse(const std::string& why) {
  host_->counter_add(host_, "relay.refused", 1);
  if (log_refusal(++refused_))
    log(BALLAST_LOG_WARN,
        "relay " + path_ + ": a report was refused: " + why + " (" + std::to_string(refused_) + " refused so far)");
}

void Relay::log(int level, const std::string& msg) { host_->log(host_, level, msg.c_str()); }

}  // namespace ballast::runner
