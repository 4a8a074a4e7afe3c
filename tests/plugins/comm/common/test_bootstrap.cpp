// The bootstrap against hostile peers: forged, unauthenticated, malformed
// and idle connections to rank 0's port are dropped without failing the job
// or delaying it, and a rank with the wrong secret is told so.
#include "test_ports.hpp"

#include <bootstrap.hpp>

#include <ballast/status.h>

#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

using namespace ballast::comm;

namespace {

const std::string kSecret = "0123456789abcdef0123456789abcdef";

int connect_to(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(uint16_t(port));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (int i = 0; i < 500; ++i) {
    if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0) return fd;
    usleep(10000);
  }
  close(fd);
  return -1;
}

PeerInfo peer(int rank) {
  PeerInfo p;
  p.pid = 1000 + rank;
  p.host = "host" + std::to_string(rank);
  p.address.assign(40, uint8_t(rank + 1));
  return p;
}

struct Outcome {
  int rc = 0;
  std::string err;
  BootstrapResult res;
};

std::future<Outcome> rank_async(int rank, int n, int port, std::string secret, double seconds) {
  return std::async(std::launch::async, [=] {
    Outcome o;
    const int64_t deadline = monotonic_ns() + int64_t(seconds * 1e9);
    o.rc = bootstrap_exchange_with_secret(rank, n, "127.0.0.1", port, secret, peer(rank), deadline, &o.res, &o.err);
    return o;
  });
}

// A hello in the wire format with a MAC that is not the job's: what an
// attacker who does not know the secret can send.
void send_forged_hello(int fd, int rank, int world) {
  uint32_t head[3];
  // Read the challenge first, as a client does.
  recv(fd, head, sizeof head, MSG_WAITALL);
  uint8_t nonce[16];
  recv(fd, nonce, sizeof nonce, MSG_WAITALL);
  std::vector<uint8_t> body;
  auto u32 = [&](uint32_t v) {
    body.insert(body.end(), reinterpret_cast<uint8_t*>(&v), reinterpret_cast<uint8_t*>(&v) + 4);
  };
  u32(2);
  u32(uint32_t(rank));
  u32(uint32_t(world));
  u32(4242);
  u32(4);
  body.insert(body.end(), {'e', 'v', 'i', 'l'});
  u32(64);
  body.insert(body.end(), 64, 0xEE);       // a random "worker address"
  body.insert(body.end(), 16 + 32, 0x11);  // nonce and a MAC made up
  head[0] = 0x53424c42;
  head[1] = 1;
  head[2] = uint32_t(body.size());
  send(fd, head, sizeof head, MSG_NOSIGNAL);
  send(fd, body.data(), body.size(), MSG_NOSIGNAL);
}

}  // namespace

TEST_CASE("a forged hello claiming a rank is dropped and the real rank joins") {
  const int port = test::reserve_ports(1);
  auto r0 = rank_async(0, 3, port, kSecret, 20);
  const int evil = connect_to(port);
  REQUIRE(evil >= 0);
  send_forged_hello(evil, 1, 3);
  const int evil2 = connect_to(port);
  send_forged_hello(evil2, 2, 7);  // a wrong world size, unauthenticated: not fatal
  usleep(100000);
  auto r1 = rank_async(1, 3, port, kSecret, 20);
  auto r2 = rank_async(2, 3, port, kSecret, 20);
  const Outcome o0 = r0.get(), o1 = r1.get(), o2 = r2.get();
  close(evil);
  close(evil2);
  REQUIRE_MESSAGE(o0.rc == BALLAST_OK, o0.err);
  REQUIRE_MESSAGE(o1.rc == BALLAST_OK, o1.err);
  REQUIRE_MESSAGE(o2.rc == BALLAST_OK, o2.err);
  CHECK(o0.res.dropped == 2);
  for (const Outcome* o : {&o0, &o1, &o2}) {
    REQUIRE(o->res.peers.size() == 3);
    CHECK(o->res.job_id == o0.res.job_id);
    for (int r = 0; r < 3; ++r) {
      CHECK(o->res.peers[size_t(r)].address == peer(r).address);
      CHECK(o->res.peers[size_t(r)].host == peer(r).host);
    }
  }
}

TEST_CASE("idle and garbage connections do not delay the bootstrap") {
  // Read one at a time with 2 s each, 30 idle connections cost a minute;
  // read together, the ranks join at once, well before a 20 s deadline.
  const int port = test::reserve_ports(1);
  auto r0 = rank_async(0, 2, port, kSecret, 20);
  std::vector<int> idle;
  for (int i = 0; i < 30; ++i) idle.push_back(connect_to(port));
  const int garbage = connect_to(port);
  const char junk[] = "GET / HTTP/1.0\r\n\r\n";
  send(garbage, junk, sizeof junk, MSG_NOSIGNAL);
  auto r1 = rank_async(1, 2, port, kSecret, 20);
  const Outcome o0 = r0.get(), o1 = r1.get();
  for (int fd : idle) close(fd);
  close(garbage);
  REQUIRE_MESSAGE(o0.rc == BALLAST_OK, o0.err);
  REQUIRE_MESSAGE(o1.rc == BALLAST_OK, o1.err);
}

