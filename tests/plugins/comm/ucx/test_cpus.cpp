// cpus_of: the CPUs that a host's ranks may run on together, from real
// processes with real affinity masks.
#include <doctest/doctest.h>

#include "cpus.hpp"

#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

namespace {

using ballast::comm::cpus_of;

// Two CPUs this process may use, or exits 77 (skipped) when it has fewer.
void two_cpus(int* a, int* b) {
  cpu_set_t s;
  REQUIRE(sched_getaffinity(0, sizeof s, &s) == 0);
  int found = 0;
  for (int c = 0; c < CPU_SETSIZE && found < 2; ++c)
    if (CPU_ISSET(c, &s)) (found++ == 0 ? *a : *b) = c;
  if (found < 2) {
    MESSAGE("fewer than 2 CPUs: skipped");
    std::exit(77);
  }
}

void bind_to(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  if (sched_setaffinity(0, sizeof s, &s) != 0) _exit(100);
}

// A process bound to `cpu` that waits to be killed.
pid_t bound_sleeper(int cpu) {
  const pid_t pid = fork();
  if (pid == 0) {
    bind_to(cpu);
    for (;;) pause();
  }
  return pid;
}

// cpus_of({peer}) as seen from a process bound to `cpu` (its exit code).
int cpus_seen_from(int cpu, pid_t peer) {
  const pid_t pid = fork();
  if (pid == 0) {
    bind_to(cpu);
    _exit(cpus_of({peer}));
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// Waits until `pid` runs bound to `cpu` (its mask is set right after fork).
void await_bound(pid_t pid, int cpu) {
  for (int i = 0; i < 1000; ++i) {
    cpu_set_t s;
    if (sched_getaffinity(pid, sizeof s, &s) == 0 && CPU_COUNT(&s) == 1 && CPU_ISSET(cpu, &s)) return;
    usleep(1000);
  }
  FAIL("process " << pid << " never got bound to CPU " << cpu);
}

}  // namespace

TEST_CASE("ranks bound to different CPUs may use both; bound to the same, one") {
  int a = -1, b = -1;
  two_cpus(&a, &b);
  const pid_t other = bound_sleeper(b);
  await_bound(other, b);
  CHECK(cpus_seen_from(a, other) == 2);
  CHECK(cpus_seen_from(b, other) == 1);
  kill(other, SIGKILL);
  waitpid(other, nullptr, 0);
}

TEST_CASE("a rank whose mask cannot be read counts as this process's mask") {
  int a = -1, b = -1;
  two_cpus(&a, &b);
  const pid_t gone = fork();
  if (gone == 0) _exit(0);
  waitpid(gone, nullptr, 0);
  CHECK(cpus_seen_from(a, gone) == 1);
  CHECK(cpus_seen_from(a, 0) == 1);
}
