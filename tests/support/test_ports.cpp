#include "test_ports.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mutex>
#include <string>

namespace test {

namespace {

// Ports are owned in granules of 64 from 4096 to 10047, each by the process
// holding its lock file; a process hands out the ports of its granules one
// run after the other, each once.
constexpr int kFirst = 4096, kGranule = 64, kGranules = 93, kMaxCount = 1024;
constexpr const char* kLockDir = "/tmp/ballast-test-ports";

// Whether a server could bind `port` on every local address now.
bool bindable(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // as servers do: TIME_WAIT does not count
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_ANY);
  sa.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
  close(fd);
  return ok;
}

bool all_bindable(int first, int count) {
  for (int p = first; p < first + count; ++p)
    if (!bindable(p)) return false;
  return true;
}

// Takes granule g's lock without waiting; the descriptor stays open (the
// lock held) until the process exits. Close-on-exec: a daemon the test
// starts must not hold it past the test.
bool lock_granule(int g) {
  const std::string path = std::string(kLockDir) + "/" + std::to_string(kFirst + g * kGranule);
  const int fd = open(path.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC, 0666);  // read-only: another user can lock it too
  if (fd < 0) return false;
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    close(fd);
    return false;
  }
  return true;
}

}  // namespace

int reserve_ports(int count) {
  if (count < 1 || count > kMaxCount) return -1;
  static std::mutex mutex;
  static bool owned[kGranules] = {};
  static int next = 0, end = 0;  // the ports of owned granules not handed out yet
  const std::lock_guard<std::mutex> hold(mutex);
  while (end - next >= count) {  // what is left of the last granules first
    const int first = next;
    next += count;
    if (all_bindable(first, count)) return first;
  }
  if (mkdir(kLockDir, 01777) == 0) chmod(kLockDir, 01777);  // any user's tests share it
  const int need = (count + kGranule - 1) / kGranule;
  const int start = static_cast<int>(getpid() % kGranules);  // processes at once start apart
  for (int i = 0; i < kGranules; ++i) {
    const int g = (start + i) % kGranules;
    if (g + need > kGranules) continue;
    // Granules locked on a try that fails stay this process's, unused, until exit: harmless.
    int locked = 0;
    while (locked < need && !owned[g + locked] && lock_granule(g + locked)) owned[g + locked++] = true;
    if (locked < need) continue;
    const int first = kFirst + g * kGranule;
    if (!all_bindable(first, count)) continue;
    next = first + count;
    end = first + need * kGranule;
    return first;
  }
  return -1;
}

}  // namespace test
