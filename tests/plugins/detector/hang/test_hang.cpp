// The hang detector names the right rank and kind for each fault, through
// `ballast launch` (launch_main) running real ranks of comm_loop over the
// UCX plugin, and `ballast analyze` (analyze_main) on the rings they leave.
#include <doctest/doctest.h>

#include <analysis.hpp>
#include <hang_commands.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "../../comm/ucx/scratch_dir.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;

namespace {

const std::string kLoop = std::string(BALLAST_BINARY_DIR) + "/bin/comm_loop";

// In sanitizer builds, LeakSanitizer's exit-time tracer crashes on UCX's
// threads in the ranks (a tool incompatibility, not a leak: "Tracer caught
// signal 11", at times): ranks run without the exit-time leak check; memory
// errors are still caught. Appended to what the test preset sets
// (detect_leaks=1, for this process), since the last setting wins; this
// process read its options at start and keeps its leak check.
const bool kNoLeakCheckInRanks = [] {
  const char* set = std::getenv("ASAN_OPTIONS");
  const std::string options = set && *set ? std::string(set) + ":detect_leaks=0" : "detect_leaks=0";
  return setenv("ASAN_OPTIONS", options.c_str(), 1) == 0;
}();

struct Run {
  int code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs fn in a child with stdout and stderr captured.
template <class F>
Run capture(F fn) {
  const std::string o = test::scratch() / "launch.out", e = test::scratch() / "launch.err";
  std::fflush(stdout);  // or the child would write the parent's pending output again
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid == 0) {
    const int fo = open(o.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644),
              fe = open(e.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fo, 1);
    dup2(fe, 2);
    const int rc = fn();
    std::fflush(stdout);
    std::fflush(stderr);
    _exit(rc);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  Run r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  std::stringstream so, se;
  so << std::ifstream(o).rdbuf();
  se << std::ifstream(e).rdbuf();
  r.out = so.str();
  r.err = se.str();
  return r;
}

int call(int (*main_fn)(int, char**), std::vector<std::string> args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  return main_fn(int(args.size()), argv.data());
}

std::string fresh_dir(const std::string& name) {
  const std::string d = test::scratch() / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Launch 3 ranks of comm_loop with a fault; returns the launcher's run.
Run launch(const std::string& dir, const std::vector<std::string>& fault, const std::string& bytes = "4096",
           const char* tls = "sm,self") {
  setenv("UCX_TLS", tls, 1);
  std::vector<std::string> args = {
      "ballast launch", "-n",  "3",       "--trace-dir", dir,        "--stall", "1.5",          "--json", "--", kLoop,
      "--bytes",        bytes, "--iters", "300",         "--warmup", "0",       "--timeout-ms", "60000"};
  args.insert(args.end(), fault.begin(), fault.end());
  return capture([&] { return call(ballast::hang::launch_main, args); });
}

nlohmann::json verdict(const Run& r) {
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE(!r.out.empty());
  // The verdict is the last line (the ranks' own output comes before it).
  std::string last, line;
  std::istringstream in(r.out);
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  return nlohmann::json::parse(last);
}

void expect_cause(const nlohmann::json& v, const std::string& verdict_word, int rank, const std::string& kind) {
  INFO(v.dump(2));
  CHECK(v["verdict"] == verdict_word);
  REQUIRE(v["root_cause"].size() >= 1);
  CHECK(v["root_cause"][0]["rank"] == rank);
  CHECK(v["root_cause"][0]["kind"] == kind);
}

// Polls until done() holds, for up to `seconds`.
bool eventually(double seconds, const std::function<bool()>& done) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!done()) {
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

bool gone(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::getline(f, stat);
  const auto paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] == 'Z';
}

// The real `ballast` and its hang plugin are dependencies of this test
// (CMakeLists.txt): missing means a broken build, a failure, not a skip.
void require_ballast() {
  REQUIRE_MESSAGE(fs::exists(BALLAST_EXE), BALLAST_EXE << " is not built");
  REQUIRE_MESSAGE(fs::exists(std::string(BALLAST_PLUGIN_DIR) + "/ballast-hang.so"),
                  BALLAST_PLUGIN_DIR << "/ballast-hang.so is not built");
}

// The real `ballast launch`, started in the background with its output in
// DIR/launch.out and DIR/launch.err. Whatever a failed check leaves running
// (the launcher, the processes in `ranks` and their groups) is killed when it
// goes out of scope.
struct Launcher {
  pid_t pid = -1;
  std::string dir;
  std::vector<pid_t> ranks;