TEST_CASE("a rank with the wrong secret is told, and the job times out naming it") {
  const int port = test::reserve_ports(1);
  auto r0 = rank_async(0, 2, port, kSecret, 3);
  auto r1 = rank_async(1, 2, port, "another secret, 32 bytes long...", 3);
  const Outcome o0 = r0.get(), o1 = r1.get();
  CHECK(o1.rc != BALLAST_OK);
  CHECK_MESSAGE(o1.err.find("BALLAST_BOOTSTRAP_SECRET") != std::string::npos, o1.err);
  CHECK(o0.rc == BALLAST_ETIMEDOUT);
  CHECK_MESSAGE(o0.err.find("missing rank(s) 1") != std::string::npos, o0.err);
  CHECK_MESSAGE(o0.err.find("dropped") != std::string::npos, o0.err);
}

TEST_CASE("authenticated ranks still fail the job on a real mismatch") {
  const int port = test::reserve_ports(1);
  auto r0 = rank_async(0, 2, port, kSecret, 10);
  Outcome o1;
  o1.rc = bootstrap_exchange_with_secret(1, 3, "127.0.0.1", port, kSecret, peer(1), monotonic_ns() + 10000000000,
                                         &o1.res, &o1.err);
  const Outcome o0 = r0.get();
  CHECK(o0.rc == BALLAST_EINVAL);
  CHECK_MESSAGE(o0.err.find("world size mismatch") != std::string::npos, o0.err);
  CHECK(o1.rc == BALLAST_EINVAL);
  CHECK_MESSAGE(o1.err.find("world size mismatch") != std::string::npos, o1.err);
}

TEST_CASE("without a secret, a local job runs and a job across hosts is refused") {
  const int port = test::reserve_ports(1);
  auto r0 = rank_async(0, 2, port, "", 10);
  auto r1 = rank_async(1, 2, port, "", 10);
  const Outcome o0 = r0.get(), o1 = r1.get();
  REQUIRE_MESSAGE(o0.rc == BALLAST_OK, o0.err);
  REQUIRE_MESSAGE(o1.rc == BALLAST_OK, o1.err);

  BootstrapResult res;
  std::string err;
  CHECK(bootstrap_exchange_with_secret(1, 2, "192.0.2.1", port, "", peer(1), monotonic_ns() + 1000000000, &res, &err) ==
        BALLAST_EINVAL);
  CHECK_MESSAGE(err.find("BALLAST_BOOTSTRAP_SECRET is not set") != std::string::npos, err);
  CHECK(bootstrap_exchange_with_secret(1, 2, "127.0.0.1", port, "short", peer(1), monotonic_ns() + 1000000000, &res,
                                       &err) == BALLAST_EINVAL);
  CHECK_MESSAGE(err.find("at least 16") != std::string::npos, err);
}

TEST_CASE("the interface towards a loopback MASTER_ADDR is lo") {
  std::string err;
  CHECK_MESSAGE(interface_towards("127.0.0.1", &err) == "lo", err);
}

namespace {

void put32(std::vector<uint8_t>& b, uint32_t v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  b.insert(b.end(), p, p + 4);
}

void put_bytes(std::vector<uint8_t>& b, const std::string& s) {
  put32(b, uint32_t(s.size()));
  b.insert(b.end(), s.begin(), s.end());
}

std::vector<uint8_t> hello_body(const std::string& host, const std::string& address) {
  std::vector<uint8_t> b;
  put32(b, 2);
  put32(b, 1);
  put32(b, 4);
  put32(b, 4242);
  put_bytes(b, host);
  put_bytes(b, address);
  b.insert(b.end(), 16, 0x5a);
  return b;
}

}  // namespace

TEST_CASE("the hello's wire form: fields decoded, bounds and leftovers refused") {
  std::vector<uint8_t> b = hello_body("gpu001", "ucx-address");
  HelloBody h;
  REQUIRE(decode_hello(b.data(), b.size(), &h));
  CHECK(h.version == 2);
  CHECK(h.rank == 1);
  CHECK(h.world == 4);
  CHECK(h.peer.pid == 4242);
  CHECK(h.peer.host == "gpu001");
  CHECK(std::string(h.peer.address.begin(), h.peer.address.end()) == "ucx-address");
  CHECK(h.nonce[15] == 0x5a);
  for (size_t n = 0; n < b.size(); ++n) CHECK_FALSE(decode_hello(b.data(), n, &h));  // every truncation
  b.push_back(0);
  CHECK_FALSE(decode_hello(b.data(), b.size(), &h));  // a byte left over
  b = hello_body(std::string(kMaxHostBytes + 1, 'h'), "a");
  CHECK_FALSE(decode_hello(b.data(), b.size(), &h));
  CHECK(h.version == 2);  // read before the bad field: a mixed-version job is still named
  b = hello_body("h", "");
  CHECK_FALSE(decode_hello(b.data(), b.size(), &h));  // no address
  // A table claiming more peers than its bytes could hold.
  std::vector<uint8_t> t;
  put32(t, 7);
  put32(t, 0);
  uint64_t job = 0;
  std::vector<PeerInfo> peers;
  CHECK_FALSE(decode_table(t.data(), t.size(), 1 << 20, &job, &peers));
  CHECK(peers.empty());
}
