// bench_policy: the cost of one Lua policy handler call, end to end: the
// event converted to a table (a fault report, or a JSON payload of 5
// fields), the handler under the sandbox (pcall with traceback, the
// deadline watched, memory-capped allocator), and the action it returns read back and
// handed to the sink. The peer is a bare lua_pcall of an empty Lua function
// with a prebuilt table in a plain state, measured in the same run. The
// host_* case publishes the fault report on a real host's bus, where the
// built-in policy plugin takes it from its queue (the dispatcher thread):
// its figure is the process's CPU time per event, both threads.
//
// Prints one JSON object per figure; each figure is the median of 9 runs of
// 200000 calls (argv[1] sets the calls per run). The machines are shared and
// often oversubscribed: besides wall-clock time per call, the thread's CPU
// time per call is reported, which other processes do not inflate.
#include "command_line.hpp"
#include "error.hpp"
#include "host.hpp"
#include "policy.hpp"

#include <ballast/events.h>

#include <lua.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int kRuns = 9;
int kCalls = 200000;  // per run; argv[1] overrides

const char* kScript = R"(
ballast.on("fault.confirmed", function(ev)
  local f = ev.payload
  if f.confidence > 0.5 then
    return {action = "evict", subject = f.subject, reason = f.kind}
  end
end)
ballast.on("fault.suspected", function(ev)
  local f = ev.payload
  if f.confidence > 2 then return {action = "pause"} end
end)
ballast.on("job.note", function(ev)
  local p = ev.payload
  if p.slowdown > 1.2 then
    return {action = "evict", subject = p.node, reason = p.kind}
  end
end)
)";

struct CountingSink : ballast::PolicySink {
  uint64_t actions = 0, errors = 0;
  void on_action(const ballast::PolicyAction& a) override { actions += a.action.size() > 0; }
  void on_publish(ballast::OwnedEvent) override {}
  void on_log(int, const std::string&) override {}
  void on_error(const std::string& m) override {
    ++errors;
    std::fprintf(stderr, "%s\n", m.c_str());
  }
};

double cpu_ns(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return double(ts.tv_sec) * 1e9 + double(ts.tv_nsec);
}
double thread_cpu_ns() { return cpu_ns(CLOCK_THREAD_CPUTIME_ID); }

struct Figures {
  double wall_ns, cpu_ns;  // per call, medians over the runs
};

Figures measure(const std::function<void()>& call) {
  for (int i = 0; i < kCalls / 10; ++i) call();  // warm up
  std::vector<double> wall, cpu;
  for (int r = 0; r < kRuns; ++r) {
    double c0 = thread_cpu_ns();
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kCalls; ++i) call();
    auto t1 = std::chrono::steady_clock::now();
    double c1 = thread_cpu_ns();
    wall.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / kCalls);
    cpu.push_back((c1 - c0) / kCalls);
  }
  std::sort(wall.begin(), wall.end());
  std::sort(cpu.begin(), cpu.end());
  return {wall[wall.size() / 2], cpu[cpu.size() / 2]};
}

// Events published on `host`'s bus and handled by its policy: the
// process's CPU time (publisher and dispatcher) per event, medians.
Figures measure_host(ballast::Host& host, const ballast_event& event) {
  uint64_t handled = host.bus().stats().delivered;
  auto batch = [&] {
    for (int i = 0; i < kCalls; ++i)
      if (host.publish(event, "bench") != BALLAST_OK) std::exit(1);
    handled += kCalls;
    while (host.bus().stats().delivered < handled) std::this_thread::sleep_for(std::chrono::microseconds(200));
  };
  std::vector<double> wall, cpu;
  for (int r = 0; r <= kRuns; ++r) {  // the first batch warms up
    double c0 = cpu_ns(CLOCK_PROCESS_CPUTIME_ID);
    auto t0 = std::chrono::steady_clock::now();
    batch();
    auto t1 = std::chrono::steady_clock::now();
    double c1 = cpu_ns(CLOCK_PROCESS_CPUTIME_ID);
    if (r == 0) continue;
    wall.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / kCalls);
    cpu.push_back((c1 - c0) / kCalls);
  }
  std::sort(wall.begin(), wall.end());
  std::sort(cpu.begin(), cpu.end());
  return {wall[wall.size() / 2], cpu[cpu.size() / 2]};
}

