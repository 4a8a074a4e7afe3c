// Bus delivery cost: inline and queued delivery to 1, 4 and 16 subscribers,
// against a plain indirect call of the same handler with the same event,
// measured in the same run. Prints one JSON object per figure; each figure
// is the median of the runs.
//
// Timing: inline and plain calls run on one thread and are timed by that
// thread's CPU clock as well as by the wall clock, since on a shared machine
// the wall clock also counts the time other processes held the core (the
// "cpu_share" line says how much of a core a busy thread got at the start).
// Queued delivery is timed by the wall clock from the first publish to the
// last delivery, with the producer's CPU time per event beside it, and the
// round trip of a cache line between two threads measured before and after
// (queued events move between cores, at that price).
//
//   bench_bus [--runs N] [--quick] [--only inline|sides|queued] [--subs 1|4|16]
#include "bus.hpp"
#include "command_line.hpp"

#include <ballast/events.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <time.h>

using namespace ballast;
using Clock = std::chrono::steady_clock;

namespace {

// Per-subscriber state: on its own cache line, written by one thread.
struct alignas(64) Sink {
  double sum = 0;
  std::atomic<uint64_t> n{0};
};

// The handler every case calls: reads the payload and counts.
int handler(void* user, const ballast_event* ev) {
  auto* s = static_cast<Sink*>(user);
  s->sum += static_cast<const ballast_metric_batch*>(ev->payload)->samples[0].value;
  s->n.store(s->n.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  return 0;
}

// Hide a value from the optimiser: after this it cannot know what fn is,
// so the plain call stays an indirect call.
template <typename T>
void opaque(T& v) {
  asm volatile("" : "+r"(v));
}

ballast_metric_sample g_sample = {"node-1", "cpu.user", 1, 1.0, 0};
ballast_metric_batch g_batch = {sizeof(ballast_metric_batch), 1, &g_sample};

ballast_event event() {
  ballast_event ev{};
  ev.size = sizeof ev;
  ev.schema = BALLAST_SCHEMA_METRIC_BATCH;
  ev.topic = "metric.sample";
  ev.ts_ns = 1;
  ev.source = {"node-1", 0, "bench"};
  ev.payload = &g_batch;
  ev.payload_size = sizeof g_batch;
  return ev;
}

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

double thread_cpu() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// How much of a core a busy thread gets now (1 on an idle machine).
double cpu_share() {
  const double c0 = thread_cpu();
  const auto t0 = Clock::now();
  while (seconds(t0, Clock::now()) < 0.2) {
  }
  return (thread_cpu() - c0) / seconds(t0, Clock::now());
}

// The round trip of one cache line between this thread and another one (two
// flags, each written by one side and polled by the other), median of 5
// runs: what every queued event pays in part, since its slot's lines move
// from the producer's core to the dispatcher's. On a VM it changes with
// where the host puts the two vCPUs, and queued delivery with it.
double line_round_trip_ns() {
  struct alignas(64) Flag {
    std::atomic<uint64_t> v{0};
  };
  std::vector<double> runs;
  for (int r = 0; r < 5; ++r) {
    Flag ping, pong;
    constexpr uint64_t kTrips = 20000;
    std::thread echo([&] {
      for (uint64_t i = 1; i <= kTrips; ++i) {
        while (ping.v.load(std::memory_order_acquire) != i) {
        }
        pong.v.store(i, std::memory_order_release);
      }
    });
    const auto t0 = Clock::now();
    for (uint64_t i = 1; i <= kTrips; ++i) {
      ping.v.store(i, std::memory_order_release);
      while (pong.v.load(std::memory_order_acquire) != i) {
      }
    }
    runs.push_back(seconds(t0, Clock::now()) * 1e9 / kTrips);
    echo.join();
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

// Per delivery: thread CPU time and wall time, in ns.
struct Cost {
  double cpu_ns;
  double wall_ns;
};

// A handler call through a function pointer, `subs` calls per event.
Cost plain(unsigned subs, uint64_t events) {
  std::vector<Sink> sinks(subs);
  ballast_handler fn = handler;
  opaque(fn);
  const ballast_event ev = event();
  const double c0 = thread_cpu();
  const auto t0 = Clock::now();
  for (uint64_t i = 0; i < events; ++i) {
    for (unsigned k = 0; k < subs; ++k) fn(&sinks[k], &ev);
    opaque(fn);
  }
  const auto t1 = Clock::now();
  const double n = static_cast<double>(events * subs);
  return {(thread_cpu() - c0) * 1e9 / n, seconds(t0, t1) * 1e9 / n};
}

// A delivery through Bus::publish with `subs` inline subscribers.
Cost inline_delivery(unsigned subs, uint64_t events) {
  Bus bus;
  std::vector<Sink> sinks(subs);
  uint64_t id = 0;
  for (unsigned k = 0; k < subs; ++k) bus.subscribe("metric.sample", nullptr, handler, &sinks[k], "bench", &id);
  const ballast_event ev = event();
  bus.publish(ev);  // interns the topic
  const double c0 = thread_cpu();
  const auto t0 = Clock::now();
  for (uint64_t i = 0; i < events; ++i) bus.publish(ev);
  const auto t1 = Clock::now();
  const double n = static_cast<double>(events * subs);
  return {(thread_cpu() - c0) * 1e9 / n, seconds(t0, t1) * 1e9 / n};
}

struct Queued {
  double events_per_s;     // publishes per second, up to the last delivery
  double wall_ns;          // wall time per delivery
  double producer_cpu_ns;  // the producer's CPU time per publish
};

// One producer publishing to `subs` queued subscribers (default capacity);
// timed until every event has reached every subscriber.
Queued queued(unsigned subs, uint64_t events, unsigned dispatchers) {
  BusOptions opts;
  opts.dispatcher_threads = dispatchers;
  Bus bus(opts);
  std::vector<Sink> sinks(subs);
  uint64_t id = 0;
  ballast_subscribe_options o = {sizeof o, BALLAST_DELIVER_QUEUED, 0, 0};
  for (unsigned k = 0; k < subs; ++k) bus.subscribe("metric.sample", &o, handler, &sinks[k], "bench", &id);
  const ballast_event ev = event();
  bus.publish(ev);
  for (auto& s : sinks)
    while (s.n.load(std::memory_order_acquire) < 1) std::this_thread::yield();
  const double c0 = thread_cpu();
  const auto t0 = Clock::now();
  for (uint64_t i = 0; i < events; ++i) bus.publish(ev);
  const double c1 = thread_cpu();
  for (auto& s : sinks)
    while (s.n.load(std::memory_order_acquire) < events + 1) std::this_thread::yield();
  const auto t1 = Clock::now();
  const double t = seconds(t0, t1);
  return {static_cast<double>(events) / t, t * 1e9 / static_cast<double>(events * subs),
          (c1 - c0) * 1e9 / static_cast<double>(events)};
}

// CPU cost of each side of a queue, apart: the producer publishes `events`
// into a queue large enough for all of them while the dispatcher is held at
// the first event, then the dispatcher drains them all. Neither waits for
// the other, so their CPU times are the work itself; one producer and one
// dispatcher on cores of their own could move 1e9 / max(both) events/s.
struct Gated {
  std::atomic<bool> open{false};
  uint64_t n = 0;
  uint64_t total = 0;
  double first_cpu = 0, last_cpu = 0, sum = 0;
  static int handler(void* user, const ballast_event* ev) {
    auto* g = static_cast<Gated*>(user);
    if (g->n == 0) {
      g->open.wait(false);
      g->first_cpu = thread_cpu();
    }
    g->sum += static_cast<const ballast_metric_batch*>(ev->payload)->samples[0].value;
    if (++g->n == g->total) g->last_cpu = thread_cpu();
    return 0;
  }
};

struct Sides {
  double producer_ns;    // CPU per publish
  double dispatcher_ns;  // CPU per delivery
};

Sides queued_sides(uint64_t events) {
  Bus bus;
  Gated g;
  g.total = events;
  uint32_t capacity = 2;
  while (capacity < events) capacity *= 2;
  ballast_subscribe_options o = {sizeof o, BALLAST_DELIVER_QUEUED, 0, capacity};
  uint64_t id = 0;
  bus.subscribe("metric.sample", &o, Gated::handler, &g, "bench", &id);
  const ballast_event ev = event();
  const double c0 = thread_cpu();
  for (uint64_t i = 0; i < events; ++i) bus.publish(ev);
  const double c1 = thread_cpu();
  g.open.store(true);
  g.open.notify_all();
  bus.shutdown();
  return {(c1 - c0) * 1e9 / static_cast<double>(events),
          (g.last_cpu - g.first_cpu) * 1e9 / static_cast<double>(events - 1)};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void emit(const std::string& c, const char* metric, double value, const char* unit) {
  std::printf("{\"bench\":\"bus\",\"case\":\"%s\",\"metric\":\"%s\",\"value\":%.4g,\"unit\":\"%s\"}\n", c.c_str(),
              metric, value, unit);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 7;
  uint64_t scale = 1;
  std::string only;        // one group of cases; all when empty
  unsigned only_subs = 0;  // one subscriber count; all when 0
  bool quick = false;
  CLI::App app(
      "The bus: events per second delivered inline, to side threads and queued, against a plain "
      "function call; JSON lines on stdout (docs/benchmarks.md).",
      "bench_bus");
  app.add_option("--runs", runs, "runs per case (the median is reported; default 7)")->check(CLI::PositiveNumber);
  app.add_flag("--quick", quick, "a tenth of the events");
  app.add_option("--only", only, "one group of cases")->check(CLI::IsMember({"inline", "sides", "queued"}));
  app.add_option("--subs", only_subs, "one subscriber count")->check(CLI::IsMember({1, 4, 16}));
  if (int rc = ballast::util::parse_command_line(app, argc, argv); rc >= 0) return rc;
  if (quick) scale = 10;
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  emit("machine", "cpu_share", cpu_share(), "cores");
  emit("machine", "hardware_threads", hw, "threads");
  if (hw > 1) emit("machine", "line_round_trip_ns", line_round_trip_ns(), "ns");

  const auto want = [&](const char* group) { return only.empty() || only == group; };
  const auto want_subs = [&](unsigned subs) { return only_subs == 0 || only_subs == subs; };
  for (unsigned subs : {1u, 4u, 16u}) {
    if (!want("inline")) break;
    if (!want_subs(subs)) continue;
    const uint64_t events = 4000000 / subs / scale;
    std::vector<double> plain_cpu, plain_wall, inl_cpu, inl_wall, ratio;
    for (int r = 0; r < runs; ++r) {
      // Interleaved, so that both see the same machine state.
      const Cost p = plain(subs, events);
      const Cost in = inline_delivery(subs, events);
      plain_cpu.push_back(p.cpu_ns);
      plain_wall.push_back(p.wall_ns);
      inl_cpu.push_back(in.cpu_ns);
      inl_wall.push_back(in.wall_ns);
      ratio.push_back(in.cpu_ns / p.cpu_ns);
    }
    const std::string sfx = "_" + std::to_string(subs) + "sub";
    emit("plain_call" + sfx, "cpu_ns_per_delivery", median(plain_cpu), "ns");
    emit("plain_call" + sfx, "wall_ns_per_delivery", median(plain_wall), "ns");
    emit("inline" + sfx, "cpu_ns_per_delivery", median(inl_cpu), "ns");
    emit("inline" + sfx, "wall_ns_per_delivery", median(inl_wall), "ns");
    emit("inline" + sfx, "events_per_cpu_s", 1e9 / (median(inl_cpu) * subs), "1/s");
    emit("inline" + sfx, "ratio_to_plain_call", median(ratio), "x");
  }

  if (want("sides")) {
    std::vector<double> prod, disp, rate;
    for (int r = 0; r < runs; ++r) {
      const Sides c = queued_sides(500000 / scale);
      prod.push_back(c.producer_ns);
      disp.push_back(c.dispatcher_ns);
      rate.push_back(1e9 / std::max(c.producer_ns, c.dispatcher_ns));
    }
    emit("queued_1sub_sides", "producer_cpu_ns_per_event", median(prod), "ns");
    emit("queued_1sub_sides", "dispatcher_cpu_ns_per_delivery", median(disp), "ns");
    emit("queued_1sub_sides", "events_per_s_with_two_free_cores", median(rate), "1/s");
  }

  for (unsigned subs : {1u, 4u, 16u}) {
    // One dispatcher; with several subscribers also as many dispatchers as
    // the machine has cores besides the producer's.
    if (!want("queued")) break;
    if (!want_subs(subs)) continue;
    std::vector<unsigned> dispatcher_counts = {1};
    const unsigned more = std::min(subs, hw > 1 ? hw - 1 : 1);
    if (more > 1) dispatcher_counts.push_back(more);
    for (unsigned d : dispatcher_counts) {
      const uint64_t events = 2000000 / subs / scale;
      std::vector<double> eps, wall, cpu;
      for (int r = 0; r < runs; ++r) {
        const Queued q = queued(subs, events, d);
        eps.push_back(q.events_per_s);
        wall.push_back(q.wall_ns);
        cpu.push_back(q.producer_cpu_ns);
      }
      const std::string c = "queued_" + std::to_string(subs) + "sub_" + std::to_string(d) + "disp";
      emit(c, "events_per_s", median(eps), "1/s");
      emit(c, "deliveries_per_s", median(eps) * subs, "1/s");
      emit(c, "wall_ns_per_delivery", median(wall), "ns");
      emit(c, "producer_cpu_ns_per_event", median(cpu), "ns");
    }
  }
  if (want("queued") && hw > 1) emit("machine", "line_round_trip_ns_after", line_round_trip_ns(), "ns");
  return 0;
}
