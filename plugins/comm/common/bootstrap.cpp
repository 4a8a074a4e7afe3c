#include "bootstrap.hpp"

#include <ballast/status.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <algorithm>
#include <random>

namespace ballast::comm {

int64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

namespace {

constexpr uint32_t kMagic = 0x53424c42;  // "BLBS"
constexpr uint32_t kVersion = 1;
constexpr uint32_t kHello = 1, kTable = 2, kError = 3;
constexpr uint32_t kMaxFrame = 64u << 20;

int remaining_ms(int64_t deadline) {
  const int64_t left = deadline - monotonic_ns();
  return left <= 0 ? 0 : int(left / 1000000 + 1);
}

// Full read/write with a deadline; false on EOF, error or timeout (errno says which).
bool io_all(int fd, void* buf, size_t len, bool writing, int64_t deadline) {
  char* p = static_cast<char*>(buf);
  while (len > 0) {
    pollfd pfd{fd, short(writing ? POLLOUT : POLLIN), 0};
    const int ms = remaining_ms(deadline);
    if (ms == 0) {
      errno = ETIMEDOUT;
      return false;
    }
    const int pr = poll(&pfd, 1, ms);
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) {
      if (pr == 0) errno = ETIMEDOUT;
      return false;
    }
    const ssize_t n = writing ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) {
      if (n == 0) errno = ECONNRESET;
      return false;
    }
    p += n;
    len -= size_t(n);
  }
  return true;
}

void put_u32(std::vector<uint8_t>& b, uint32_t v) { b.insert(b.end(), reinterpret_cast<uint8_t*>(&v), reinterpret_cast<uint8_t*>(&v) + 4); }
void put_bytes(std::vector<uint8_t>& b, const void* p, size_t n) {
  put_u32(b, uint32_t(n));
  b.insert(b.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
}

struct Reader {
  const std::vector<uint8_t>& b;
  size_t off = 0;
  bool ok = true;
  uint32_t u32() {
    uint32_t v = 0;
    if (off + 4 > b.size()) { ok = false; return 0; }
    std::memcpy(&v, b.data() + off, 4);
    off += 4;
    return v;
  }
  std::vector<uint8_t> bytes() {
    const uint32_t n = u32();
    if (!ok || off + n > b.size()) { ok = false; return {}; }
    std::vector<uint8_t> v(b.begin() + long(off), b.begin() + long(off + n));
    off += n;
    return v;
  }
};

bool send_frame(int fd, uint32_t type, const std::vector<uint8_t>& body, int64_t deadline) {
  uint32_t head[3] = {kMagic, type, uint32_t(body.size())};
  return io_all(fd, head, sizeof head, true, deadline) &&
         io_all(fd, const_cast<uint8_t*>(body.data()), body.size(), true, deadline);
}

// 0 ok, -1 io failure (errno), -2 malformed.
int recv_frame(int fd, uint32_t* type, std::vector<uint8_t>* body, int64_t deadline) {
  uint32_t head[3];
  if (!io_all(fd, head, sizeof head, false, deadline)) return -1;
  if (head[0] != kMagic || head[2] > kMaxFrame) return -2;
  *type = head[1];
  body->resize(head[2]);
  return io_all(fd, body->data(), body->size(), false, deadline) ? 0 : -1;
}

std::vector<uint8_t> encode_peer(const PeerInfo& p) {
  std::vector<uint8_t> b;
  put_u32(b, uint32_t(p.pid));
  put_bytes(b, p.host.data(), p.host.size());
  put_bytes(b, p.address.data(), p.address.size());
  return b;
}

PeerInfo decode_peer(Reader& r) {
  PeerInfo p;
  p.pid = int32_t(r.u32());
  const auto h = r.bytes();
  p.host.assign(h.begin(), h.end());
  p.address = r.bytes();
  return p;
}

bool resolve(const std::string& addr, int port, sockaddr_in* out, std::string* err) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(addr.c_str(), nullptr, &hints, &res);
  if (rc != 0 || !res) {
    *err = "cannot resolve MASTER_ADDR '" + addr + "': " + gai_strerror(rc);
    return false;
  }
  *out = *reinterpret_cast<sockaddr_in*>(res->ai_addr);
  out->sin_port = htons(uint16_t(port));
  freeaddrinfo(res);
  return true;
}

std::string where(const std::string& addr, int port) { return addr + ":" + std::to_string(port); }

struct Fd {
  int fd = -1;
  ~Fd() { if (fd >= 0) close(fd); }
};