  Launcher(const std::string& d, std::vector<std::string> args) : dir(d) {
    require_ballast();
    args.insert(args.begin(), {BALLAST_EXE, "launch"});
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string o = dir + "/launch.out", e = dir + "/launch.err";
    std::fflush(stdout);
    std::fflush(stderr);
    pid = fork();
    if (pid == 0) {
      dup2(open(o.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), 1);
      dup2(open(e.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), 2);
      execv(argv[0], argv.data());
      _exit(127);
    }
  }
  ~Launcher() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    for (pid_t r : ranks)
      if (!gone(r)) {
        kill(-r, SIGKILL);
        kill(r, SIGKILL);
      }
  }
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;

  // Its exit code (128 + the signal that killed it), or -1 if it still runs after `seconds`.
  int wait(double seconds) {
    int st = 0;
    if (!eventually(seconds, [&] { return waitpid(pid, &st, WNOHANG) == pid; })) return -1;
    pid = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
  std::string err() const {
    std::stringstream s;
    s << std::ifstream(dir + "/launch.err").rdbuf();
    return s.str();
  }
};

// Shell ranks write their pids to DIR/pids.RANK, the last one a `sleep`
// (their own, or a child's): ready when every rank's last pid runs `sleep`
// (exec'd, so that its disposition of SIGTERM is set). Fills l->ranks.
bool sleeping_ranks(int n, Launcher* l) {
  l->ranks.clear();
  for (int r = 0; r < n; ++r) {
    std::ifstream f(l->dir + "/pids." + std::to_string(r));
    std::vector<pid_t> pids;
    for (pid_t p = 0; f >> p;) pids.push_back(p);
    if (pids.empty()) return false;
    l->ranks.insert(l->ranks.end(), pids.begin(), pids.end());
    std::string comm;
    std::getline(std::ifstream("/proc/" + std::to_string(pids.back()) + "/comm"), comm);
    if (comm != "sleep") return false;
  }
  return true;
}

}  // namespace

TEST_CASE("a rank killed during the job is named crashed") {
  const auto r = launch(fresh_dir("kill"), {"--fault", "kill", "--fault-rank", "1", "--fault-iter", "100"});
  CHECK(r.code == 1);
  CHECK(r.err.find("rank 1") != std::string::npos);
  CHECK(r.err.find("comm_loop: rank 1: fault kill at iteration 100, monotonic_ns ") !=
        std::string::npos);  // bench/hang's clock
  expect_cause(verdict(r), "hang", 1, "crashed");
}

TEST_CASE("a stopped rank is named stuck, found by the stall watch; analyze agrees after the launcher killed all") {
  const std::string dir = fresh_dir("stop");
  const auto r = launch(dir, {"--fault", "stop", "--fault-rank", "2", "--fault-iter", "100"});
  CHECK(r.code == 1);
  CHECK(r.err.find("no collective progress") != std::string::npos);
  expect_cause(verdict(r), "hang", 2, "stuck");
  // Every rank is gone now (the launcher ended them): the post-mortem reads
  // the launcher's record and names rank 2 stuck, not rank 0 crashed.
  const auto a = capture([&] { return call(ballast::hang::analyze_main, {"ballast analyze", dir, "--json"}); });
  CHECK(a.code == 1);
  const auto v = verdict(a);
  expect_cause(v, "hang", 2, "stuck");
  CHECK(v["launch"]["stopped_ranks"] == nlohmann::json::array({0, 1, 2}));
  const auto text = capture([&] { return call(ballast::hang::analyze_main, {"ballast analyze", dir}); });
  CHECK(text.out.find("ballast launch stopped this job") != std::string::npos);
}

TEST_CASE("a rank that skips a collective is named not_joined") {
  const auto r = launch(fresh_dir("skip"), {"--fault", "skip", "--fault-rank", "0", "--fault-iter", "100"});
  CHECK(r.code == 1);
  expect_cause(verdict(r), "hang", 0, "not_joined");
}

TEST_CASE("with 4 collectives in flight per iteration, a killed and a skipping rank are named") {
  // Each rank has collectives queued behind the running one (records in
  // state issued): the verdict must place it at the one it runs.
  const std::vector<std::string> four = {"--in-flight", "4"};
  auto with = [&](std::vector<std::string> fault) {
    fault.insert(fault.end(), four.begin(), four.end());
    return fault;
  };
  const std::string dir = fresh_dir("kill4");
  const auto killed = launch(dir, with({"--fault", "kill", "--fault-rank", "2", "--fault-iter", "50"}));
  CHECK(killed.code == 1);
  expect_cause(verdict(killed), "hang", 2, "crashed");
  // The Chrome trace: operations that waited in the queue say how long; the
  // ones that never ran (ended by the failure before their turn) are marks,
  // not spans from a start they never had.
  const auto a = capture([&] {
    return call(ballast::hang::analyze_main, {"ballast analyze", dir, "--chrome", dir + "/t.json"});
  });
  std::ifstream f(dir + "/t.json");
  const auto trace = nlohmann::json::parse(f);
  int queued = 0, never_ran = 0;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "M") continue;
    INFO(e.dump());
    CHECK(e["ts"].get<double>() > 1e15);  // microseconds since 1970, not since a tick of 0
    if (e["ph"] == "X" && e["args"].contains("queued_us")) ++queued;
    if (e["ph"] == "i") ++never_ran;
  }
  CHECK(queued > 50);
  CHECK(never_ran >= 1);
  const auto skipped = launch(fresh_dir("skip4"), with({"--fault", "skip", "--fault-rank", "1", "--fault-iter", "50"}));
  CHECK(skipped.code == 1);
  expect_cause(verdict(skipped), "hang", 1, "not_joined");
  CHECK(verdict(skipped)["seq"] == 4 * 300 - 3);  // the first of the last iteration's 4, which rank 1 never started
}

