#include "cpus.hpp"

#include <sched.h>

namespace ballast::comm {

int cpus_of(const std::vector<pid_t>& pids) {
  cpu_set_t own, all;
  CPU_ZERO(&own);
  if (sched_getaffinity(0, sizeof own, &own) != 0) return 1;
  all = own;
  for (const pid_t pid : pids) {
    cpu_set_t s;
    if (pid <= 0 || sched_getaffinity(pid, sizeof s, &s) != 0) continue;  // 0, gone, not permitted: own mask
    CPU_OR(&all, &all, &s);
  }
  const int n = CPU_COUNT(&all);
  return n > 0 ? n : 1;
}

}  // namespace ballast::comm
