#include "bootstrap.hpp"

#include <ballast/status.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>

namespace ballast::comm {

int64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

namespace {

constexpr uint32_t kMagic = 0x53424c42;  // "BLBS"
constexpr uint32_t kVersion = 2;
constexpr uint32_t kHello = 1, kTable = 2, kError = 3, kChallenge = 4;
constexpr uint32_t kMaxFrame = 64u << 20;
constexpr size_t kNonce = 16, kMac = 32;
// version, rank, world, pid, two length prefixes, the nonce and the MAC.
constexpr size_t kMaxHello = 6 * 4 + kMaxHostBytes + kMaxAddressBytes + kNonce + kMac;
constexpr int64_t kHelloWindowNs = 2000000000;  // a connection has 2 s to send its hello
constexpr size_t kMaxPending = 512;             // beyond: the oldest pending connection is dropped
constexpr size_t kMinSecret = 16;
// After the world is complete, rank 0 waits for a second claimant of a rank
// as long as the world's own hellos came apart, within these bounds.
constexpr int64_t kMinGraceNs = 5000000, kMaxGraceNs = 100000000;

using Nonce = std::array<uint8_t, kNonce>;
using Mac = std::array<uint8_t, kMac>;

int remaining_ms(int64_t deadline) {
  const int64_t left = deadline - monotonic_ns();
  return left <= 0 ? 0 : int(std::min<int64_t>(left / 1000000 + 1, 1 << 30));
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

void put_u32(std::vector<uint8_t>& b, uint32_t v) {
  b.insert(b.end(), reinterpret_cast<uint8_t*>(&v), reinterpret_cast<uint8_t*>(&v) + 4);
}
void put_raw(std::vector<uint8_t>& b, const void* p, size_t n) {
  b.insert(b.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
}
void put_bytes(std::vector<uint8_t>& b, const void* p, size_t n) {
  put_u32(b, uint32_t(n));
  put_raw(b, p, n);
}

// Reads a frame body; every read is checked against what is left, and a
// length prefix against `limit`.
struct Reader {
  const uint8_t* p;
  size_t size;
  size_t off = 0;
  bool ok = true;
  uint32_t u32() {
    uint32_t v = 0;
    if (!ok || size - off < 4) {
      ok = false;
      return 0;
    }
    std::memcpy(&v, p + off, 4);
    off += 4;
    return v;
  }
  std::vector<uint8_t> bytes(size_t limit) {
    const uint32_t n = u32();
    if (!ok || n > limit || size - off < n) {
      ok = false;
      return {};
    }
    std::vector<uint8_t> v(p + off, p + off + n);
    off += n;
    return v;
  }
  template <size_t N>
  std::array<uint8_t, N> fixed() {
    std::array<uint8_t, N> a{};
    if (!ok || size - off < N) {
      ok = false;
      return a;
    }
    std::memcpy(a.data(), p + off, N);
    off += N;
    return a;
  }
};

Mac hmac(const std::string& key, const uint8_t* a, size_t an, const uint8_t* b, size_t bn) {
  Mac out{};
  unsigned len = 0;
  std::vector<uint8_t> msg;
  msg.reserve(an + bn);
  put_raw(msg, a, an);
  put_raw(msg, b, bn);
  // An empty key is valid for HMAC; OpenSSL wants a non-null pointer.
  static const uint8_t kEmpty = 0;
  HMAC(EVP_sha256(), key.empty() ? static_cast<const void*>(&kEmpty) : key.data(), int(key.size()), msg.data(),
       msg.size(), out.data(), &len);
  return out;
}

bool mac_equal(const Mac& a, const uint8_t* b) { return CRYPTO_memcmp(a.data(), b, kMac) == 0; }

Nonce fresh_nonce() {
  Nonce n{};
  if (RAND_bytes(n.data(), int(n.size())) != 1) {
    // OpenSSL's generator failed (no entropy): the kernel's, directly.
    FILE* f = std::fopen("/dev/urandom", "rb");
    if (f) {
      if (std::fread(n.data(), 1, n.size(), f) != n.size()) n.fill(0);
      std::fclose(f);
    }
  }
  return n;
}

bool send_frame(int fd, uint32_t type, const std::vector<uint8_t>& body, int64_t deadline) {
  uint32_t head[3] = {kMagic, type, uint32_t(body.size())};
  return io_all(fd, head, sizeof head, true, deadline) &&
         io_all(fd, const_cast<uint8_t*>(body.data()), body.size(), true, deadline);
}

// An answer of rank 0: the payload, then an HMAC over the rank's nonce, the
// type and the payload.
std::vector<uint8_t> signed_answer(const std::string& key, const Nonce& client_nonce, uint32_t type,
                                   const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> signed_part;
  put_u32(signed_part, type);
  put_raw(signed_part, payload.data(), payload.size());
  std::vector<uint8_t> body = payload;
  const Mac m = hmac(key, client_nonce.data(), client_nonce.size(), signed_part.data(), signed_part.size());
  put_raw(body, m.data(), m.size());
  return body;
}

// 0 ok, -1 io failure (errno), -2 malformed.
int recv_frame(int fd, uint32_t* type, std::vector<uint8_t>* body, uint32_t limit, int64_t deadline) {
  uint32_t head[3];
  if (!io_all(fd, head, sizeof head, false, deadline)) return -1;
  if (head[0] != kMagic || head[2] > limit) return -2;
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

// A peer as read from the wire; false when a field is out of bounds.
bool decode_peer(Reader& r, PeerInfo* p) {
  p->pid = int32_t(r.u32());
  const auto h = r.bytes(kMaxHostBytes);
  p->host.assign(h.begin(), h.end());
  p->address = r.bytes(kMaxAddressBytes);
  return r.ok && p->pid > 0 && !p->address.empty();
}

// Text a peer sent, for a message: printable ASCII only, at most 200 bytes.
std::string printable(const uint8_t* p, size_t n) {
  std::string s;
  for (size_t i = 0; i < n && s.size() < 200; ++i) s += p[i] >= 0x20 && p[i] < 0x7f ? char(p[i]) : '?';
  return s;
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

bool is_loopback(const sockaddr_in& sa) { return (ntohl(sa.sin_addr.s_addr) >> 24) == 127; }

std::string where(const std::string& addr, int port) { return addr + ":" + std::to_string(port); }

// The owner (uid) of the loopback TCP socket at `peer` connected to `local`,
// from /proc/net/tcp; -1 when not found.
long owner_of(const sockaddr_in& peer, const sockaddr_in& local) {
  FILE* f = std::fopen("/proc/net/tcp", "r");
  if (!f) return -1;
  char line[512];
  long uid = -1;
  while (uid < 0 && std::fgets(line, sizeof line, f)) {
    unsigned la = 0, lp = 0, ra = 0, rp = 0, st = 0;
    long u = -1;
    if (std::sscanf(line, " %*u: %8X:%4X %8X:%4X %2X %*x:%*x %*x:%*x %*x %ld", &la, &lp, &ra, &rp, &st, &u) != 6)
      continue;
    if (la == peer.sin_addr.s_addr && lp == ntohs(peer.sin_port) && ra == local.sin_addr.s_addr &&
        rp == ntohs(local.sin_port))
      uid = u;
  }
  std::fclose(f);
  return uid;
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

// A connection rank 0 accepted whose hello is not complete yet.
struct Pending {
  int fd = -1;
  int64_t deadline = 0;
  Nonce nonce{};
  std::vector<uint8_t> buf;  // the header, then the header and the body
  size_t want = 12;
};

// A connection whose hello was authenticated.
struct Joined {
  int fd = -1;
  Nonce nonce{};
};

class Master {
 public:
  Master(int nranks, const std::string& addr, int port, const std::string& key, int64_t deadline)
      : nranks_(nranks), addr_(addr), port_(port), key_(key), deadline_(deadline) {}

  ~Master() {
    for (auto& p : pending_) close(p.fd);
    for (auto& j : ranks_)
      if (j.fd >= 0) close(j.fd);
    for (auto& j : extra_) close(j.fd);
  }

  int run(const PeerInfo& self, BootstrapResult* out, std::string* err) {
    sockaddr_in sa;
    if (!resolve(addr_, port_, &sa, err)) return BALLAST_EINVAL;
    local_ = sa;
    lis_.fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    const int one = 1;
    setsockopt(lis_.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(lis_.fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
      *err = "rank 0 cannot listen on MASTER_ADDR:MASTER_PORT " + where(addr_, port_) + ": " + std::strerror(errno) +
             (errno == EADDRINUSE ? " (the port is in use: pick another MASTER_PORT)" : "");
      return errno == EADDRINUSE ? BALLAST_EIO : BALLAST_EINVAL;
    }
    listen(lis_.fd, 1024);
    peers_.assign(size_t(nranks_), PeerInfo{});
    peers_[0] = self;
    ranks_.assign(size_t(nranks_), Joined{});
    gather();
    if (failure_.empty() && joined_ < nranks_) {
      std::string missing;
      for (int i = 1; i < nranks_; ++i)
        if (ranks_[size_t(i)].fd < 0) missing += (missing.empty() ? "" : ",") + std::to_string(i);
      failure_ = "bootstrap timed out at " + where(addr_, port_) + ": " + std::to_string(joined_) + " of " +
                 std::to_string(nranks_) + " ranks joined; missing rank(s) " + missing;
      if (dropped_ > 0) failure_ += " (" + std::to_string(dropped_) + " connection(s) dropped: " + last_drop_ + ")";
      timed_out_ = true;
    }
    out->dropped = dropped_;
    if (failure_.empty()) {
      const Nonce id = fresh_nonce();
      std::memcpy(&out->job_id, id.data(), sizeof out->job_id);
      std::vector<uint8_t> table;
      put_u32(table, uint32_t(out->job_id));
      put_u32(table, uint32_t(out->job_id >> 32));
      for (const auto& p : peers_) {
        const auto e = encode_peer(p);
        table.insert(table.end(), e.begin(), e.end());
      }
      for (int i = 1; i < nranks_; ++i) {
        const Joined& j = ranks_[size_t(i)];
        send_frame(j.fd, kTable, signed_answer(key_, j.nonce, kTable, table), deadline_);
      }
      out->peers = std::move(peers_);
      return BALLAST_OK;
    }
    *err = failure_;
    tell_everyone();
    return timed_out_ ? BALLAST_ETIMEDOUT : BALLAST_EINVAL;
  }

 private:
  // Accepts and reads hellos until the world is complete (plus a short
  // grace, so that a second claimant of a rank started at the same time is
  // caught), a hello fails the job, or the deadline passes. A claimant
  // started with the others comes about as late as they came one after
  // another: the grace is the spread of their hellos, within bounds.
  void gather() {
    int64_t grace_end = 0;
    while (failure_.empty()) {
      if (joined_ == nranks_ && grace_end == 0)
        grace_end =
            std::min(deadline_, monotonic_ns() + std::clamp(last_join_ns_ - first_join_ns_, kMinGraceNs, kMaxGraceNs));
      const int64_t until = grace_end ? grace_end : deadline_;
      if (remaining_ms(until) == 0) break;
      poll_once(until);
    }
  }

  // The failure goes to every authenticated connection, and to ranks that
  // join later until each rank has heard it or the deadline passes, so no
  // rank waits blind.
  void tell_everyone() {
    const std::vector<uint8_t> msg(failure_.begin(), failure_.end());
    auto tell = [&](Joined& j) {
      told_ += send_frame(j.fd, kError, signed_answer(key_, j.nonce, kError, msg), deadline_) ? 1 : 0;
      close(j.fd);
      j.fd = -1;
    };
    for (auto& j : ranks_)
      if (j.fd >= 0) tell(j);
    for (auto& j : extra_) tell(j);
    extra_.clear();
    telling_ = true;
    while (!timed_out_ && told_ < nranks_ - 1 && remaining_ms(deadline_) > 0) {
      poll_once(deadline_);
      for (auto& j : extra_) tell(j);
      extra_.clear();
    }
  }

  void drop(size_t i, const std::string& why) {
    ++dropped_;
    last_drop_ = why;
    close(pending_[i].fd);
    pending_.erase(pending_.begin() + long(i));
  }

  void poll_once(int64_t until) {
    const int64_t now = monotonic_ns();
    for (size_t i = pending_.size(); i-- > 0;)
      if (pending_[i].deadline <= now) drop(i, "no hello within 2 s");
    std::vector<pollfd> pfds;
    pfds.push_back({lis_.fd, POLLIN, 0});
    int64_t wake = until;
    for (const auto& p : pending_) {
      pfds.push_back({p.fd, POLLIN, 0});
      wake = std::min(wake, p.deadline);
    }
    const int ms = remaining_ms(wake);
    if (poll(pfds.data(), pfds.size(), ms) <= 0) return;
    // Pending connections first (by index, before accepting changes the list).
    for (size_t k = pfds.size(); k-- > 1;)
      if (pfds[k].revents) read_pending(k - 1);
    if (pfds[0].revents & POLLIN) accept_all();
  }

  void accept_all() {
    for (int c; (c = accept4(lis_.fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK)) >= 0;) {
      const int one = 1;
      setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      if (key_.empty()) {
        sockaddr_in peer{};
        socklen_t len = sizeof peer;
        getpeername(c, reinterpret_cast<sockaddr*>(&peer), &len);
        if (owner_of(peer, local_) != long(geteuid())) {
          ++dropped_;
          last_drop_ = "a connection from another user (no BALLAST_BOOTSTRAP_SECRET set)";
          close(c);
          continue;
        }
      }
      if (pending_.size() >= kMaxPending) drop(0, "too many connections without a hello");
      Pending p;
      p.fd = c;
      p.deadline = std::min(deadline_, monotonic_ns() + kHelloWindowNs);
      p.nonce = fresh_nonce();
      std::vector<uint8_t> challenge(p.nonce.begin(), p.nonce.end());
      // 28 bytes into a fresh socket's empty buffer: sent at once or never.
      uint32_t head[3] = {kMagic, kChallenge, uint32_t(challenge.size())};
      std::vector<uint8_t> frame;
      put_raw(frame, head, sizeof head);
      put_raw(frame, challenge.data(), challenge.size());
      if (send(c, frame.data(), frame.size(), MSG_NOSIGNAL) != ssize_t(frame.size())) {
        close(c);
        continue;
      }
      pending_.push_back(std::move(p));
    }
  }

  void read_pending(size_t i) {
    Pending& p = pending_[i];
    const size_t have = p.buf.size();
    p.buf.resize(p.want);
    const ssize_t n = recv(p.fd, p.buf.data() + have, p.want - have, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      p.buf.resize(have);
      return;
    }
    if (n <= 0) return drop(i, "closed before its hello");
    p.buf.resize(have + size_t(n));
    if (p.buf.size() < p.want) return;
    if (p.want == 12) {
      uint32_t head[3];
      std::memcpy(head, p.buf.data(), sizeof head);
      if (head[0] != kMagic || head[1] != kHello || head[2] > kMaxHello || head[2] < kNonce + kMac)
        return drop(i, "not a Ballast hello");
      p.want = 12 + head[2];
      return;
    }
    Pending done = std::move(p);
    pending_.erase(pending_.begin() + long(i));
    hello(done);
  }

  // A complete hello: authenticated, then checked against the world.
  void hello(Pending& p) {
    const uint8_t* body = p.buf.data() + 12;
    const size_t size = p.buf.size() - 12;
    const Mac expect = hmac(key_, p.nonce.data(), p.nonce.size(), body, size - kMac);
    if (!mac_equal(expect, body + size - kMac)) {
      const std::string why = key_.empty() ? "a hello signed with a secret, rank 0 has none"
                                           : "a hello not signed with this job's BALLAST_BOOTSTRAP_SECRET";
      // Unsigned: the sender learns why, nobody can be misled by it.
      const std::vector<uint8_t> msg(why.begin(), why.end());
      send_frame(p.fd, kError, msg, std::min(deadline_, monotonic_ns() + 100000000));
      ++dropped_;
      last_drop_ = why;
      close(p.fd);
      return;
    }
    HelloBody h;
    const bool well_formed = decode_hello(body, size - kMac, &h);
    const uint32_t version = h.version;
    const int32_t rank = h.rank;
    const int32_t world = h.world;
    PeerInfo& peer = h.peer;
    Joined j{p.fd, h.nonce};
    if (telling_) {
      extra_.push_back(j);
      return;
    }
    const std::string who = " (pid " + std::to_string(peer.pid) + " on " +
                            printable(reinterpret_cast<const uint8_t*>(peer.host.data()), peer.host.size()) + ")";
    if (version != kVersion) {
      extra_.push_back(j);
      failure_ = "a rank sent bootstrap version " + std::to_string(version) + " (expected " + std::to_string(kVersion) +
                 "): mixed Ballast versions in one job";
    } else if (!well_formed) {
      extra_.push_back(j);
      failure_ = "rank " + std::to_string(rank) + " sent a malformed hello" + who;
    } else if (world != nranks_) {
      extra_.push_back(j);
      failure_ = "world size mismatch: rank " + std::to_string(rank) + who +
                 " has WORLD_SIZE=" + std::to_string(world) + ", rank 0 has " + std::to_string(nranks_);
    } else if (rank <= 0 || rank >= nranks_) {
      extra_.push_back(j);
      failure_ = "rank " + std::to_string(rank) + " is out of range for world size " + std::to_string(nranks_);
    } else if (Joined& slot = ranks_[size_t(rank)]; slot.fd >= 0) {
      const PeerInfo& first = peers_[size_t(rank)];
      if (first.pid == peer.pid && first.host == peer.host && first.address == peer.address) {
        close(slot.fd);  // the same rank again, on a new connection: it lost the first
        slot = j;
        return;
      }
      extra_.push_back(j);
      failure_ = "rank " + std::to_string(rank) + " joined twice (pid " + std::to_string(first.pid) + " on " +
                 printable(reinterpret_cast<const uint8_t*>(first.host.data()), first.host.size()) + " and pid " +
                 std::to_string(peer.pid) + " on " +
                 printable(reinterpret_cast<const uint8_t*>(peer.host.data()), peer.host.size()) + ")";
    } else {
      slot = j;
      peers_[size_t(rank)] = std::move(peer);
      ++joined_;
      last_join_ns_ = monotonic_ns();
      if (first_join_ns_ == 0) first_join_ns_ = last_join_ns_;
    }
  }

  const int nranks_;
  const std::string addr_;
  const int port_;
  const std::string key_;
  const int64_t deadline_;
  sockaddr_in local_{};
  Fd lis_;
  std::deque<Pending> pending_;
  std::vector<Joined> ranks_;
  std::vector<Joined> extra_;  // authenticated connections that are not ranks of the world
  std::vector<PeerInfo> peers_;
  int joined_ = 1;
  int64_t first_join_ns_ = 0, last_join_ns_ = 0;  // the first and the last hello of a rank
  int told_ = 0;
  int dropped_ = 0;
  bool telling_ = false;
  bool timed_out_ = false;
  std::string failure_, last_drop_;
};

// One connection to rank 0 made; false (with *why) when none could be made
// before the deadline.
bool connect_master(const sockaddr_in& sa, int64_t deadline, Fd* s, std::string* why) {
  for (unsigned pause_us = 1000;;) {
    s->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int rc = connect(s->fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd pfd{s->fd, POLLOUT, 0};
      const int pr = poll(&pfd, 1, std::min(remaining_ms(deadline), 1000));
      int soerr = ETIMEDOUT;
      socklen_t len = sizeof soerr;
      if (pr > 0) getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &soerr, &len);
      rc = soerr == 0 ? 0 : -1;
      errno = soerr;
    }
    if (rc == 0) return true;
    *why = std::strerror(errno);
    close(s->fd);
    s->fd = -1;
    if (remaining_ms(deadline) == 0) return false;
    // Rank 0 starts listening at about the time the others first try: 1 ms,
    // then twice as long each time, up to 20 ms.
    usleep(pause_us);
    pause_us = std::min(2 * pause_us, 20000u);
  }
}

int run_client(int rank, int nranks, const std::string& addr, int port, const std::string& key, const PeerInfo& self,
               int64_t deadline, BootstrapResult* out, std::string* err) {
  sockaddr_in sa;
  if (!resolve(addr, port, &sa, err)) return BALLAST_EINVAL;
  std::string last = "no attempt";
  const std::string at = where(addr, port);
  // Retry until rank 0 listens (ranks start in any order) and while it
  // closes the connection unanswered (it may drop connections under a flood).
  while (true) {
    Fd s;
    if (!connect_master(sa, deadline, &s, &last)) {
      *err = "rank " + std::to_string(rank) + " cannot reach the master (rank 0) at MASTER_ADDR:MASTER_PORT " + at +
             " before the deadline: " + last;
      return BALLAST_ETIMEDOUT;
    }
    const int one = 1;
    setsockopt(s.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    uint32_t type = 0;
    std::vector<uint8_t> challenge;
    int rr = recv_frame(s.fd, &type, &challenge, 64, deadline);
    if (rr == -2 || (rr == 0 && (type != kChallenge || challenge.size() != kNonce))) {
      *err = "rank " + std::to_string(rank) + ": the program at " + at +
             " is not a Ballast master of this version (is MASTER_PORT used by another program?)";
      return BALLAST_EPEER;
    }
    if (rr == 0) {
      const Nonce mine = fresh_nonce();
      std::vector<uint8_t> hello;
      put_u32(hello, kVersion);
      put_u32(hello, uint32_t(rank));
      put_u32(hello, uint32_t(nranks));
      const auto e = encode_peer(self);
      put_raw(hello, e.data(), e.size());
      put_raw(hello, mine.data(), mine.size());
      const Mac m = hmac(key, challenge.data(), challenge.size(), hello.data(), hello.size());
      put_raw(hello, m.data(), m.size());
      std::vector<uint8_t> body;
      rr = send_frame(s.fd, kHello, hello, deadline) ? 0 : -1;
      if (rr == 0) rr = recv_frame(s.fd, &type, &body, kMaxFrame, deadline);
      if (rr == -2) {
        *err = "rank " + std::to_string(rank) + ": malformed answer from the master at " + at;
        return BALLAST_EFORMAT;
      }
      if (rr == 0) {
        const bool signed_ok = body.size() >= kMac && (type == kTable || type == kError) && [&] {
          std::vector<uint8_t> part;
          put_u32(part, type);
          put_raw(part, body.data(), body.size() - kMac);
          return mac_equal(hmac(key, mine.data(), mine.size(), part.data(), part.size()),
                           body.data() + body.size() - kMac);
        }();
        if (!signed_ok) {
          *err = "rank " + std::to_string(rank) + ": the master at " + at +
                 " refused the hello: " + printable(body.data(), body.size()) +
                 " (an unsigned answer: check BALLAST_BOOTSTRAP_SECRET)";
          return BALLAST_EINVAL;
        }
        body.resize(body.size() - kMac);
        if (type == kError) {
          *err = "bootstrap refused by rank 0: " + printable(body.data(), body.size());
          return BALLAST_EINVAL;
        }
        if (!decode_table(body.data(), body.size(), nranks, &out->job_id, &out->peers) ||
            out->peers[size_t(rank)].address != self.address) {
          *err = "rank " + std::to_string(rank) + ": malformed bootstrap table from the master at " + at;
          return BALLAST_EFORMAT;
        }
        return BALLAST_OK;
      }
    }
    if (errno == ETIMEDOUT || remaining_ms(deadline) == 0) {
      *err = "rank " + std::to_string(rank) + ": no answer from the master at " + at +
             " before the deadline (other ranks missing, or MASTER_PORT used by another program)";
      return BALLAST_ETIMEDOUT;
    }
    last = std::string("the master closed the connection: ") + std::strerror(errno);
    usleep(50000);
  }
}

}  // namespace

int bootstrap_exchange_with_secret(int rank, int nranks, const std::string& master_addr, int master_port,
                                   const std::string& secret, const PeerInfo& self, int64_t deadline_ns,
                                   BootstrapResult* out, std::string* err) {
  if (nranks == 1) {
    out->job_id = uint64_t(monotonic_ns()) ^ (uint64_t(self.pid) << 32);
    out->peers = {self};
    return BALLAST_OK;
  }
  if (self.host.size() > kMaxHostBytes || self.address.empty() || self.address.size() > kMaxAddressBytes) {
    *err = "rank " + std::to_string(rank) + ": host name or worker address out of bounds (" +
           std::to_string(self.host.size()) + " and " + std::to_string(self.address.size()) + " bytes)";
    return BALLAST_EINVAL;
  }
  if (!secret.empty() && secret.size() < kMinSecret) {
    *err = std::string(kBootstrapSecretEnv) + " is " + std::to_string(secret.size()) + " bytes long: at least " +
           std::to_string(kMinSecret) + " are needed";
    return BALLAST_EINVAL;
  }
  if (secret.empty()) {
    sockaddr_in sa;
    if (!resolve(master_addr, master_port, &sa, err)) return BALLAST_EINVAL;
    if (!is_loopback(sa)) {
      *err = std::string(kBootstrapSecretEnv) + " is not set and MASTER_ADDR " + master_addr +
             " is not loopback: a job across hosts needs a shared secret (`ballast launch` sets one)";
      return BALLAST_EINVAL;
    }
  }
  return rank == 0 ? Master(nranks, master_addr, master_port, secret, deadline_ns).run(self, out, err)
                   : run_client(rank, nranks, master_addr, master_port, secret, self, deadline_ns, out, err);
}

int bootstrap_exchange(int rank, int nranks, const std::string& master_addr, int master_port, const PeerInfo& self,
                       int64_t deadline_ns, BootstrapResult* out, std::string* err) {
  const char* secret = std::getenv(kBootstrapSecretEnv);
  return bootstrap_exchange_with_secret(rank, nranks, master_addr, master_port, secret ? secret : "", self, deadline_ns,
                                        out, err);
}

std::string interface_towards(const std::string& master_addr, std::string* err) {
  sockaddr_in sa;
  if (!resolve(master_addr, 9, &sa, err)) return "";
  Fd s;
  s.fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in local{};
  socklen_t len = sizeof local;
  // A datagram socket's connect sends nothing: it only picks the route.
  if (connect(s.fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
      getsockname(s.fd, reinterpret_cast<sockaddr*>(&local), &len) != 0) {
    *err = "no route to MASTER_ADDR " + master_addr + ": " + std::strerror(errno);
    return "";
  }
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) {
    *err = std::string("cannot list network interfaces: ") + std::strerror(errno);
    return "";
  }
  std::string name;
  for (ifaddrs* i = ifs; i && name.empty(); i = i->ifa_next)
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
        reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr == local.sin_addr.s_addr)
      name = i->ifa_name;
  freeifaddrs(ifs);
  if (name.empty()) *err = "no interface holds the address that reaches MASTER_ADDR " + master_addr;
  return name;
}

bool decode_hello(const uint8_t* body, size_t size, HelloBody* out) {
  Reader r{body, size};
  out->version = r.u32();
  out->rank = int32_t(r.u32());
  out->world = int32_t(r.u32());
  const bool peer_ok = decode_peer(r, &out->peer);
  out->nonce = r.fixed<kNonce>();
  return r.ok && r.off == r.size && peer_ok;
}

bool decode_table(const uint8_t* body, size_t size, int nranks, uint64_t* job_id, std::vector<PeerInfo>* peers) {
  Reader r{body, size};
  const uint64_t lo = r.u32();
  const uint64_t hi = r.u32();
  *job_id = lo | (hi << 32);
  // Each peer takes at least 12 bytes: a count beyond the body is malformed.
  if (nranks <= 0 || size_t(nranks) > size / 12) return false;
  peers->assign(size_t(nranks), PeerInfo{});
  bool ok = r.ok;
  for (int i = 0; i < nranks && ok; ++i) ok = decode_peer(r, &(*peers)[size_t(i)]);
  return ok && r.off == r.size;
}

}  // namespace ballast::comm