TEST_CASE("a rank in another collective is named mismatch") {
  const auto r = launch(fresh_dir("other"), {"--fault", "other", "--fault-rank", "1", "--fault-iter", "100"});
  CHECK(r.code == 1);
  expect_cause(verdict(r), "mismatch", 1, "mismatch");
}

// Ranks 1 and 3 of 4 call a broadcast at iteration 100 where ranks 0 and 2
// allreduce (comm_loop takes one --fault-rank: each rank's shell gives the
// fault to ranks 1 and 3 only). The first culprit to see the mismatch tells
// every rank; over tcp the other culprit is at times told while still in
// iteration 99, and then never calls the broadcast (up to a third of the
// runs): the rings cannot show it, so a run names exactly the culprits whose
// rings show the broadcast, and one of up to 8 runs must name both.
TEST_CASE("two ranks of 4 in another collective are both named mismatch") {
  const std::string script =
      "case $RANK in 1|3) set -- \"$@\" --fault other --fault-rank $RANK --fault-iter 100;; esac; exec \"$@\"";
  for (const char* tls : {"sm,self", "tcp"}) {
    INFO("UCX_TLS " << tls);
    bool both = false;
    for (int attempt = 0; attempt < 8 && !both; ++attempt) {
      const std::string dir = fresh_dir(std::string("other2-") + tls);
      setenv("UCX_TLS", tls, 1);
      const auto r = capture([&] {
        return call(ballast::hang::launch_main,
                    {"ballast launch", "-n",   "4",       "--trace-dir", dir,        "--stall", "1.5",
                     "--json",         "--",   "sh",      "-c",          script,     "sh",      kLoop,
                     "--bytes",        "4096", "--iters", "300",         "--warmup", "0",       "--timeout-ms",
                     "60000"});
      });
      CHECK(r.code == 1);
      const auto v = verdict(r);
      INFO(v.dump(2));
      CHECK(v["verdict"] == "mismatch");
      CHECK(v["seq"] == 101);
      std::set<int> named, shown;
      for (const auto& c : v["root_cause"]) {
        CHECK(c["kind"] == "mismatch");
        named.insert(c["rank"].get<int>());
      }
      std::vector<std::string> errors;
      for (const auto& ring : ballast::hang::read_dir(dir, &errors))
        for (const auto& s : ring.records)
          if (s.op == BALLAST_OP_BROADCAST) shown.insert(ring.header.rank);
      CHECK(!shown.empty());
      CHECK(named == shown);
      both = named == std::set<int>{1, 3};
      if (!both) MESSAGE("attempt " << attempt << " named " << v["root_cause"].dump());
    }
    CHECK(both);
  }
}

TEST_CASE("over tcp: a killed, a stopped, a skipping and a mismatched rank are each named") {
  const struct {
    const char* fault;
    const char* rank;
    const char* verdict;
    const char* kind;
  } cases[] = {{"kill", "1", "hang", "crashed"},
               {"stop", "2", "hang", "stuck"},
               {"skip", "0", "hang", "not_joined"},
               {"other", "1", "mismatch", "mismatch"}};
  for (const auto& c : cases) {
    INFO("fault " << c.fault);
    const auto r = launch(fresh_dir(std::string("tcp-") + c.fault),
                          {"--fault", c.fault, "--fault-rank", c.rank, "--fault-iter", "100"}, "4096", "tcp");
    CHECK(r.code == 1);
    expect_cause(verdict(r), c.verdict, std::atoi(c.rank), c.kind);
  }
}

