// Heartbeat files (the progress of ranks without trace rings) as the hang
// detector reads them, the verdict from them and from real processes'
// states, their Python-less stacks refusal, and the launcher's record.
#include <doctest/doctest.h>

#include <heartbeat.hpp>
#include <launch_record.hpp>

#include <ballast/host.h>

#include "../../comm/ucx/scratch_dir.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>

namespace fs = std::filesystem;
using namespace ballast::hang;

namespace {

std::string fresh_dir(const std::string& name) {
  const std::string d = test::scratch() / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

int64_t wall_now() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

std::string host_name() {
  char me[256] = {0};
  gethostname(me, sizeof me - 1);
  return me;
}

struct Beat {
  int rank = 0, world = 3;
  int pid = 0;
  uint64_t beat = 10;
  int64_t step = 5;
  std::string phase = "-";
  bool comm = false;
  int64_t ago_ns = 0;
  std::string state = "running";
  int stack_signal = 0;
};

// The line a writer makes (the format of python/ballast/heartbeat.py).
std::string line_of(const Beat& b) {
  const std::string text = "ballast-heartbeat=1 rank=" + std::to_string(b.rank) + " world=" + std::to_string(b.world) +
                           " pid=" + std::to_string(b.pid) + " host=" + host_name() +
                           " beat=" + std::to_string(b.beat) + " step=" + std::to_string(b.step) + " phase=" + b.phase +
                           " comm=" + (b.comm ? "1" : "0") + " wall_ns=" + std::to_string(wall_now() - b.ago_ns) +
                           " stack_signal=" + std::to_string(b.stack_signal) + " state=" + b.state;
  char sum[16];
  std::snprintf(sum, sizeof sum, " sum=%08x", fnv1a32(text.data(), text.size()));
  std::string line = text + sum;
  line.resize(kHeartbeatSize - 1, ' ');
  return line + "\n";
}

void write_beat(const std::string& dir, const Beat& b) {
  std::ofstream f(dir + "/rank-" + std::to_string(b.rank) + "." + std::to_string(b.pid) + ".heartbeat",
                  std::ios::binary | std::ios::trunc);
  f << line_of(b);
}

// A child process that sleeps until killed; reaped by ~Child.
struct Child {
  pid_t pid = fork();
  Child() {
    if (pid == 0) {
      for (;;) pause();
    }
  }
  ~Child() {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
};

pid_t ended_pid() {
  const pid_t pid = fork();
  if (pid == 0) _exit(0);
  waitpid(pid, nullptr, 0);
  return pid;
}

}  // namespace

TEST_CASE("a heartbeat line is parsed; a torn or foreign one is refused naming the field") {
  Beat b;
  b.pid = int(getpid());
  b.phase = "separate-grads-all-reduce";
  b.comm = true;
  Heartbeat h;
  std::string err;
  REQUIRE_MESSAGE(parse_heartbeat(line_of(b), &h, &err), err);
  CHECK(h.rank == 0);
  CHECK(h.world == 3);
  CHECK(h.beat == 10);
  CHECK(h.step == 5);
  CHECK(h.phase == "separate-grads-all-reduce");
  CHECK(h.comm);
  CHECK(h.state == ProcState::alive);
  CHECK_FALSE(h.done);

  std::string torn = line_of(b);
  torn[40] = torn[40] == '1' ? '2' : '1';  // half of an update: the sum no longer matches
  CHECK_FALSE(parse_heartbeat(torn, &h, &err));
  CHECK(err.find("sum") != std::string::npos);
  CHECK_FALSE(parse_heartbeat("ballast-heartbeat=1\n", &h, &err));
  CHECK(err.find("bytes") != std::string::npos);
  b.state = "asleep";
  CHECK_FALSE(parse_heartbeat(line_of(b), &h, &err));
  CHECK(err == "field state is 'asleep'");
}

TEST_CASE("read_heartbeats keeps each rank's newest process and names unreadable files") {
  const std::string dir = fresh_dir("hb-read");
  Beat old;
  old.pid = 100;
  old.ago_ns = 60'000'000'000;
  write_beat(dir, old);
  Beat now;
  now.pid = 200;
  now.step = 9;
  write_beat(dir, now);
  std::ofstream(dir + "/rank-1.300.heartbeat") << "not a heartbeat";
  std::vector<std::string> errors;
  const auto beats = read_heartbeats(dir, &errors);
  REQUIRE(beats.size() == 1);
  CHECK(beats[0].pid == 200);
  CHECK(beats[0].step == 9);
  REQUIRE(errors.size() == 1);
  CHECK(errors[0].find("rank-1.300.heartbeat") != std::string::npos);
}

TEST_CASE("the verdict from heartbeats names the rank that stopped making progress") {
  Child a, b, c;
  auto beats_of = [&](std::vector<Beat> bs) {
    const std::string dir = fresh_dir("hb-verdict");
    for (const auto& x : bs) write_beat(dir, x);
    std::vector<std::string> errors;
    auto out = read_heartbeats(dir, &errors);
    REQUIRE(errors.empty());
    return out;
  };
  auto in_comm = [](int rank, pid_t pid, int64_t step) {
    Beat x;
    x.rank = rank;
    x.pid = int(pid);
    x.step = step;
    x.phase = "separate-grads-all-reduce";
    x.comm = true;
    return x;
  };
  SUBCASE("a rank outside the collective the others wait in: not_joined, and what it does") {
    Beat r2 = in_comm(2, c.pid, 40);
    r2.phase = "forward-compute";
    r2.comm = false;
    const auto v = analyze_heartbeats(beats_of({in_comm(0, a.pid, 40), in_comm(1, b.pid, 40), r2}));
    INFO(v.to_text());
    REQUIRE(v.causes.size() == 1);
    CHECK(v.causes[0].rank == 2);
    CHECK(v.causes[0].kind == "not_joined");
    CHECK(v.causes[0].evidence.find("sleeping (") != std::string::npos);
    CHECK(v.causes[0].evidence.find("forward-compute") != std::string::npos);
    CHECK(v.op == "separate-grads-all-reduce");
  }
  SUBCASE("a rank behind the others' step") {
    const auto v = analyze_heartbeats(beats_of({in_comm(0, a.pid, 41), in_comm(1, b.pid, 40), in_comm(2, c.pid, 41)}));
    REQUIRE(v.causes.size() == 1);
    CHECK(v.causes[0].rank == 1);
    CHECK(v.causes[0].evidence.find("behind step 41") != std::string::npos);
  }
  SUBCASE("a stopped process: stuck, before any other reason") {
    kill(b.pid, SIGSTOP);
    for (int i = 0; i < 6000 && probe(b.pid, host_name().c_str()) != ProcState::stopped; ++i) usleep(5000);
    Beat r2 = in_comm(2, c.pid, 40);
    r2.comm = false;
    const auto v = analyze_heartbeats(beats_of({in_comm(0, a.pid, 40), in_comm(1, b.pid, 40), r2}));
    REQUIRE(v.causes.size() == 1);
    CHECK(v.causes[0].rank == 1);
    CHECK(v.causes[0].kind == "stuck");
    kill(b.pid, SIGCONT);
  }
  SUBCASE("the launcher's record of a state wins over the process now") {
    const auto v = analyze_heartbeats(beats_of({in_comm(0, a.pid, 40), in_comm(1, b.pid, 40), in_comm(2, c.pid, 40)}),
                                      {{2, ProcState::stopped}});
    REQUIRE(v.causes.size() == 1);
    CHECK(v.causes[0].rank == 2);
    CHECK(v.causes[0].kind == "stuck");
  }
  SUBCASE("of several gone, the one killed outside the collective, not those that failed in it") {
    const pid_t g1 = ended_pid(), g2 = ended_pid(), g3 = ended_pid();
    Beat killed = in_comm(1, g2, 40);
    killed.comm = false;
    killed.phase = "-";
    Beat f0 = in_comm(0, g1, 41), f2 = in_comm(2, g3, 41);
    f0.state = f2.state = "failed";
    const auto v = analyze_heartbeats(beats_of({f0, killed, f2}));
    INFO(v.to_text());
    REQUIRE(v.causes.size() == 1);
    CHECK(v.causes[0].rank == 1);
    CHECK(v.causes[0].kind == "crashed");
  }
  SUBCASE("a rank that failed on its own error, while the others wait for it") {
    Beat f = in_comm(1, ended_pid(), 40);
    f.comm = false;
    f.phase = "forward-compute";
    f.state = "failed";
    const auto v = analyze_heartbeats(beats_of({in_comm(0, a.pid, 40), f, in_comm(2, c.pid, 40)}));
    REQUIRE(v.causes.size() == 1);
    CHECK(v.causes[0].rank == 1);
    CHECK(v.causes[0].kind == "failed");
  }
  SUBCASE("everyone in the collective: the rank whose last beat is oldest") {
    Beat r1 = in_comm(1, b.pid, 40);
    r1.ago_ns = 2'000'000'000;
    const auto v = analyze_heartbeats(beats_of({in_comm(0, a.pid, 40), r1, in_comm(2, c.pid, 40)}));
    REQUIRE(v.causes.size() == 1);
    CHECK(v.causes[0].rank == 1);
    CHECK(v.causes[0].kind == "slow");
  }
}

TEST_CASE("progress: the signature moves with every beat; a job runs once a rank beat and until all are done") {
  std::vector<Heartbeat> beats(2);
  beats[0].pid = beats[1].pid = 1;
  CHECK_FALSE(heartbeats_running(beats));  // none began
  beats[0].beat = 1;
  CHECK(heartbeats_running(beats));
  const uint64_t s = heartbeat_signature(beats);
  beats[1].beat = 1;
  CHECK(heartbeat_signature(beats) != s);
  beats[0].done = beats[1].done = true;
  CHECK_FALSE(heartbeats_running(beats));
}

TEST_CASE("stacks: none asked of processes without a stack signal, stopped or gone, each said why") {
  const std::string dir = fresh_dir("hb-stacks");
  Child stopped;
  kill(stopped.pid, SIGSTOP);
  for (int i = 0; i < 6000 && probe(stopped.pid, host_name().c_str()) != ProcState::stopped; ++i) usleep(5000);
  Child plain;
  std::vector<Heartbeat> beats(3);
  beats[0].rank = 0;
  beats[0].pid = int(plain.pid);
  beats[0].state = ProcState::alive;  // no stack signal: never sent one, which would end it
  beats[1].rank = 1;
  beats[1].pid = int(stopped.pid);
  beats[1].state = ProcState::stopped;
  beats[1].stack_signal = SIGUSR2;
  beats[2].rank = 2;
  beats[2].pid = ended_pid();
  beats[2].state = ProcState::gone;
  const auto stacks = collect_stacks(dir, beats, 200);
  CHECK(stacks.at(0).find("no stack signal") != std::string::npos);
  CHECK(stacks.at(1).find("stopped") != std::string::npos);
  CHECK(stacks.at(2).find("gone") != std::string::npos);
  CHECK(kill(plain.pid, 0) == 0);  // still alive
  kill(stopped.pid, SIGCONT);
}

TEST_CASE("the launcher's record: written, read back, its states used; a bad one named") {
  const std::string dir = fresh_dir("launch-record");
  LaunchRecord none;
  std::string err;
  CHECK_FALSE(read_launch_record(dir, &none, &err));
  CHECK(err.empty());
  LaunchRecord rec;
  rec.reason = "the job hangs: no heartbeat for 3 s";
  rec.verdict_ns = wall_now();
  rec.verdict_json = R"({"verdict":"hang","root_cause":[{"rank":2,"kind":"stuck","evidence":"x"}]})";
  rec.ranks = {{0, 10, ProcState::alive, "", true},
               {2, 12, ProcState::stopped, "", true},
               {1, 11, ProcState::gone, "signal 9 (Killed)", false}};
  REQUIRE_MESSAGE(write_launch_record(dir, rec, &err), err);
  LaunchRecord back;
  REQUIRE_MESSAGE(read_launch_record(dir, &back, &err), err);
  CHECK(back.reason == rec.reason);
  CHECK(back.ranks.size() == 3);
  const auto states = states_at_verdict(back);
  CHECK(states.size() == 2);  // rank 1 ended on its own: its state is its own
  CHECK(states.at(2) == ProcState::stopped);
  const std::string text = launch_summary(back);
  CHECK(text.find("ended rank(s) 0,2 itself") != std::string::npos);
  CHECK(text.find("hang (rank 2 stuck)") != std::string::npos);
  std::ofstream(dir + "/launch.json") << R"({"reason": "x", "failed_rank": "two"})";
  CHECK_FALSE(read_launch_record(dir, &back, &err));
  CHECK(err.find("launch.json") != std::string::npos);
}

namespace {

struct Seen {
  std::mutex mu;
  std::vector<std::string> kinds, metrics, evidence;
  std::vector<int> ranks;
};

int on_fault(void* user, const ballast_event* e) {
  auto* seen = static_cast<Seen*>(user);
  const auto* f = static_cast<const ballast_fault_report*>(e->payload);
  std::lock_guard<std::mutex> lock(seen->mu);
  seen->kinds.push_back(f->kind);
  seen->metrics.push_back(f->metric ? f->metric : "");
  seen->evidence.push_back(f->evidence ? f->evidence : "");
  seen->ranks.push_back(f->rank);
  return 0;
}

}  // namespace

TEST_CASE("the plugin, with no ring in its folder, watches heartbeats and names the stuck rank once") {
  const std::string dir = fresh_dir("hb-plugin");
  Child a, b;
  kill(b.pid, SIGSTOP);
  Beat r0;
  r0.pid = int(a.pid);
  r0.phase = "separate-grads-all-reduce";
  r0.comm = true;
  Beat r1 = r0;
  r1.rank = 1;
  r1.pid = int(b.pid);
  write_beat(dir, r0);
  write_beat(dir, r1);
  ballast_host* host = nullptr;
  REQUIRE(ballast_host_create("test", &host) == BALLAST_OK);
  const std::string config = "{ trace_dir = '" + dir + "', stall_seconds = 0.3, period_seconds = 0.05 }";
  REQUIRE_MESSAGE(ballast_host_load_plugin(host, (std::string(BALLAST_PLUGIN_DIR) + "/ballast-hang.so").c_str(),
                                           config.c_str()) == BALLAST_OK,
                  ballast_last_error());
  Seen seen;
  uint64_t sub = 0;
  REQUIRE(ballast_host_subscribe(host, "fault.confirmed", nullptr, on_fault, &seen, &sub) == BALLAST_OK);
  REQUIRE(ballast_host_start(host) == BALLAST_OK);
  for (int i = 0; i < 3000; ++i) {  // up to 30 s
    {
      std::lock_guard<std::mutex> lock(seen.mu);
      if (!seen.kinds.empty()) break;
    }
    usleep(10000);
  }
  usleep(300000);  // a stall goes on: reported once
  ballast_host_unsubscribe(host, sub);
  ballast_host_destroy(host);
  kill(b.pid, SIGCONT);
  std::lock_guard<std::mutex> lock(seen.mu);
  REQUIRE(seen.kinds.size() == 1);
  CHECK(seen.kinds[0] == "stuck");
  CHECK(seen.ranks[0] == 1);
  CHECK(seen.metrics[0] == "heartbeat");
  // Neither rank offers a stack signal: each one's entry says why there is no stack.
  CHECK(seen.evidence[0].find("\"stacks\"") != std::string::npos);
  CHECK(seen.evidence[0].find("no stack") != std::string::npos);
}