void print(const char* c, const char* metric, double value, const char* unit) {
  std::printf("{\"bench\":\"policy\",\"case\":\"%s\",\"metric\":\"%s\",\"value\":%.1f,\"unit\":\"%s\"}\n", c, metric,
              value, unit);
}

void report(const char* c, Figures f) {
  print(c, "cpu_ns_per_call", f.cpu_ns, "ns");
  print(c, "wall_ns_per_call", f.wall_ns, "ns");
  print(c, "calls_per_s_cpu", 1e9 / f.cpu_ns, "1/s");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app(
      "The cost of one Lua policy handler call, end to end, against a bare lua_pcall; JSON lines on "
      "stdout (docs/benchmarks.md).",
      "bench_policy");
  app.add_option("CALLS", kCalls, "calls per run (default 200000)")->check(CLI::Range(1000, 1000000000));
  if (int rc = ballast::util::parse_command_line(app, argc, argv); rc >= 0) return rc;
  // Named by the process: benches run side by side must not remove each other's script.
  std::string path =
      (std::filesystem::temp_directory_path() / ("ballast-bench-policy-" + std::to_string(getpid()) + ".lua")).string();
  std::ofstream(path) << kScript;
  std::unique_ptr<ballast::Policy> policy;
  if (ballast::Policy::load(path, {}, &policy) != BALLAST_OK) {
    std::fprintf(stderr, "bench_policy: %s\n", ballast::last_error());
    return 1;
  }
  CountingSink sink;

  ballast_fault_report f{};
  f.size = sizeof f;
  f.stage = BALLAST_FAULT_CONFIRMED;
  f.subject = "gpu042";
  f.rank = -1;
  f.kind = "outlier";
  f.metric = "gpu0.util";
  f.score = 4.2;
  f.confidence = 0.93;
  f.detector = "machine";
  ballast_event fault{};
  fault.size = sizeof fault;
  fault.schema = BALLAST_SCHEMA_FAULT_REPORT;
  fault.topic = "fault.confirmed";
  fault.ts_ns = 1700000000000000000;
  fault.source = {"gpu001", -1, "detector"};
  fault.payload = &f;
  fault.payload_size = sizeof f;

  // The same report, but the handler returns nothing.
  ballast_event suspected = fault;
  suspected.topic = "fault.suspected";

  std::string json5 = R"({"node":"gpu042","kind":"worker","slowdown":1.5,"step":1200,"rank":17})";
  ballast_event note = fault;
  note.schema = BALLAST_SCHEMA_JSON;
  note.topic = "job.note";
  note.payload = json5.data();
  note.payload_size = json5.size();

  report("fault_report_to_action", measure([&] { policy->handle(fault, sink); }));
  report("fault_report_no_action", measure([&] { policy->handle(suspected, sink); }));
  report("json5_to_action", measure([&] { policy->handle(note, sink); }));

  {
    ballast::HostOptions options;
    options.log_level = BALLAST_LOG_WARN;
    ballast::Host host(options);
    if (host.load_policy(path, {}) != BALLAST_OK || host.start() != BALLAST_OK) {
      std::filesystem::remove(path);
      std::fprintf(stderr, "bench_policy: %s\n", ballast::last_error());
      return 1;
    }
    report("host_fault_report_no_action", measure_host(host, suspected));
    if (host.counter("policy.events") != int64_t(kRuns + 1) * kCalls || host.counter("policy.errors") != 0) {
      std::fprintf(stderr, "bench_policy: the host's policy counted %lld events, %lld errors\n",
                   (long long)host.counter("policy.events"), (long long)host.counter("policy.errors"));
      return 1;
    }
    host.stop();
  }
  std::filesystem::remove(path);

  // Peer: a bare pcall of an empty Lua function with a prebuilt table.
  lua_State* L = luaL_newstate();
  luaL_openlibs(L);
  luaL_loadstring(L, "return function(ev) return nil end");
  lua_call(L, 0, 1);
  lua_newtable(L);
  report("peer_bare_lua_pcall", measure([&] {
           lua_pushvalue(L, 1);
           lua_pushvalue(L, 2);
           lua_pcall(L, 1, 1, 0);
           lua_pop(L, 1);
         }));
  lua_close(L);

  print("memory", "lua_state_bytes", double(policy->memory_in_use()), "B");
  if (sink.errors != 0 || sink.actions == 0) {
    std::fprintf(stderr, "bench_policy: %llu errors, %llu actions\n", (unsigned long long)sink.errors,
                 (unsigned long long)sink.actions);
    return 1;
  }
  return 0;
}