// The root of a broadcast is done once its eager sends are out: rank 0 has
// moved on to the next allreduce while the others failed on its broadcast,
// so the last records alone show ranks 1 and 2 behind it (seen by bench/hang
// as "not_joined"). The verdict must still be the mismatch, at its seq.
TEST_CASE("the root of a broadcast among allreduces is named mismatch, though it moved on") {
  for (int rep = 0; rep < 3; ++rep) {
    const auto r = launch(fresh_dir("other-root"), {"--fault", "other", "--fault-rank", "0", "--fault-iter", "100"});
    CHECK(r.code == 1);
    const auto v = verdict(r);
    expect_cause(v, "mismatch", 0, "mismatch");
    CHECK(v["root_cause"].size() == 1);
    CHECK(v["seq"] == 101);  // iteration 100 is the 101st collective (seqs count from 1)
  }
}

TEST_CASE("a rank that enters every collective late is named slow by analyze") {
  const std::string dir = fresh_dir("slow");
  setenv("UCX_TLS", "sm,self", 1);
  const auto l = capture([&] {
    return call(ballast::hang::launch_main,
                {"ballast launch", "-n", "3", "--trace-dir", dir, "--", kLoop, "--iters", "20", "--warmup", "0",
                 "--fault", "slow", "--fault-rank", "2", "--fault-iter", "5"});
  });
  INFO("launch stdout: " << l.out << "\nlaunch stderr: " << l.err);
  REQUIRE(l.code == 0);
  const auto a = capture([&] {
    return call(ballast::hang::analyze_main, {"ballast analyze", dir, "--json", "--slow-ms", "20"});
  });
  CHECK(a.code == 1);
  expect_cause(verdict(a), "slow", 2, "slow");
}

TEST_CASE("a healthy job: launch exits 0, analyze says healthy and exports a Chrome trace") {
  const std::string dir = fresh_dir("ok");
  setenv("UCX_TLS", "sm,self", 1);
  const auto l = capture([&] {
    return call(ballast::hang::launch_main,
                {"ballast launch", "-n", "2", "--trace-dir", dir, "--", kLoop, "--iters", "50", "--check"});
  });
  INFO("launch stdout: " << l.out << "\nlaunch stderr: " << l.err);
  CHECK(l.code == 0);
  // Its MASTER_PORT is outside the range the kernel gives connections their
  // source ports from, so that none can take it before rank 0 listens.
  std::smatch m;
  REQUIRE(std::regex_search(l.err, m, std::regex("MASTER_PORT ([0-9]+)")));
  int lo = 0, hi = 0;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> lo >> hi;
  const int port = std::stoi(m[1]);
  CHECK((port < lo || port > hi));
  std::set<std::string> rings;  // the comm-ucx plugin names its ring rank-R.PID.ucx.btrace
  for (const auto& e : fs::directory_iterator(dir)) rings.insert(e.path().filename().string());
  REQUIRE(rings.size() == 2);
  for (const auto& name : rings)
    CHECK_MESSAGE(std::regex_match(name, std::regex("rank-[01]\\.[0-9]+\\.ucx\\.btrace")), name);
  const auto a = capture([&] {
    return call(ballast::hang::analyze_main, {"ballast analyze", dir, "--json", "--chrome", dir + "/trace.json"});
  });
  CHECK(a.code == 0);
  CHECK(verdict(a)["verdict"] == "healthy");
  std::ifstream f(dir + "/trace.json");
  const auto trace = nlohmann::json::parse(f);
  size_t ops = 0;
  std::set<std::pair<int, int>> threads;             // (pid, tid) of the operations
  std::map<std::pair<int, int>, std::string> names;  // (pid, tid) -> name; tid -1 for the process
  for (const auto& e : trace["traceEvents"]) {
    INFO(e.dump());
    // The trace event format's pid and tid are integers.
    REQUIRE(e["pid"].is_number_integer());
    if (e["ph"] == "X") {
      REQUIRE(e["tid"].is_number_integer());
      ++ops;
      threads.insert({e["pid"].get<int>(), e["tid"].get<int>()});
    } else if (e["ph"] == "M" && e["name"] == "process_name") {
      names[{e["pid"].get<int>(), -1}] = e["args"]["name"];
    } else if (e["ph"] == "M" && e["name"] == "thread_name") {
      REQUIRE(e["tid"].is_number_integer());
      names[{e["pid"].get<int>(), e["tid"].get<int>()}] = e["args"]["name"];
    }
  }
  CHECK(ops == 2 * (50 + 10));  // two ranks, 10 warm-up iterations + 50
  // One communicator, the same thread in both ranks, each named.
  CHECK(threads == std::set<std::pair<int, int>>{{0, 1}, {1, 1}});
  for (int rank : {0, 1}) {
    CHECK(names[{rank, -1}].rfind("rank " + std::to_string(rank) + " (pid ", 0) == 0);
    const std::string& thread = names[{rank, 1}];
    CHECK(
        std::regex_match(thread, std::regex("communicator [0-9a-f]{16} \\(rank " + std::to_string(rank) + " of 2\\)")));
  }
  CHECK(names[{0, 1}].substr(0, 29) == names[{1, 1}].substr(0, 29));  // "communicator " and the same id
}

