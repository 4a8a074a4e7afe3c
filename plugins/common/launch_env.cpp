#include "launch_env.hpp"

#include <netinet/in.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <random>

namespace ballast::launch {

namespace {

// Whether a TCP socket can listen on the loopback's `port` now.
bool port_free(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // as the bootstrap's master does
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  sa.sin_port = htons(uint16_t(port));
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0 && listen(fd, 1) == 0;
  close(fd);
  return ok;
}

}  // namespace

int free_port() {
  int lo = 32768, hi = 60999;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d %d", &lo, &hi) != 2) lo = 32768, hi = 60999;
    std::fclose(f);
  }
  std::mt19937 pick(std::random_device{}() ^ uint32_t(getpid()));
  for (int tries = 0; tries < 200; ++tries) {
    const int port = 10000 + int(pick() % 55536);  // 10000-65535
    if ((port < lo || port > hi) && port_free(port)) return port;
  }
  return 0;
}

std::string bootstrap_secret() {
  const char* given = std::getenv("BALLAST_BOOTSTRAP_SECRET");
  if (given && *given) return given;
  unsigned char raw[32];
  if (getrandom(raw, sizeof raw, 0) != ssize_t(sizeof raw)) return "";
  static const char kHex[] = "0123456789abcdef";
  std::string s;
  for (unsigned char c : raw) s += {kHex[c >> 4], kHex[c & 15]};
  return s;
}

std::vector<std::pair<std::string, std::string>> torchrun_env(const RankPlace& place, int master_port) {
  return {{"RANK", std::to_string(place.rank)},
          {"LOCAL_RANK", std::to_string(place.local_rank)},
          {"GROUP_RANK", std::to_string(place.group_rank)},
          {"WORLD_SIZE", std::to_string(place.world)},
          {"LOCAL_WORLD_SIZE", std::to_string(place.local_world)},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", std::to_string(master_port)}};
}

}  // namespace ballast::launch