int run_master(int nranks, const std::string& addr, int port, const PeerInfo& self, int64_t deadline,
               BootstrapResult* out, std::string* err) {
  sockaddr_in sa;
  if (!resolve(addr, port, &sa, err)) return BALLAST_EINVAL;
  Fd lis;
  lis.fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  setsockopt(lis.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(lis.fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    *err = "rank 0 cannot listen on MASTER_ADDR:MASTER_PORT " + where(addr, port) + ": " + std::strerror(errno) +
           (errno == EADDRINUSE ? " (the port is in use: pick another MASTER_PORT)" : "");
    return errno == EADDRINUSE ? BALLAST_EIO : BALLAST_EINVAL;
  }
  listen(lis.fd, 1024);
  out->peers.assign(size_t(nranks), PeerInfo{});
  out->peers[0] = self;
  std::vector<int> fds(size_t(nranks), -1);
  std::vector<int> extra;  // connections to answer with the error
  std::string failure;
  int joined = 1;
  const int64_t hello_deadline_cap = 2000000000;  // a client has 2 s to send its hello
  auto fail_with = [&](const std::string& msg) { if (failure.empty()) failure = msg; };
  // Once the world is complete, keep accepting for a short grace, so that a
  // second claimant of a rank started at the same time is caught.
  int64_t grace_end = 0;
  while (failure.empty()) {
    if (joined == nranks && grace_end == 0) grace_end = std::min(deadline, monotonic_ns() + 100000000);
    pollfd pfd{lis.fd, POLLIN, 0};
    const int ms = remaining_ms(grace_end ? grace_end : deadline);
    if (ms == 0) break;
    if (poll(&pfd, 1, ms) <= 0) continue;
    const int c = accept4(lis.fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) continue;
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    uint32_t type = 0;
    std::vector<uint8_t> body;
    const int64_t hd = std::min(deadline, monotonic_ns() + hello_deadline_cap);
    const int rr = recv_frame(c, &type, &body, hd);
    if (rr != 0 || type != kHello) {
      close(c);  // not one of ours (a port scanner, a stale client): ignore it
      continue;
    }
    Reader r{body};
    const uint32_t version = r.u32();
    const int32_t rank = int32_t(r.u32());
    const int32_t world = int32_t(r.u32());
    PeerInfo p = decode_peer(r);
    extra.push_back(c);
    if (!r.ok || version != kVersion) {
      fail_with("a rank sent a malformed hello or bootstrap version " + std::to_string(version) + " (expected " +
                std::to_string(kVersion) + ")");
    } else if (world != nranks) {
      fail_with("world size mismatch: rank " + std::to_string(rank) + " (pid " + std::to_string(p.pid) + " on " +
                p.host + ") has WORLD_SIZE=" + std::to_string(world) + ", rank 0 has " + std::to_string(nranks));
    } else if (rank <= 0 || rank >= nranks || fds[size_t(rank)] >= 0) {
      const PeerInfo& first = out->peers[size_t(rank >= 0 && rank < nranks ? rank : 0)];
      fail_with(rank >= 0 && rank < nranks
                    ? "rank " + std::to_string(rank) + " joined twice (pid " + std::to_string(first.pid) + " on " +
                          first.host + " and pid " + std::to_string(p.pid) + " on " + p.host + ")"
                    : "rank " + std::to_string(rank) + " is out of range for world size " + std::to_string(nranks));
    } else {
      extra.pop_back();
      fds[size_t(rank)] = c;
      out->peers[size_t(rank)] = std::move(p);
      ++joined;
    }
  }
  if (failure.empty() && joined < nranks) {
    std::string missing;
    for (int i = 1; i < nranks; ++i)
      if (fds[size_t(i)] < 0) missing += (missing.empty() ? "" : ",") + std::to_string(i);
    fail_with("bootstrap timed out at " + where(addr, port) + ": " + std::to_string(joined) + " of " +
              std::to_string(nranks) + " ranks joined; missing rank(s) " + missing);
  }
  int status = BALLAST_OK;
  if (failure.empty()) {
    std::random_device rd;
    out->job_id = (uint64_t(rd()) << 32) ^ rd() ^ uint64_t(monotonic_ns());
    std::vector<uint8_t> table;
    put_u32(table, uint32_t(out->job_id));
    put_u32(table, uint32_t(out->job_id >> 32));
    for (const auto& p : out->peers) {
      const auto e = encode_peer(p);
      table.insert(table.end(), e.begin(), e.end());
    }
    for (int i = 1; i < nranks; ++i) send_frame(fds[size_t(i)], kTable, table, deadline);
  } else {
    // Tell every rank that connected, and keep answering latecomers until
    // each rank has heard it or the deadline passes, so no rank waits blind.
    *err = failure;
    status = BALLAST_EINVAL;
    if (failure.rfind("bootstrap timed out", 0) == 0) status = BALLAST_ETIMEDOUT;
    std::vector<uint8_t> msg(failure.begin(), failure.end());
    int told = 0;
    for (int fd : fds)
      if (fd >= 0) told += send_frame(fd, kError, msg, deadline) ? 1 : 0;
    for (int fd : extra) told += send_frame(fd, kError, msg, deadline) ? 1 : 0;
    while (told < nranks - 1 && status != BALLAST_ETIMEDOUT) {
      pollfd pfd{lis.fd, POLLIN, 0};
      const int ms = remaining_ms(deadline);
      if (ms == 0) break;
      if (poll(&pfd, 1, ms) <= 0) continue;
      const int c = accept4(lis.fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      uint32_t type = 0;
      std::vector<uint8_t> body;
      if (recv_frame(c, &type, &body, std::min(deadline, monotonic_ns() + hello_deadline_cap)) == 0)
        told += send_frame(c, kError, msg, deadline) ? 1 : 0;
      close(c);
    }
  }
  for (int fd : fds)
    if (fd >= 0) close(fd);
  for (int fd : extra) close(fd);
  return status;
}

int run_client(int rank, int nranks, const std::string& addr, int port, const PeerInfo& self, int64_t deadline,
               BootstrapResult* out, std::string* err) {
  sockaddr_in sa;
  if (!resolve(addr, port, &sa, err)) return BALLAST_EINVAL;
  std::string last = "no attempt";
  Fd s;
  // Retry until the master listens: ranks start in any order.
  while (true) {
    s.fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int rc = connect(s.fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd pfd{s.fd, POLLOUT, 0};
      const int pr = poll(&pfd, 1, std::min(remaining_ms(deadline), 1000));
      int soerr = ETIMEDOUT;
      socklen_t len = sizeof soerr;
      if (pr > 0) getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &soerr, &len);
      rc = soerr == 0 ? 0 : -1;
      errno = soerr;
    }
    if (rc == 0) break;
    last = std::strerror(errno);
    close(s.fd);
    s.fd = -1;
    if (remaining_ms(deadline) == 0) {
      *err = "rank " + std::to_string(rank) + " cannot reach the master (rank 0) at MASTER_ADDR:MASTER_PORT " +
             where(addr, port) + " before the deadline: " + last;
      return BALLAST_ETIMEDOUT;
    }
    usleep(20000);
  }
  const int one = 1;
  setsockopt(s.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::vector<uint8_t> hello;
  put_u32(hello, kVersion);
  put_u32(hello, uint32_t(rank));
  put_u32(hello, uint32_t(nranks));
  const auto e = encode_peer(self);
  hello.insert(hello.end(), e.begin(), e.end());
  uint32_t type = 0;
  std::vector<uint8_t> body;
  int rr = send_frame(s.fd, kHello, hello, deadline) ? 0 : -1;
  if (rr == 0) rr = recv_frame(s.fd, &type, &body, deadline);
  if (rr != 0) {
    const bool timeout = errno == ETIMEDOUT;
    *err = "rank " + std::to_string(rank) + ": " +
           (rr == -2 ? "the program at " + where(addr, port) + " is not a Ballast master (is MASTER_PORT used by another program?)"
            : timeout ? "no answer from the master at " + where(addr, port) +
                            " before the deadline (other ranks missing, or MASTER_PORT used by another program)"
                      : "the master at " + where(addr, port) + " closed the connection: " + std::strerror(errno));
    return timeout ? BALLAST_ETIMEDOUT : BALLAST_EPEER;
  }
  if (type == kError) {
    *err = "bootstrap refused by rank 0: " + std::string(body.begin(), body.end());
    return BALLAST_EINVAL;
  }
  Reader r{body};
  const uint64_t lo = r.u32();
  const uint64_t hi = r.u32();
  out->job_id = lo | (hi << 32);
  out->peers.clear();
  for (int i = 0; i < nranks && r.ok; ++i) out->peers.push_back(decode_peer(r));
  if (type != kTable || !r.ok || int(out->peers.size()) != nranks) {
    *err = "malformed bootstrap table from the master at " + where(addr, port);
    return BALLAST_EFORMAT;
  }
  return BALLAST_OK;
}

}  // namespace

int bootstrap_exchange(int rank, int nranks, const std::string& master_addr, int master_port, const PeerInfo& self,
                       int64_t deadline_ns, BootstrapResult* out, std::string* err) {
  if (nranks == 1) {
    out->job_id = uint64_t(monotonic_ns()) ^ (uint64_t(self.pid) << 32);
    out->peers = {self};
    return BALLAST_OK;
  }
  return rank == 0 ? run_master(nranks, master_addr, master_port, self, deadline_ns, out, err)
                   : run_client(rank, nranks, master_addr, master_port, self, deadline_ns, out, err);
}

}  // namespace ballast::comm