TEST_CASE("SIGINT to ballast launch stops its comm_loop ranks and exits 130") {
  const std::string dir = fresh_dir("sigint");
  setenv("UCX_TLS", "sm,self", 1);
  Launcher l(dir, {"-n", "2", "--trace-dir", dir, "--", kLoop, "--iters", "1000000000", "--warmup", "0"});
  // Each rank's pid is in its ring once it runs collectives.
  REQUIRE(eventually(60, [&] {
    std::vector<std::string> errors;
    l.ranks.clear();
    for (const auto& r : ballast::hang::read_dir(dir, &errors))
      if (!r.records.empty()) l.ranks.push_back(r.header.pid);
    return l.ranks.size() == 2;
  }));
  REQUIRE(kill(l.pid, SIGINT) == 0);
  const int code = l.wait(15);
  INFO(l.err());
  CHECK(code == 130);
  CHECK(l.err().find("interrupted by SIGINT") != std::string::npos);
  for (pid_t p : l.ranks) CHECK(gone(p));
}

// Two ranks each of a shell and its child `sleep`; what ignores SIGTERM is
// killed after the grace period: the whole rank (SIGTERM case) or only the
// child, which outlives its rank (SIGHUP case).
TEST_CASE("SIGTERM and SIGHUP to ballast launch stop ranks and their children, even those that ignore SIGTERM") {
  const struct {
    int sig;
    const char* script;
  } cases[] = {{SIGTERM, "trap '' TERM; sleep 60 & echo $$ $! > \"$BALLAST_TRACE_DIR/pids.$RANK\"; wait"},
               {SIGHUP, "(trap '' TERM; exec sleep 60) & echo $$ $! > \"$BALLAST_TRACE_DIR/pids.$RANK\"; wait"}};
  for (const auto& c : cases) {
    INFO("signal " << c.sig);
    const std::string dir = fresh_dir("sig" + std::to_string(c.sig));
    Launcher l(dir, {"-n", "2", "--trace-dir", dir, "--", "sh", "-c", c.script});
    REQUIRE(eventually(30, [&] { return sleeping_ranks(2, &l); }));
    REQUIRE(kill(l.pid, c.sig) == 0);
    const int code = l.wait(15);
    INFO(l.err());
    CHECK(code == 128 + c.sig);
    CHECK(l.err().find(std::string("interrupted by SIG") + sigabbrev_np(c.sig)) != std::string::npos);
    for (pid_t p : l.ranks) CHECK(gone(p));
  }
}

// Ranks that ignore SIGTERM hold the launcher for its 3 s grace; a second
// SIGINT (Ctrl-C again) ends the wait: SIGKILL at once.
TEST_CASE("a second SIGINT to ballast launch kills the ranks without waiting out the grace") {
  const std::string dir = fresh_dir("sigint2");
  Launcher l(dir, {"-n", "2", "--trace-dir", dir, "--", "sh", "-c",
                   "trap '' TERM; sleep 60 & echo $$ $! > \"$BALLAST_TRACE_DIR/pids.$RANK\"; wait"});
  REQUIRE(eventually(30, [&] { return sleeping_ranks(2, &l); }));
  REQUIRE(kill(l.pid, SIGINT) == 0);
  // The second only once the first has been taken (two pending are one).
  REQUIRE(eventually(30, [&] { return l.err().find("interrupted by SIGINT") != std::string::npos; }));
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(kill(l.pid, SIGINT) == 0);
  const int code = l.wait(15);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(l.err());
  CHECK(code == 128 + SIGINT);
  CHECK(took < 2.5);  // the grace alone is 3 s
  CHECK(l.err().find("during the stop: killing the ranks now") != std::string::npos);
  for (pid_t p : l.ranks) CHECK(gone(p));
}

// Nothing can be handled in the launcher itself: the kernel ends the ranks
// (PR_SET_PDEATHSIG), not their children, which a real job's ranks reap.
TEST_CASE("SIGKILL to ballast launch: its ranks end too") {
  const std::string dir = fresh_dir("sigkill");
  Launcher l(dir, {"-n", "2", "--trace-dir", dir, "--", "sh", "-c",
                   "echo $$ > \"$BALLAST_TRACE_DIR/pids.$RANK\"; exec sleep 60"});
  REQUIRE(eventually(30, [&] { return sleeping_ranks(2, &l); }));
  REQUIRE(kill(l.pid, SIGKILL) == 0);
  CHECK(l.wait(15) == 128 + SIGKILL);
  for (pid_t p : l.ranks) CHECK(eventually(10, [&] { return gone(p); }));
}

