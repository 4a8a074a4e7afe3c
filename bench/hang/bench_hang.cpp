// bench_hang: how fast and how well `ballast launch` names the rank behind a
// failed or hung job, against Mycroft's published figures (anomaly found
// within 15 s in 90% of cases, root cause within 20 s in 60%; arXiv
// 2509.03018). Each run starts N ranks of comm_loop under
// `ballast launch --json` with one fault injected into one rank (random rank
// and iteration, fixed seed) and times from the fault, as the monotonic time
// comm_loop writes just before it, to the verdict, as the time launch prints
// it. A slow rank (50 ms before each collective: no hang) must get no verdict.
//
//   bench_hang [--ranks 4] [--reps 5] [--stall 10] [--bytes 65536,4194304] [--tls sm|tcp] [--seed N]
//
// --stall is launch's: seconds without progress before a job counts as hung
// (10 by default, as launch's own default); --seed picks other faulty ranks and
// iterations (20261125 by default). One JSON object per line:
// {"bench","case","metric","value","unit"}; a case is FAULT/NRANKS/BYTES, and
// "all" sums the faults.
#include "command_line.hpp"

#include <nlohmann/json.hpp>

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

int64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

void emit(const std::string& cs, const std::string& metric, double value, const std::string& unit) {
  std::printf("{\"bench\":\"hang\",\"case\":\"%s\",\"metric\":\"%s\",\"value\":%.4g,\"unit\":\"%s\"}\n", cs.c_str(),
              metric.c_str(), value, unit.c_str());
  std::fflush(stdout);
}

// The root-cause kind the detector should give each injected fault.
std::string expected_kind(const std::string& fault) {
  if (fault == "kill" || fault == "exit") return "crashed";
  if (fault == "stop") return "stuck";
  if (fault == "skip") return "not_joined";
  if (fault == "other") return "mismatch";
  return "";
}

// Where the whole line of launch's verdict starts in its output so far, or
// npos. Rank 0 of comm_loop shares that stdout: a rank that finished (one
// that skipped a collective ends early) prints its figures there first.
size_t verdict_line(const std::string& out) {
  const size_t at = out.find("\"root_cause\"");
  if (at == std::string::npos || out.find('\n', at) == std::string::npos) return std::string::npos;
  const size_t start = out.rfind('\n', at);
  return start == std::string::npos ? 0 : start + 1;
}

struct Outcome {
  bool finished = false;  // launch ended within the bench's own limit
  int exit_code = -1;
  bool verdict = false;  // launch printed a verdict
  bool correct = false;  // ... naming the faulty rank, with the expected kind, and no other rank
  double detect_s = -1;  // fault -> verdict
  std::string summary;   // what the verdict said, for a failure's report
};

