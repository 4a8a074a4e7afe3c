// test::reserve_ports: the ports tests give their servers.
#include "test_ports.hpp"

#include <doctest/doctest.h>

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <set>
#include <string>

namespace {

// Whether a server (SO_REUSEADDR, as every server the tests start sets it: an earlier user's
// connection in TIME_WAIT does not hold the port) can listen on `port` on every address.
bool listens(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_ANY);
  sa.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0 && listen(fd, 1) == 0;
  close(fd);
  return ok;
}

}  // namespace

TEST_CASE("ports are handed out once, free, below the kernel's range for source ports, locked for this process") {
  int lo = 32768, hi = 60999;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> lo >> hi;
  std::set<int> seen;
  auto take = [&](int count) {
    const int first = test::reserve_ports(count);
    REQUIRE(first > 0);
    CHECK(first + count - 1 < lo);
    for (int p = first; p < first + count; ++p) {
      CHECK(seen.insert(p).second);  // never twice
      CHECK(listens(p));
    }
    return first;
  };
  for (int i = 0; i < 70; ++i) take(1);  // more than one granule's worth
  const int block = take(128);           // across granules
  take(3);
  // Another process opening the block's lock file cannot take it (flock: another open file
  // description conflicts, in this process as in any other).
  const int fd = open(("/tmp/ballast-test-ports/" + std::to_string(block)).c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  CHECK(flock(fd, LOCK_EX | LOCK_NB) != 0);
  close(fd);
  CHECK(test::reserve_ports(0) == -1);
  CHECK(test::reserve_ports(1025) == -1);
}

TEST_CASE("a port something already listens on is not handed out") {
  // Listen on the port after one handed out, in the same granule of 64 (this process's, not
  // handed out yet): the next two handed out must leave it out.
  int first = test::reserve_ports(1);
  while (first > 0 && (first + 1 - 4096) % 64 == 0) first = test::reserve_ports(1);
  REQUIRE(first > 0);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // an earlier test's TIME_WAIT does not count
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  sa.sin_port = htons(static_cast<uint16_t>(first + 1));
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
  REQUIRE(listen(fd, 1) == 0);
  const int next = test::reserve_ports(2);
  CHECK(next > 0);
  CHECK((next > first + 1 || next + 1 < first + 1));  // the range does not hold first + 1
  close(fd);
}