TEST_CASE("bad input: a missing folder, a corrupt ring, a missing command") {
  auto a = capture([] { return call(ballast::hang::analyze_main, {"ballast analyze", "/nonexistent/dir"}); });
  CHECK(a.code == 1);
  CHECK(a.err.find("/nonexistent/dir") != std::string::npos);
  const std::string dir = fresh_dir("corrupt");
  std::ofstream(dir + "/rank-0.1.btrace") << std::string(300, 'x');
  a = capture([&] { return call(ballast::hang::analyze_main, {"ballast analyze", dir}); });
  CHECK(a.code == 1);
  CHECK(a.err.find("rank-0.1.btrace: field magic") != std::string::npos);
  a = capture([] { return call(ballast::hang::launch_main, {"ballast launch", "-n", "2"}); });
  CHECK(a.code == 2);
  CHECK(a.err.find("missing the command") != std::string::npos);
}

TEST_CASE("a rank that fails outside any collective: launch names it and says the traces show no hang") {
  const std::string dir = fresh_dir("no-collective");
  const auto r = capture([&] {
    return call(ballast::hang::launch_main, {"ballast launch", "-n", "2", "--trace-dir", dir, "--", "sh", "-c",
                                             "if [ \"$RANK\" = 1 ]; then exit 3; fi; sleep 30"});
  });
  INFO(r.err);
  CHECK(r.code == 1);
  CHECK(r.err.find("rank 1 (pid") != std::string::npos);
  CHECK(r.err.find("exited with code 3") != std::string::npos);
  CHECK(r.err.find("verdict: healthy") != std::string::npos);
  CHECK(r.err.find("no trace ring in " + dir + ": no rank ran a collective") != std::string::npos);
  // A ring it cannot read is named, not passed over.
  std::ofstream(dir + "/rank-0.1.ucx.btrace") << std::string(300, 'x');
  const auto bad = capture([&] {
    return call(ballast::hang::launch_main,
                {"ballast launch", "-n", "1", "--trace-dir", dir, "--", "sh", "-c", "exit 4"});
  });
  INFO(bad.err);
  CHECK(bad.code == 1);
  CHECK(bad.err.find("warning: " + dir + "/rank-0.1.ucx.btrace: field magic") != std::string::npos);
}

TEST_CASE("end to end: the real `ballast launch` and `ballast analyze` name a killed rank") {
  require_ballast();
  const std::string dir = fresh_dir("e2e");
  const std::string cmd = std::string("UCX_TLS=sm,self ") + BALLAST_EXE + " launch -n 2 --trace-dir " + dir +
                          " --json -- " + kLoop + " --iters 300 --fault exit --fault-rank 1 --fault-iter 20" + " > " +
                          dir + "/launch.out 2> " + dir + "/launch.err";
  const int st = std::system(cmd.c_str());
  CHECK(WEXITSTATUS(st) == 1);
  std::stringstream err;
  err << std::ifstream(dir + "/launch.err").rdbuf();
  CHECK(err.str().find("rank 1 (pid") != std::string::npos);
  CHECK(err.str().find("exited with code 3") != std::string::npos);
  const auto a = capture(
      [&] { return std::system((std::string(BALLAST_EXE) + " analyze " + dir + " --json").c_str()) == 0 ? 0 : 1; });
  CHECK(a.code == 1);
  expect_cause(verdict(a), "hang", 1, "crashed");
}

namespace {

// A ring of `rank` (of 4) holding one record per call, seqs from `first`.
ballast::hang::RankRing ring_of(int rank, uint64_t first, const std::vector<uint32_t>& ops, uint32_t last_state) {
  ballast::hang::RankRing r;
  r.header.rank = rank;
  r.header.pid = 1000 + rank;
  r.header.ns_per_tick = 1;
  r.state = ballast::hang::ProcState::alive;
  for (size_t i = 0; i < ops.size(); ++i) {
    ballast_trace_slot s{};
    s.comm_id = 0xc0;
    s.seq = first + i;
    s.op = ops[i];
    s.dtype = BALLAST_DT_F32;
    s.count = 16384;
    s.rank = s.world_rank = rank;
    s.nranks = 4;
    s.peer = ops[i] == BALLAST_OP_BROADCAST ? 0 : -1;
    s.start_tick = 1000 * (i + 1);
    s.end_tick = s.start_tick + 10;
    s.state = i + 1 == ops.size() ? last_state : BALLAST_TRACE_DONE;
    r.records.push_back(s);
  }
  return r;
}

}  // namespace