// One `ballast launch` run; its stdout (the verdict) and stderr (the fault's
// time) are read as they come, so the verdict is timed when it is printed.
Outcome run_once(const std::string& ballast, const std::string& loop, int n, const std::string& tls, uint64_t bytes,
                 const std::string& fault, int fault_rank, long fault_iter, long iters, double stall) {
  char dir[] = "/dev/shm/ballast-bench-hang-XXXXXX";
  Outcome o;
  if (!mkdtemp(dir)) {
    o.summary = "cannot create a trace folder in /dev/shm";
    return o;
  }
  int out[2], err[2];
  if (pipe(out) != 0 || pipe(err) != 0) {
    o.summary = "cannot create pipes";
    std::filesystem::remove_all(dir);
    return o;
  }
  const std::vector<std::string> args = {ballast,
                                         "launch",
                                         "-n",
                                         std::to_string(n),
                                         "--stall",
                                         std::to_string(stall),
                                         "--trace-dir",
                                         dir,
                                         "--json",
                                         "--",
                                         loop,
                                         "--bytes",
                                         std::to_string(bytes),
                                         "--iters",
                                         std::to_string(iters),
                                         "--warmup",
                                         "3",
                                         "--fault",
                                         fault,
                                         "--fault-rank",
                                         std::to_string(fault_rank),
                                         "--fault-iter",
                                         std::to_string(fault_iter)};
  const pid_t pid = fork();
  if (pid == 0) {
    setenv("UCX_TLS", tls.c_str(), 1);
    dup2(out[1], 1);
    dup2(err[1], 2);
    close(out[0]);
    close(err[0]);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  std::string so, se;
  int64_t verdict_ns = 0;
  const int64_t limit = monotonic_ns() + int64_t((stall + 60) * 1e9);
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  int open_fds = 2;
  while (open_fds > 0 && monotonic_ns() < limit) {
    if (poll(fds, 2, 200) <= 0) continue;
    for (pollfd& f : fds) {
      if (f.fd < 0 || !(f.revents & (POLLIN | POLLHUP))) continue;
      char buf[4096];
      const ssize_t k = read(f.fd, buf, sizeof buf);
      if (k <= 0) {
        close(f.fd);
        f.fd = -1;
        --open_fds;
        continue;
      }
      if (f.fd == err[0]) {
        se.append(buf, size_t(k));
        continue;
      }
      so.append(buf, size_t(k));
      if (!verdict_ns && verdict_line(so) != std::string::npos) verdict_ns = monotonic_ns();
    }
  }
  if (open_fds > 0) kill(pid, SIGKILL);  // launch itself overran: reported as not finished
  for (pollfd& f : fds)
    if (f.fd >= 0) close(f.fd);
  int st = 0;
  waitpid(pid, &st, 0);
  std::filesystem::remove_all(dir);
  o.finished = open_fds == 0;
  o.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  const size_t line = verdict_line(so);
  if (line == std::string::npos) return o;
  const auto v = nlohmann::json::parse(so.substr(line, so.find('\n', line) - line), nullptr, false);
  if (v.is_discarded() || !v.contains("root_cause")) {
    o.summary = "unreadable verdict: " + so.substr(line, 200);
    return o;
  }
  o.verdict = true;
  o.summary = v.value("verdict", "?");
  bool named = false, others = false;
  for (const auto& c : v["root_cause"]) {
    const int r = c.value("rank", -1);
    const std::string kind = c.value("kind", "");
    o.summary += " rank " + std::to_string(r) + " " + kind;
    if (r == fault_rank && kind == expected_kind(fault))
      named = true;
    else
      others = true;
  }
  o.correct = named && !others;
  const auto at = se.find("monotonic_ns ");
  if (at != std::string::npos && verdict_ns)
    o.detect_s = double(verdict_ns - std::strtoll(se.c_str() + at + 13, nullptr, 10)) / 1e9;
  return o;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(p * double(v.size() - 1) + 0.5))];
}

struct Tally {
  std::vector<double> detect;  // seconds, runs with a verdict
  int runs = 0, correct = 0, within_15 = 0, correct_within_20 = 0;

  void add(const Outcome& o) {
    ++runs;
    if (o.detect_s >= 0) detect.push_back(o.detect_s);
    if (o.verdict && o.detect_s >= 0 && o.detect_s <= 15) ++within_15;
    if (o.correct) ++correct;
    if (o.correct && o.detect_s >= 0 && o.detect_s <= 20) ++correct_within_20;
  }
  void print(const std::string& cs) const {
    if (runs == 0) return;
    emit(cs, "runs", runs, "runs");
    emit(cs, "detect_p50", percentile(detect, 0.5), "s");
    emit(cs, "detect_p90", percentile(detect, 0.9), "s");
    emit(cs, "detect_max", percentile(detect, 1.0), "s");
    emit(cs, "anomaly_within_15s", 100.0 * within_15 / runs, "%");
    emit(cs, "root_cause_correct", 100.0 * correct / runs, "%");
    emit(cs, "root_cause_within_20s", 100.0 * correct_within_20 / runs, "%");
  }
};

}  // namespace

