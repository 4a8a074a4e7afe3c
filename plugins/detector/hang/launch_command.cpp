#include "analysis.hpp"
#include "hang_commands.hpp"
#include "heartbeat.hpp"
#include "launch_env.hpp"
#include "launch_record.hpp"

#include "command_line.hpp"
#include "progress.hpp"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

namespace ballast::hang {

namespace {

double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The signal (SIGINT, SIGTERM, SIGHUP) that asked the launcher to stop the
// job, 0 if none. The handler only sets it; the watch loop acts on it.
volatile sig_atomic_t g_stop_signal = 0;
volatile sig_atomic_t g_stop_signals = 0;  // how many came: one more during a stop cuts its grace

void on_stop_signal(int sig) {
  g_stop_signal = sig;
  g_stop_signals = g_stop_signals + 1;
}

// Catches SIGINT, SIGTERM and SIGHUP while it lives, then puts the previous
// handlers back (launch_main may run inside a longer-lived process). The
// ranks are in process groups of their own, so a Ctrl-C on the terminal
// reaches the launcher only: it must pass the stop on, or they are orphaned.
class StopSignals {
 public:
  StopSignals() {
    g_stop_signal = 0;
    g_stop_signals = 0;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    for (size_t k = 0; k < std::size(kSignals); ++k) sigaction(kSignals[k], &sa, &old_[k]);
  }
  ~StopSignals() {
    for (size_t k = 0; k < std::size(kSignals); ++k) sigaction(kSignals[k], &old_[k], nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  static constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};
  struct sigaction old_[std::size(kSignals)]{};
};

// Stops the ranks still running and reaps them: SIGTERM to each rank's
// process group (and SIGCONT: a stopped process must run to die of it), up
// to kGraceSeconds for the groups to empty, then SIGKILL to those left. A
// group outlives its leader when the rank's own children ignore SIGTERM, so
// the group is watched, not only the rank. A stop signal that comes during
// the grace (a second Ctrl-C) cuts it short: any beyond the first `handled`
// (those that caused the stop), however early it came. Returns once the
// groups are gone.
void stop_ranks(const std::vector<pid_t>& pids, std::vector<int>& codes, int handled) {
  constexpr double kGraceSeconds = 3;
  const size_t n = pids.size();
  auto reap = [&](size_t r) {
    if (codes[r] == -1 && waitpid(pids[r], &codes[r], WNOHANG) != pids[r]) codes[r] = -1;
  };
  auto group_alive = [&](size_t r) { return codes[r] == -1 || kill(-pids[r], 0) == 0; };
  for (size_t r = 0; r < n; ++r)
    if (group_alive(r)) {
      kill(-pids[r], SIGTERM);
      kill(-pids[r], SIGCONT);
    }
  const auto t_term = std::chrono::steady_clock::now();
  for (bool any = true; any && since(t_term) < kGraceSeconds;) {
    if (g_stop_signals > handled) {
      std::fprintf(stderr, "ballast launch: SIG%s during the stop: killing the ranks now\n",
                   sigabbrev_np(g_stop_signal));
      break;
    }
    any = false;
    for (size_t r = 0; r < n; ++r) {
      reap(r);
      any = any || group_alive(r);
    }
    if (any) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (size_t r = 0; r < n; ++r) {
    reap(r);
    if (group_alive(r)) kill(-pids[r], SIGKILL);
  }
  // A process dies of SIGKILL only once it next runs, which a loaded machine
  // delays: the launcher returns once the groups are empty (zombies left to
  // the parent of a child that outlived its rank count, for up to 1 s).
  const auto t_kill = std::chrono::steady_clock::now();
  for (bool any = true; any && since(t_kill) < 1;) {
    any = false;
    for (size_t r = 0; r < n; ++r) {
      reap(r);
      any = any || group_alive(r);
    }
    if (any) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (size_t r = 0; r < n; ++r)
    if (codes[r] == -1) waitpid(pids[r], &codes[r], 0);
}

int64_t wall_now() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// A job with neither is unwatched: said this long after the start.
constexpr double kUnwatchedWarnSeconds = 3;

std::string ended_words(int status) {
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "signal " + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")";
  return "";
}

struct LaunchArgs {
  int n = 0, port = 0;
  double stall_s = 10;
  double exit_grace_s = 30;
  bool json = false;
  std::string dir;
  int command = 0;  // argv index of the command after --
};

// The options before "--"; returns -1 to go on, else the exit code (help,
// usage error).
int parse_args(int argc, char** argv, LaunchArgs* a) {
  CLI::App app(
      "Start N local ranks (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT set), watch them and\n"
      "their collective traces; on a failure or a hang print the root cause and stop the job.",
      "ballast launch");
  app.footer("The command the ranks run comes after --: ballast launch -n N [OPTIONS] -- CMD ARGS...");
  app.add_option("-n,--nproc", a->n, "ranks to start")->required()->check(CLI::Range(1, 4096));
  app.add_option("--trace-dir", a->dir, "folder of the trace rings (default: a new one in /dev/shm)");
  app.add_option("--stall", a->stall_s, "seconds without progress that make a hang (default 10)")
      ->check(CLI::PositiveNumber);
  app.add_option("--exit-grace", a->exit_grace_s,
                 "seconds a rank whose heartbeat says done may take to exit before it is killed (default 30)")
      ->check(CLI::PositiveNumber);
  app.add_option("--port", a->port, "MASTER_PORT (default: a free port)")->check(CLI::Range(1, 65535));
  app.add_flag("--json", a->json, "print the verdict as one JSON object");
  int end = 1;
  while (end < argc && std::strcmp(argv[end], "--") != 0) ++end;
  if (int rc = util::parse_command_line(app, end, argv); rc >= 0) return rc;
  if (end + 1 >= argc) return util::usage_error(app, "missing the command after --");
  a->command = end + 1;
  return -1;
}

// The trace folder and MASTER_PORT; returns -1 to go on, else the exit code.
int prepare(const char* prog, LaunchArgs* a) {
  if (a->dir.empty()) {
    // tmpfs: on a disk file system, write-back would fault the ranks' ring stores.
    char shm[] = "/dev/shm/ballast-launch-XXXXXX", tmp[] = "/tmp/ballast-launch-XXXXXX";
    if (mkdtemp(shm))
      a->dir = shm;
    else if (mkdtemp(tmp))
      a->dir = tmp;
    else {
      std::fprintf(stderr, "%s: cannot create a trace folder in /dev/shm or /tmp: %s\n", prog, std::strerror(errno));
      return 1;
    }
  } else {
    mkdir(a->dir.c_str(), 0755);
  }
  if (a->port == 0) a->port = launch::free_port();
  if (a->port == 0) {
    std::fprintf(stderr, "%s: found no free port for MASTER_PORT outside ip_local_port_range: give one with --port\n",
                 prog);
    return 1;
  }
  return -1;
}

// Fork the ranks, each in a process group of its own; false when a fork
// failed (the ranks already started are killed).
bool start_ranks(const LaunchArgs& a, char** argv, const std::string& secret, std::vector<pid_t>* pids) {
  const pid_t launcher = getpid();
  for (int r = 0; r < a.n; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("ballast launch: fork");
      for (int k = 0; k < r; ++k) kill((*pids)[size_t(k)], SIGKILL);
      return false;
    }
    if (pid == 0) {
      setpgid(0, 0);
      // A launcher killed outright (SIGKILL, the OOM killer) cannot stop its
      // ranks: the kernel does, and a rank whose launcher is already gone ends.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != launcher) _exit(127);
      // With --json, stdout is the verdict alone: the ranks' output (and
      // their libraries' logs) goes to stderr.
      if (a.json) dup2(STDERR_FILENO, STDOUT_FILENO);
      for (const auto& [k, v] : launch::torchrun_env({r, a.n, r, a.n, 0}, a.port)) setenv(k.c_str(), v.c_str(), 1);
      setenv("BALLAST_BOOTSTRAP_SECRET", secret.c_str(), 1);
      setenv("BALLAST_TRACE_DIR", a.dir.c_str(), 1);
      execvp(argv[a.command], argv + a.command);
      std::fprintf(stderr, "ballast launch: cannot run %s: %s\n", argv[a.command], std::strerror(errno));
      _exit(127);
    }
    setpgid(pid, pid);  // as the child does: a stop sent before the child ran must reach its group
    (*pids)[size_t(r)] = pid;
  }
  return true;
}

// The progress line of the watch: "3 of 4 ranks running, 12 s, 1530
// collectives (125/s), last progress 0.2 s ago".
std::string watch_status(int running, int n, double elapsed, const std::vector<RankRing>& rings, double idle) {
  char text[256];
  int len = std::snprintf(text, sizeof text, "%d of %d ranks running, %.0f s", running, n, elapsed);
  uint64_t ops = 0;  // the furthest rank's operations
  for (const auto& r : rings)
    if (!r.records.empty()) ops = std::max(ops, r.records.back().seq);
  if (!rings.empty() && len > 0 && size_t(len) < sizeof text)
    std::snprintf(text + len, sizeof text - size_t(len), ", %llu collectives (%.0f/s), last progress %.1f s ago",
                  static_cast<unsigned long long>(ops), elapsed > 0 ? double(ops) / elapsed : 0.0, idle);
  return text;
}

// How the watch ended: every rank done, a rank failed, the job hung, or a
// stop signal.
struct WatchEnd {
  int running = 0;
  int failed_rank = -1;
  std::string why;
  std::vector<int> killed_after_done;  // ranks that said done, then did not exit
};

// A rank whose heartbeat says done but that does not exit within the grace
// hangs in its teardown (a process group's destructor, NCCL's communicator
// destroy): its work is over, so it is killed and counted as finished.
// Returns a warning line per rank killed.
std::vector<std::string> stop_lingering_ranks(const LaunchArgs& a, const std::vector<Heartbeat>& beats,
                                              const std::vector<pid_t>& pids, const std::vector<int>& codes,
                                              std::vector<double>& done_at, double now_s, WatchEnd* end) {
  std::vector<std::string> warnings;
  for (const Heartbeat& b : beats) {
    if (!b.done || b.rank < 0 || b.rank >= a.n || codes[size_t(b.rank)] != -1) continue;
    double& since_s = done_at[size_t(b.rank)];
    if (since_s < 0) since_s = now_s;
    if (now_s - since_s < a.exit_grace_s ||
        std::find(end->killed_after_done.begin(), end->killed_after_done.end(), b.rank) != end->killed_after_done.end())
      continue;
    char line[160];
    std::snprintf(line, sizeof line,
                  "rank %d (pid %d) said done %.0f s ago but has not exited: killed (a hang in its teardown)", b.rank,
                  int(pids[size_t(b.rank)]), now_s - since_s);
    warnings.push_back(line);
    end->killed_after_done.push_back(b.rank);
    kill(-pids[size_t(b.rank)], SIGKILL);
  }
  return warnings;
}

// Watch the ranks until they are all done, one fails, or the traces (or
// heartbeats) stop moving for stall_s while an operation is in flight.
WatchEnd watch(const LaunchArgs& a, const std::vector<pid_t>& pids, std::vector<int>& codes) {
  WatchEnd end;
  end.running = a.n;
  const auto t0 = std::chrono::steady_clock::now();
  auto last_change = t0;
  uint64_t signature = 0;
  auto next_scan = t0;
  bool watched = false, warned = false;
  // On a terminal, until the verdict: ranks running, time, collectives and
  // their rate, the last progress (erased before any other message).
  util::ProgressLine progress(stderr, "ballast launch", false, a.json);
  std::vector<double> done_at(size_t(a.n), -1.0);
  while (end.running > 0 && !g_stop_signal) {
    // Of the ranks that failed since the last look, the one killed by a
    // signal: the others most likely exited on the error its death caused.
    for (int r = 0; r < a.n; ++r) {
      if (codes[size_t(r)] != -1) continue;
      int st = 0;
      if (waitpid(pids[size_t(r)], &st, WNOHANG) != pids[size_t(r)]) continue;
      codes[size_t(r)] = st;
      --end.running;
      const bool ok =
          (WIFEXITED(st) && WEXITSTATUS(st) == 0) ||
          std::find(end.killed_after_done.begin(), end.killed_after_done.end(), r) != end.killed_after_done.end();
      const bool first_signal = end.failed_rank >= 0 && WIFSIGNALED(st) && !WIFSIGNALED(codes[size_t(end.failed_rank)]);
      if (!ok && (end.failed_rank < 0 || first_signal)) {
        end.failed_rank = r;
        end.why = WIFEXITED(st)
                      ? "exited with code " + std::to_string(WEXITSTATUS(st))
                      : "was killed by signal " + std::to_string(WTERMSIG(st)) + " (" + strsignal(WTERMSIG(st)) + ")";
      }
    }
    if (end.failed_rank >= 0) break;
    if (std::chrono::steady_clock::now() >= next_scan) {
      next_scan = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
      std::vector<std::string> errors;
      const auto rings = read_dir(a.dir, &errors);
      // Ranks that write no trace ring (no Ballast comm plugin) may still
      // say how far they are through heartbeat files.
      const auto beats = read_heartbeats(a.dir, &errors);
      for (const auto& w : stop_lingering_ranks(a, beats, pids, codes, done_at, since(t0), &end)) {
        progress.clear();
        std::fprintf(stderr, "ballast launch: warning: %s\n", w.c_str());
      }
      if (!rings.empty() || !beats.empty()) {
        if (warned && !watched) {
          progress.clear();
          std::fprintf(stderr, "ballast launch: %s appeared in %s: hang detection is on\n",
                       rings.empty() ? "heartbeats" : "trace rings", a.dir.c_str());
        }
        watched = true;
      } else if (!watched && !warned && since(t0) >= kUnwatchedWarnSeconds) {
        warned = true;
        progress.clear();
        std::fprintf(stderr,
                     "ballast launch: warning: no trace ring and no heartbeat in %s after %.0f s: hang detection is "
                     "off for this job (ranks exiting are still watched). Run collectives through a Ballast comm "
                     "plugin, or write a heartbeat (Python: ballast.Heartbeat; the format: "
                     "plugins/detector/hang/README.md)\n",
                     a.dir.c_str(), kUnwatchedWarnSeconds);
      }
      const uint64_t sig = rings.empty() ? heartbeat_signature(beats) : progress_signature(rings);
      const bool waiting = rings.empty() ? heartbeats_running(beats) : in_flight(rings);
      if (sig != signature) {
        signature = sig;
        last_change = std::chrono::steady_clock::now();
      } else if (waiting && since(last_change) >= a.stall_s) {
        end.why = "no " + std::string(rings.empty() ? "heartbeat" : "collective progress") + " for " +
                  std::to_string(int(since(last_change))) + " s";
        break;
      }
      progress.status(watch_status(end.running, a.n, since(t0), rings, since(last_change)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return end;
}

// Something went wrong: find the root cause while the processes are as they
// were, print it and record it, then stop the job. Returns the exit code.
int report_and_stop(const LaunchArgs& a, const WatchEnd& end, const std::vector<pid_t>& pids, std::vector<int>& codes) {
  std::vector<std::string> errors;
  const auto rings = read_dir(a.dir, &errors);
  const auto beats = read_heartbeats(a.dir, &errors);
  Verdict v = !rings.empty() ? analyze(rings, Options{}) : analyze_heartbeats(beats);
  LaunchRecord record;
  record.failed_rank = end.failed_rank;
  record.verdict_ns = wall_now();
  record.verdict_json = v.to_json();
  if (end.failed_rank >= 0) {
    record.reason = "rank " + std::to_string(end.failed_rank) + " (pid " +
                    std::to_string(pids[size_t(end.failed_rank)]) + ") " + end.why;
  } else {
    record.reason = "the job hangs: " + end.why;
  }
  std::fprintf(stderr, "ballast launch: %s\n", record.reason.c_str());
  for (const auto& e : errors) std::fprintf(stderr, "ballast launch: warning: %s\n", e.c_str());
  if (a.json) {
    std::printf("%s\n", v.to_json().c_str());
    std::fflush(stdout);
  } else {
    std::fputs(v.to_text().c_str(), stderr);
    // "healthy" beside a failed rank reads as a contradiction: it speaks of
    // the collectives only.
    if (v.verdict == "healthy" && end.failed_rank >= 0)
      std::fprintf(stderr,
                   rings.empty() && beats.empty()
                       ? "  no trace ring in %s: no rank ran a collective through a Ballast comm plugin (and none "
                         "wrote a heartbeat)\n"
                       : "  the traces in %s show no hang or mismatch: the failure is the rank's own\n",
                   a.dir.c_str());
  }
  // What each rank's process was when the verdict was given: the launcher
  // ends the others next, and a later `ballast analyze` must see them as
  // they were.
  char me[256] = {0};
  gethostname(me, sizeof me - 1);
  for (int r = 0; r < a.n; ++r) {
    LaunchRank k;
    k.rank = r;
    k.pid = pids[size_t(r)];
    k.state = codes[size_t(r)] != -1 ? ProcState::gone : probe(k.pid, me);
    k.ended = codes[size_t(r)] != -1 ? ended_words(codes[size_t(r)]) : "";
    k.stopped_by_launcher = codes[size_t(r)] == -1;
    record.ranks.push_back(k);
  }
  // The Python stacks of the ranks that can give them (after the verdict:
  // it does not wait for them).
  for (const auto& [rank, stack] : collect_stacks(a.dir, beats, 1000))
    std::fprintf(stderr, "ballast launch: rank %d's Python stacks:\n%s%s", rank, stack.c_str(),
                 !stack.empty() && stack.back() == '\n' ? "" : "\n");
  std::string err;
  if (!write_launch_record(a.dir, record, &err)) std::fprintf(stderr, "ballast launch: warning: %s\n", err.c_str());
  stop_ranks(pids, codes, g_stop_signals);
  record.stopped_ns = wall_now();
  for (auto& k : record.ranks)
    if (k.stopped_by_launcher) k.ended = ended_words(codes[size_t(k.rank)]) + ", stopped by the launcher";
  if (!write_launch_record(a.dir, record, &err)) std::fprintf(stderr, "ballast launch: warning: %s\n", err.c_str());
  std::fprintf(stderr, "ballast launch: job stopped; traces kept in %s (ballast analyze %s)\n", a.dir.c_str(),
               a.dir.c_str());
  return 1;
}

}  // namespace

int launch_main(int argc, char** argv) {
  LaunchArgs a;
  if (int rc = parse_args(argc, argv, &a); rc >= 0) return rc;
  if (int rc = prepare(argv[0], &a); rc >= 0) return rc;
  const std::string secret = launch::bootstrap_secret();
  if (secret.empty()) {
    std::fprintf(stderr, "%s: cannot make a bootstrap secret: %s\n", argv[0], std::strerror(errno));
    return 1;
  }

  const StopSignals stop_signals;
  std::vector<pid_t> pids(size_t(a.n), -1);
  std::vector<int> codes(size_t(a.n), -1);  // exit status, -1 while running
  if (!start_ranks(a, argv, secret, &pids)) return 1;
  std::fprintf(stderr, "ballast launch: %d ranks of '%s', MASTER_PORT %d, traces in %s\n", a.n, argv[a.command], a.port,
               a.dir.c_str());

  const WatchEnd end = watch(a, pids, codes);
  if (end.running == 0 && end.failed_rank < 0) return 0;
  if (const int sig = g_stop_signal) {
    std::fprintf(stderr, "ballast launch: interrupted by SIG%s: stopping the %d running rank(s)\n", sigabbrev_np(sig),
                 end.running);
    stop_ranks(pids, codes, 1);
    std::fprintf(stderr, "ballast launch: job interrupted (SIG%s); traces kept in %s\n", sigabbrev_np(sig),
                 a.dir.c_str());
    return 128 + sig;
  }
  return report_and_stop(a, end, pids, codes);
}

}  // namespace ballast::hang