// Ranks 0-2 run seq 11 with seqs 12 and 13 queued behind it (issued, not
// started: a trainer starts several collectives at once), or failed in seq
// 11 and so ended 12 and 13 unstarted; rank 3 finished seq 10 and never
// started another. The hang is at seq 11, not 13.
TEST_CASE("collectives queued behind the running one do not count as where a rank is") {
  constexpr uint32_t AR = BALLAST_OP_ALLREDUCE;
  for (const uint32_t state : {BALLAST_TRACE_STARTED, BALLAST_TRACE_FAILED}) {
    const bool running = state == BALLAST_TRACE_STARTED;
    INFO((running ? "running seq 11" : "failed in seq 11"));
    std::vector<ballast::hang::RankRing> rings;
    for (int rank = 0; rank < 3; ++rank) {
      auto r = ring_of(rank, 10, {AR, AR, AR, AR}, BALLAST_TRACE_ISSUED);
      r.records[1].state = state;
      if (running) r.records[1].end_tick = 0;
      for (size_t i : {2, 3}) {
        r.records[i].state = running ? BALLAST_TRACE_ISSUED : BALLAST_TRACE_FAILED;
        r.records[i].issue_tick = r.records[i].start_tick;
        r.records[i].start_tick = 0;
        r.records[i].end_tick = running ? 0 : r.records[1].end_tick;
      }
      rings.push_back(r);
    }
    rings.push_back(ring_of(3, 10, {AR}, BALLAST_TRACE_DONE));
    const auto v = ballast::hang::analyze(rings, {});
    INFO(v.to_text());
    CHECK(v.verdict == "hang");
    CHECK(v.seq == 11);
    REQUIRE(v.causes.size() == 1);
    CHECK(v.causes[0].rank == 3);
    CHECK(v.causes[0].kind == "not_joined");
  }
}

// Rank 0 broadcast at seq 12 and moved on; rank 2 failed on it; ranks 1 and 3
// were told of the failure while still in seq 11. At seq 12 one rank stands
// against one: the call all ranks made at seq 11 tells which is the job's.
TEST_CASE("a mismatch between two lone ranks names the one that left the job's pattern") {
  constexpr uint32_t AR = BALLAST_OP_ALLREDUCE, BC = BALLAST_OP_BROADCAST;
  for (const bool swap : {false, true}) {  // the culprit with the lower and with the higher rank
    const int odd = swap ? 2 : 0, even = swap ? 0 : 2;
    std::vector<ballast::hang::RankRing> rings = {
        ring_of(odd, 10, {AR, AR, BC, AR}, BALLAST_TRACE_STARTED),
        ring_of(1, 10, {AR, AR}, BALLAST_TRACE_FAILED),
        ring_of(even, 10, {AR, AR, AR}, BALLAST_TRACE_FAILED),
        ring_of(3, 10, {AR, AR}, BALLAST_TRACE_FAILED),
    };
    const auto v = ballast::hang::analyze(rings, {});
    INFO(v.to_text());
    CHECK(v.verdict == "mismatch");
    CHECK(v.seq == 12);
    REQUIRE(v.causes.size() == 1);
    CHECK(v.causes[0].rank == odd);
    CHECK(v.causes[0].kind == "mismatch");
  }
}

// Ranks 1 and 3 of 4 broadcast at seq 12 where the job allreduces; rank 2
// was told of the failure while still in seq 11. Two broadcasts stand
// against one allreduce, yet the broadcasting ranks are the culprits: no
// group holds most of the 4 ranks, and all 4 allreduced at seq 11.
TEST_CASE("two ranks in another collective are named though the ranks left at that seq are fewer") {
  constexpr uint32_t AR = BALLAST_OP_ALLREDUCE, BC = BALLAST_OP_BROADCAST;
  const std::vector<ballast::hang::RankRing> rings = {
      ring_of(0, 10, {AR, AR, AR}, BALLAST_TRACE_FAILED),
      ring_of(1, 10, {AR, AR, BC}, BALLAST_TRACE_FAILED),
      ring_of(2, 10, {AR, AR}, BALLAST_TRACE_FAILED),
      ring_of(3, 10, {AR, AR, BC}, BALLAST_TRACE_FAILED),
  };
  const auto v = ballast::hang::analyze(rings, {});
  INFO(v.to_text());
  CHECK(v.verdict == "mismatch");
  CHECK(v.seq == 12);
  REQUIRE(v.causes.size() == 2);
  CHECK(v.causes[0].rank == 1);
  CHECK(v.causes[1].rank == 3);
  for (const auto& c : v.causes) CHECK(c.kind == "mismatch");
}