int main(int argc, char** argv) {
  int n = 4, reps = 5;
  double stall = 10;
  std::string tls = "sm,self";
  std::vector<uint64_t> sizes = {65536, 4u << 20};
  unsigned seed = 20261125;
  CLI::App app(
      "How fast and how well `ballast launch` names the rank behind a failed or hung job, against "
      "Mycroft's published figures; JSON lines on stdout (docs/benchmarks.md).",
      "bench_hang");
  app.add_option("--ranks", n, "ranks per job (default 4)")->check(CLI::Range(2, 64));
  app.add_option("--reps", reps, "runs per fault and size (default 5)")->check(CLI::PositiveNumber);
  app.add_option("--stall", stall, "launch's --stall, seconds (default 10)")->check(CLI::PositiveNumber);
  app.add_option("--bytes", sizes, "message sizes (default 65536,4194304)")->delimiter(',');
  app.add_option("--tls", tls, "UCX transport: sm or tcp (default sm)")
      ->check(CLI::IsMember({"sm", "tcp"}))
      ->transform([](std::string t) { return t == "sm" ? std::string("sm,self") : t; });
  app.add_option("--seed", seed, "picks the faulty ranks and iterations (default 20261125)");
  if (int rc = ballast::util::parse_command_line(app, argc, argv); rc >= 0) return rc;
  emit("mycroft_published", "anomaly_within_15s", 90, "%");
  emit("mycroft_published", "root_cause_within_20s", 60, "%");
  std::mt19937 rng(seed);
  const std::string tl = tls == "sm,self" ? "sm" : tls;
  Tally all;
  int false_alarms = 0, slow_runs = 0;
  for (uint64_t bytes : sizes) {
    for (const std::string fault : {"kill", "exit", "stop", "skip", "other"}) {
      Tally t;
      for (int rep = 0; rep < reps; ++rep) {
        const int rank = int(rng() % unsigned(n));
        const long iter = 20 + long(rng() % 200);
        // A skipping rank finishes one collective early: the hang comes at
        // the end, a few collectives after the skip.
        const long iters = fault == "skip" ? iter + 5 : 100000000;
        const Outcome o = run_once(BENCH_HANG_BALLAST, BENCH_HANG_LOOP, n, tls, bytes, fault, rank, iter, iters, stall);
        if (!o.correct)
          std::fprintf(stderr, "bench_hang: %s on rank %d at %ld: %s (launch %s, exit %d)\n", fault.c_str(), rank, iter,
                       o.summary.c_str(), o.finished ? "ended" : "overran", o.exit_code);
        t.add(o);
        all.add(o);
      }
      t.print(fault + "/" + tl + "/" + std::to_string(n) + "ranks/" + std::to_string(bytes) + "B");
    }
    // No hang: a rank 50 ms late to each of 60 collectives (3 s) must not
    // be taken for one, with the stall time shortened to 1 s to make it hard.
    for (int rep = 0; rep < reps; ++rep) {
      const int rank = int(rng() % unsigned(n));
      const Outcome o = run_once(BENCH_HANG_BALLAST, BENCH_HANG_LOOP, n, tls, bytes, "slow", rank, 0, 60, 1.0);
      ++slow_runs;
      if (o.verdict || o.exit_code != 0) {
        ++false_alarms;
        std::fprintf(stderr, "bench_hang: a slow rank %d was taken for a fault: %s (exit %d)\n", rank,
                     o.summary.c_str(), o.exit_code);
      }
    }
  }
  all.print("all/" + tl + "/" + std::to_string(n) + "ranks");
  emit("slow/" + tl + "/" + std::to_string(n) + "ranks", "runs", slow_runs, "runs");
  emit("slow/" + tl + "/" + std::to_string(n) + "ranks", "false_alarms", false_alarms, "runs");
  return 0;
}