// All four ranks are in seq 12, alive. Rank 2's progress stopped first and
// it waits for rank 1, which still sends to it: the link 1 -> 2 is named.
// When rank 1 is not sending to rank 2 (its own send to rank 3 is what is
// left), rank 2 alone is named.
TEST_CASE("everyone in the operation: the rank whose progress stopped first, and the link it waits on") {
  constexpr uint32_t AR = BALLAST_OP_ALLREDUCE;
  for (const bool link : {true, false}) {
    INFO("link " << link);
    std::vector<ballast::hang::RankRing> rings;
    for (int r = 0; r < 4; ++r) {
      rings.push_back(ring_of(r, 10, {AR, AR, AR}, BALLAST_TRACE_STARTED));
      ballast_trace_slot& s = rings.back().records.back();
      s.progress_tick = s.start_tick + (r == 2 ? 100 : 500);
      s.end_tick = 0;
      s.wait_peer = (r + 3) % 4;  // a ring: data comes from the previous rank
      s.send_peer = -1;
    }
    rings[1].records.back().send_peer = link ? 2 : 3;
    const auto v = ballast::hang::analyze(rings, {});
    INFO(v.to_text());
    CHECK(v.verdict == "hang");
    REQUIRE(v.causes.size() == 1);
    CHECK(v.causes[0].rank == 2);
    CHECK(v.causes[0].kind == "slow");
    CHECK(v.causes[0].peer == (link ? 1 : -1));
    const auto j = nlohmann::json::parse(v.to_json());
    CHECK(j["root_cause"][0].contains("link") == link);
    if (link) CHECK(j["root_cause"][0]["link"] == nlohmann::json::array({1, 2}));
  }
}

// Ranks 2 and 3 never joined seq 12: rank 2's process spins outside any
// collective, rank 3's sleeps. Both are not_joined; the evidence tells the
// busy one from the sleeping one by their CPU time.
TEST_CASE("the evidence of a live rank that did not join says whether its process is busy or sleeping") {
  constexpr uint32_t AR = BALLAST_OP_ALLREDUCE;
  struct Child {
    pid_t pid;
    ~Child() {
      if (pid <= 0) return;  // kill(-1) would reach every process
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  };
  std::fflush(stdout);
  std::fflush(stderr);
  const Child spinner{fork()};
  if (spinner.pid == 0) {
    volatile unsigned long x = 0;
    for (;;) x = x + 1;
  }
  const Child sleeper{fork()};
  if (sleeper.pid == 0)
    for (;;) pause();
  REQUIRE(spinner.pid > 0);
  REQUIRE(sleeper.pid > 0);
  std::vector<ballast::hang::RankRing> rings = {
      ring_of(0, 10, {AR, AR, AR}, BALLAST_TRACE_STARTED),
      ring_of(1, 10, {AR, AR, AR}, BALLAST_TRACE_STARTED),
      ring_of(2, 10, {AR, AR}, BALLAST_TRACE_DONE),
      ring_of(3, 10, {AR, AR}, BALLAST_TRACE_DONE),
  };
  rings[2].header.pid = spinner.pid;
  rings[3].header.pid = sleeper.pid;
  for (auto& r : rings) gethostname(r.header.host, sizeof r.header.host - 1);
  const auto v = ballast::hang::analyze(rings, {});
  INFO(v.to_text());
  CHECK(v.verdict == "hang");
  REQUIRE(v.causes.size() == 2);
  CHECK(v.causes[0].rank == 2);
  CHECK(v.causes[0].kind == "not_joined");
  CHECK(v.causes[0].evidence.find(" is busy (") != std::string::npos);
  CHECK(v.causes[1].rank == 3);
  CHECK(v.causes[1].kind == "not_joined");
  CHECK(v.causes[1].evidence.find(" is sleeping (") != std::string::npos);
}

// Rank 3 exited after seq 11; rank 1 failed in seq 11 when its link to it
// broke, and rank 2 still waits there for data rank 3 sent before it died,
// while rank 0 waits in seq 12. Only rank 3 is the cause: the other two lag
// because of it.
TEST_CASE("ranks held up by another's crash before they joined are not named beside it") {
  constexpr uint32_t AR = BALLAST_OP_ALLREDUCE;
  std::vector<ballast::hang::RankRing> rings = {
      ring_of(0, 10, {AR, AR, AR}, BALLAST_TRACE_STARTED),
      ring_of(1, 10, {AR, AR}, BALLAST_TRACE_FAILED),
      ring_of(2, 10, {AR, AR}, BALLAST_TRACE_STARTED),
      ring_of(3, 10, {AR, AR}, BALLAST_TRACE_DONE),
  };
  rings[3].state = ballast::hang::ProcState::gone;
  auto v = ballast::hang::analyze(rings, {});
  INFO(v.to_text());
  CHECK(v.verdict == "hang");
  REQUIRE(v.causes.size() == 1);
  CHECK(v.causes[0].rank == 3);
  CHECK(v.causes[0].kind == "crashed");

  // With no other cause, the ranks held up in seq 11 are still named.
  rings.pop_back();
  v = ballast::hang::analyze(rings, {});
  INFO(v.to_text());
  CHECK(v.causes.size() == 2);
}
