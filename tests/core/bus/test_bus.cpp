// The event bus: matching, inline and queued delivery, ordering,
// backpressure, drops, unsubscribe, shutdown, and a threaded stress run.
#include <doctest/doctest.h>

#include <ballast/events.h>
#include "bus.hpp"
#include "error.hpp"
#include "topic.hpp"

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace ballast;

namespace {

ballast_event make(const char* topic, int32_t rank = -1, int64_t seq = 0) {
  ballast_event ev{};
  ev.size = sizeof ev;
  ev.schema = BALLAST_SCHEMA_NONE;
  ev.topic = topic;
  ev.ts_ns = seq;
  ev.source = {"node", rank, "test"};
  return ev;
}

ballast_subscribe_options queued(uint32_t capacity = 0, bool lossy = false) {
  return ballast_subscribe_options{sizeof(ballast_subscribe_options), BALLAST_DELIVER_QUEUED,
                                   lossy ? uint32_t{BALLAST_SUBSCRIBE_LOSSY} : 0u, capacity};
}

// Counts calls and remembers topics.
struct Recorder {
  std::mutex mu;
  std::vector<std::string> topics;
  std::atomic<int> calls{0};
  static int handler(void* user, const ballast_event* ev) {
    auto* r = static_cast<Recorder*>(user);
    {
      std::lock_guard<std::mutex> lock(r->mu);
      r->topics.emplace_back(ev->topic);
    }
    r->calls.fetch_add(1);
    return 0;
  }
};

// A handler that blocks until the gate opens, and says when it is inside.
struct Gate {
  std::atomic<bool> open{false};
  std::atomic<int> entered{0};
  std::atomic<int> done{0};
  std::vector<int64_t> seqs;  // written by the one dispatcher thread
  static int handler(void* user, const ballast_event* ev) {
    auto* g = static_cast<Gate*>(user);
    g->entered.fetch_add(1);
    g->entered.notify_all();
    g->open.wait(false);
    g->seqs.push_back(ev->ts_ns);
    g->done.fetch_add(1);
    return 0;
  }
  void release() {
    open.store(true);
    open.notify_all();
  }
  void wait_entered(int n) {
    for (int v = entered.load(); v < n; v = entered.load()) entered.wait(v);
  }
};

// Spin (yielding) until cond holds; the test fails by its ctest timeout, not by a clock.
template <typename F>
void wait_until(F cond) {
  while (!cond()) std::this_thread::yield();
}

// Give a thread that should be blocked a chance to show that it is not.
void settle() { std::this_thread::sleep_for(std::chrono::milliseconds(100)); }

}  // namespace

TEST_CASE("topic and pattern syntax") {
  CHECK(valid_topic("fault.confirmed"));
  CHECK(valid_topic("gpu0.util_x-y"));
  CHECK_FALSE(valid_topic(""));
  CHECK_FALSE(valid_topic("a..b"));
  CHECK_FALSE(valid_topic(".a"));
  CHECK_FALSE(valid_topic("a."));
  CHECK_FALSE(valid_topic("A.b"));
  CHECK_FALSE(valid_topic("a.*"));
  CHECK(valid_pattern("*"));
  CHECK(valid_pattern("a.*"));
  CHECK(valid_pattern("a.b.*"));
  CHECK(valid_pattern("a.b"));
  CHECK_FALSE(valid_pattern("a*"));
  CHECK_FALSE(valid_pattern(".*"));
  CHECK_FALSE(valid_pattern("a.*.b"));
}

TEST_CASE("exact, prefix and * subscriptions match as stated") {
  Bus bus;
  Recorder exact, prefix, deep, all;
  uint64_t id = 0;
  REQUIRE(bus.subscribe("fault.confirmed", nullptr, Recorder::handler, &exact, "t", &id) == BALLAST_OK);
  REQUIRE(bus.subscribe("fault.*", nullptr, Recorder::handler, &prefix, "t", &id) == BALLAST_OK);
  REQUIRE(bus.subscribe("fault.x.*", nullptr, Recorder::handler, &deep, "t", &id) == BALLAST_OK);
  REQUIRE(bus.subscribe("*", nullptr, Recorder::handler, &all, "t", &id) == BALLAST_OK);
  for (const char* t : {"fault.confirmed", "fault.suspected", "fault", "fault.x.y", "faults.a", "job.state"})
    REQUIRE(bus.publish(make(t)) == BALLAST_OK);
  CHECK(exact.topics == std::vector<std::string>{"fault.confirmed"});
  CHECK(prefix.topics == std::vector<std::string>{"fault.confirmed", "fault.suspected", "fault.x.y"});
  CHECK(deep.topics == std::vector<std::string>{"fault.x.y"});
  CHECK(all.topics.size() == 6);
  // A subscription made after a topic was interned sees it too (the cache is rebuilt).
  Recorder late;
  REQUIRE(bus.subscribe("job.*", nullptr, Recorder::handler, &late, "t", &id) == BALLAST_OK);
  REQUIRE(bus.publish(make("job.state")) == BALLAST_OK);
  CHECK(late.topics == std::vector<std::string>{"job.state"});
  BusStats st = bus.stats();
  CHECK(st.published == 7);
  CHECK(st.delivered == 1 + 3 + 1 + 7 + 1);
  CHECK(st.topics == 6);
  CHECK(st.subscriptions == 5);
}

TEST_CASE("bad subscriptions and events are refused with a message") {
  Bus bus;
  Recorder r;
  uint64_t id = 0;
  CHECK(bus.subscribe("a*", nullptr, Recorder::handler, &r, "plug", &id) == BALLAST_EINVAL);
  CHECK(std::string(last_error()) == "bus: plug: " + invalid_pattern_message("a*"));
  CHECK(std::string(last_error()).find("\"a*\" is not a valid pattern (a topic such as") != std::string::npos);
  CHECK(bus.subscribe("a", nullptr, nullptr, &r, "plug", &id) == BALLAST_EINVAL);
  ballast_subscribe_options o = queued();
  o.flags = 8;
  CHECK(bus.subscribe("a", &o, Recorder::handler, &r, "plug", &id) == BALLAST_EINVAL);
  o = queued();
  o.size = 4;
  CHECK(bus.subscribe("a", &o, Recorder::handler, &r, "plug", &id) == BALLAST_EINVAL);
  CHECK(bus.publish(make("Not.Valid")) == BALLAST_EINVAL);
  ballast_event ev = make("metric.sample");
  ev.schema = BALLAST_SCHEMA_METRIC_BATCH;  // no payload
  CHECK(bus.publish(ev) == BALLAST_EINVAL);
  CHECK(std::string(last_error()).find("(topic metric.sample)") != std::string::npos);
  CHECK(bus.unsubscribe(12345) == BALLAST_ENOTFOUND);
}

namespace {
const ballast_event* g_seen_event = nullptr;
const void* g_seen_payload = nullptr;
int remember(void*, const ballast_event* ev) {
  g_seen_event = ev;
  g_seen_payload = ev->payload;
  return 0;
}
}  // namespace

TEST_CASE("inline delivery hands the publisher's own event, not a copy") {
  Bus bus;
  uint64_t id = 0;
  REQUIRE(bus.subscribe("metric.sample", nullptr, remember, nullptr, "t", &id) == BALLAST_OK);
  ballast_metric_sample sample = {"n", "cpu.user", 1, 2.0, 0};
  ballast_metric_batch batch = {sizeof batch, 1, &sample};
  ballast_event ev = make("metric.sample");
  ev.schema = BALLAST_SCHEMA_METRIC_BATCH;
  ev.payload = &batch;
  ev.payload_size = sizeof batch;
  REQUIRE(bus.publish(ev) == BALLAST_OK);
  CHECK(g_seen_event == &ev);
  CHECK(g_seen_payload == &batch);
}

namespace {
struct Copies {
  std::atomic<int> n{0};
  bool ok = true;
  static int handler(void* user, const ballast_event* ev) {
    auto* c = static_cast<Copies*>(user);
    const auto& b = *static_cast<const ballast_metric_batch*>(ev->payload);
    bool ok = b.count == 100 && std::string(ev->topic) == "metric.sample";
    for (uint32_t i = 0; ok && i < b.count; ++i)
      ok = b.samples[i].value == i && std::string(b.samples[i].metric) == "m" + std::to_string(i);
    if (!ok) c->ok = false;
    c->n.fetch_add(1);
    c->n.notify_all();
    return 0;
  }
};
}  // namespace

TEST_CASE("queued delivery deep-copies: the publisher may reuse its buffers at once") {
  Bus bus;
  Copies two[2];
  uint64_t id = 0;
  auto o = queued(4);
  REQUIRE(bus.subscribe("metric.*", &o, Copies::handler, &two[0], "t", &id) == BALLAST_OK);
  REQUIRE(bus.subscribe("*", &o, Copies::handler, &two[1], "t", &id) == BALLAST_OK);
  // 100 samples: larger than a slot's inline buffer, so the heap path is used.
  std::vector<std::string> names(100);
  std::vector<ballast_metric_sample> samples(100);
  for (int round = 0; round < 20; ++round) {
    for (int i = 0; i < 100; ++i) {
      names[i] = "m" + std::to_string(i);
      samples[i] = {"n", names[i].c_str(), 0, static_cast<double>(i), 0};
    }
    ballast_metric_batch batch = {sizeof batch, 100, samples.data()};
    char topic[] = "metric.sample";
    ballast_event ev = make(topic);
    ev.schema = BALLAST_SCHEMA_METRIC_BATCH;
    ev.payload = &batch;
    ev.payload_size = sizeof batch;
    REQUIRE(bus.publish(ev) == BALLAST_OK);
    // Scribble over everything the event pointed to.
    std::memset(topic, 'x', sizeof topic - 1);
    for (auto& n : names) n.assign(n.size(), '?');
    for (auto& s : samples) s.value = -1;
  }
  bus.shutdown();
  CHECK(two[0].n == 20);
  CHECK(two[1].n == 20);
  CHECK(two[0].ok);
  CHECK(two[1].ok);
}

namespace {
struct Order {
  static constexpr int kPublishers = 4;
  std::vector<int64_t> last = std::vector<int64_t>(kPublishers, -1);
  std::atomic<long> n{0};
  bool in_order = true;
  static int handler(void* user, const ballast_event* ev) {
    auto* o = static_cast<Order*>(user);  // one dispatcher thread per subscription: no lock
    int64_t& last = o->last[ev->source.rank];
    if (ev->ts_ns != last + 1) o->in_order = false;
    last = ev->ts_ns;
    o->n.fetch_add(1, std::memory_order_relaxed);
    return 0;
  }
};
}  // namespace

TEST_CASE("queued delivery is FIFO per publisher with several publishers") {
  BusOptions opts;
  opts.dispatcher_threads = 2;
  Bus bus(opts);
  Order orders[3];
  uint64_t id = 0;
  auto small = queued(8);  // small: publishers often wait for room
  auto big = queued(0);
  auto lossless_tiny = queued(2);
  REQUIRE(bus.subscribe("step.*", &small, Order::handler, &orders[0], "t", &id) == BALLAST_OK);
  REQUIRE(bus.subscribe("*", &big, Order::handler, &orders[1], "t", &id) == BALLAST_OK);
  REQUIRE(bus.subscribe("step.timing", &lossless_tiny, Order::handler, &orders[2], "t", &id) == BALLAST_OK);
  constexpr int kEach = 20000;
  std::vector<std::thread> pubs;
  for (int p = 0; p < Order::kPublishers; ++p) {
    pubs.emplace_back([&bus, p] {
      for (int i = 0; i < kEach; ++i) CHECK(bus.publish(make("step.timing", p, i)) == BALLAST_OK);
    });
  }
  for (auto& t : pubs) t.join();
  bus.shutdown();
  for (auto& o : orders) {
    CHECK(o.n == Order::kPublishers * kEach);
    CHECK(o.in_order);
    for (int64_t l : o.last) CHECK(l == kEach - 1);
  }
  CHECK(bus.stats().dropped == 0);
}

TEST_CASE("a full lossless queue blocks the publisher until the subscriber catches up") {
  Bus bus;
  Gate gate;
  uint64_t id = 0;
  auto o = queued(2);
  REQUIRE(bus.subscribe("a.b", &o, Gate::handler, &gate, "slow", &id) == BALLAST_OK);
  std::atomic<int> returned{0};
  std::thread publisher([&] {
    for (int i = 0; i < 10; ++i) {
      CHECK(bus.publish(make("a.b", 0, i)) == BALLAST_OK);
      returned.fetch_add(1);
    }
  });
  gate.wait_entered(1);
  // The event in the handler keeps its slot until the handler returns: two
  // publishes fill the queue and the third waits.
  wait_until([&] { return returned.load() == 2; });
  settle();
  CHECK(returned.load() == 2);
  CHECK(bus.stats().published == 3);  // the third is inside publish(), blocked
  gate.release();
  publisher.join();
  bus.shutdown();
  CHECK(returned.load() == 10);
  CHECK(gate.seqs == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  CHECK(bus.stats().dropped == 0);
}

TEST_CASE("a full lossy queue drops and counts instead of blocking") {
  Bus bus;
  Gate gate;
  uint64_t id = 0;
  auto o = queued(2, true);
  REQUIRE(bus.subscribe("a.b", &o, Gate::handler, &gate, "slow", &id) == BALLAST_OK);
  for (int i = 0; i < 10; ++i) REQUIRE(bus.publish(make("a.b", 0, i)) == BALLAST_OK);  // never blocks
  CHECK(bus.dropped(id) == 8);
  CHECK(bus.stats().dropped == 8);
  gate.release();
  bus.shutdown();
  CHECK(gate.seqs == std::vector<int64_t>{0, 1});
  CHECK(bus.stats().delivered == 2);
}

TEST_CASE("unsubscribe waits for a running inline handler and stops further calls") {
  Bus bus;
  Gate gate;
  uint64_t id = 0;
  REQUIRE(bus.subscribe("a.b", nullptr, Gate::handler, &gate, "t", &id) == BALLAST_OK);
  std::thread publisher([&] { CHECK(bus.publish(make("a.b")) == BALLAST_OK); });
  gate.wait_entered(1);
  std::atomic<bool> unsubscribed{false};
  std::thread remover([&] {
    CHECK(bus.unsubscribe(id) == BALLAST_OK);
    unsubscribed.store(true);
  });
  settle();
  CHECK_FALSE(unsubscribed.load());  // the handler is still running
  gate.release();
  remover.join();
  publisher.join();
  CHECK(gate.done == 1);
  REQUIRE(bus.publish(make("a.b")) == BALLAST_OK);
  CHECK(gate.entered == 1);
  CHECK(bus.unsubscribe(id) == BALLAST_ENOTFOUND);
}

TEST_CASE("unsubscribe of a queued subscription waits for its handler and counts what was left") {
  Bus bus;
  Gate gate;
  uint64_t id = 0;
  auto o = queued(16);
  REQUIRE(bus.subscribe("a.b", &o, Gate::handler, &gate, "t", &id) == BALLAST_OK);
  for (int i = 0; i < 5; ++i) REQUIRE(bus.publish(make("a.b", 0, i)) == BALLAST_OK);
  gate.wait_entered(1);
  std::atomic<bool> unsubscribed{false};
  std::thread remover([&] {
    CHECK(bus.unsubscribe(id) == BALLAST_OK);
    unsubscribed.store(true);
  });
  settle();
  CHECK_FALSE(unsubscribed.load());
  gate.release();
  remover.join();
  // The handler finished its event; the other four were discarded and counted.
  CHECK(gate.done == 1);
  CHECK(bus.stats().dropped == 4);
  CHECK(bus.stats().subscriptions == 0);
  REQUIRE(bus.publish(make("a.b")) == BALLAST_OK);
  bus.shutdown();
  CHECK(gate.entered == 1);
}

namespace {
struct SelfRemover {
  Bus* bus = nullptr;
  uint64_t id = 0;
  std::atomic<int> status{1};
  static int handler(void* user, const ballast_event*) {
    auto* s = static_cast<SelfRemover*>(user);
    s->status.store(s->bus->unsubscribe(s->id));
    s->status.notify_all();
    return 0;
  }
};
}  // namespace

TEST_CASE("a queued handler cannot remove its own subscription (refused, no deadlock)") {
  Bus bus;
  SelfRemover s;
  s.bus = &bus;
  auto o = queued();
  REQUIRE(bus.subscribe("a.b", &o, SelfRemover::handler, &s, "t", &s.id) == BALLAST_OK);
  REQUIRE(bus.publish(make("a.b")) == BALLAST_OK);
  s.status.wait(1);
  CHECK(s.status.load() == BALLAST_ESTATE);
}

TEST_CASE("shutdown delivers everything already queued, then refuses") {
  Bus bus;
  Gate gate;
  uint64_t id = 0;
  auto o = queued(1024);
  REQUIRE(bus.subscribe("a.b", &o, Gate::handler, &gate, "t", &id) == BALLAST_OK);
  for (int i = 0; i < 1000; ++i) REQUIRE(bus.publish(make("a.b", 0, i)) == BALLAST_OK);
  gate.wait_entered(1);
  std::thread stopper([&] { bus.shutdown(); });
  settle();
  gate.release();
  stopper.join();
  CHECK(gate.done == 1000);
  CHECK(gate.seqs.back() == 999);
  CHECK(bus.publish(make("a.b")) == BALLAST_ESTATE);
  uint64_t id2 = 0;
  CHECK(bus.subscribe("a.b", &o, Gate::handler, &gate, "t", &id2) == BALLAST_ESTATE);
  bus.shutdown();  // idempotent
}

namespace {
// A queued handler that, while a publisher is blocked on its (full) queue,
// removes another subscription: unsubscribe must not wait for the blocked
// publisher, which waits for this very handler.
struct Unsubscriber {
  Bus* bus = nullptr;
  uint64_t other = 0;
  std::atomic<int>* returned = nullptr;
  std::atomic<int> status{1};
  int calls = 0;
  static int handler(void* user, const ballast_event*) {
    auto* u = static_cast<Unsubscriber*>(user);
    if (u->calls++ == 0) {
      wait_until([u] { return u->returned->load() == 2; });  // the queue is full now
      settle();                                              // and the third publish waits
      u->status.store(u->bus->unsubscribe(u->other));
    }
    return 0;
  }
};
}  // namespace

TEST_CASE("a queued handler can unsubscribe while a publisher is blocked on its full queue") {
  Bus bus;
  Recorder other;
  Unsubscriber u;
  std::atomic<int> returned{0};
  u.bus = &bus;
  u.returned = &returned;
  uint64_t id = 0;
  auto o = queued(2);
  REQUIRE(bus.subscribe("a.b", nullptr, Recorder::handler, &other, "t", &u.other) == BALLAST_OK);
  REQUIRE(bus.subscribe("a.b", &o, Unsubscriber::handler, &u, "t", &id) == BALLAST_OK);
  std::thread publisher([&] {
    for (int i = 0; i < 10; ++i) {
      CHECK(bus.publish(make("a.b", 0, i)) == BALLAST_OK);
      returned.fetch_add(1);
    }
  });
  publisher.join();
  bus.shutdown();
  CHECK(u.status.load() == BALLAST_OK);
  CHECK(u.calls == 10);
  CHECK(other.calls.load() == 3);  // the events published before it was removed
}

namespace {
// An inline handler that publishes three events into a queue of capacity 2
// whose handler is stuck: the third publish blocks inside this handler.
struct Feeder {
  Bus* bus = nullptr;
  std::atomic<int> done{0};
  static int handler(void* user, const ballast_event*) {
    auto* f = static_cast<Feeder*>(user);
    for (int i = 0; i < 3; ++i) f->bus->publish(make("b.x", 0, i));
    f->done.store(1);
    return 0;
  }
};
}  // namespace

TEST_CASE("unsubscribe from a queued handler waits for the removed inline handler, even when it is blocked") {
  BusOptions opts;
  opts.dispatcher_threads = 2;
  Bus bus(opts);
  Gate stuck;
  Feeder feeder;
  feeder.bus = &bus;
  SelfRemover remover;  // its handler unsubscribes remover.id: here the feeder's subscription
  remover.bus = &bus;
  uint64_t id = 0;
  auto tiny = queued(2);
  auto q = queued();
  REQUIRE(bus.subscribe("b.x", &tiny, Gate::handler, &stuck, "stuck", &id) == BALLAST_OK);      // dispatcher 1
  REQUIRE(bus.subscribe("y.go", &q, SelfRemover::handler, &remover, "rm", &id) == BALLAST_OK);  // dispatcher 2
  REQUIRE(bus.subscribe("a.s", nullptr, Feeder::handler, &feeder, "feeder", &remover.id) == BALLAST_OK);
  std::thread publisher([&] { CHECK(bus.publish(make("a.s")) == BALLAST_OK); });
  stuck.wait_entered(1);
  settle();  // the feeder's third publish is now blocked, inside the feeder's handler
  REQUIRE(bus.publish(make("y.go")) == BALLAST_OK);
  settle();
  CHECK(remover.status.load() == 1);  // unsubscribe has not returned: the feeder's handler runs
  CHECK(feeder.done.load() == 0);
  stuck.release();
  remover.status.wait(1);
  CHECK(remover.status.load() == BALLAST_OK);
  CHECK(feeder.done.load() == 1);
  publisher.join();
  bus.shutdown();
  CHECK(stuck.done == 3);
}

namespace {
int failing(void*, const ballast_event*) { return BALLAST_EPLUGIN; }
int throwing(void*, const ballast_event*) { throw std::runtime_error("a C++ handler that throws anyway"); }
}  // namespace

TEST_CASE("handler failures are counted and never stop the bus") {
  Bus bus;
  Recorder after;
  uint64_t id = 0;
  auto o = queued();
  REQUIRE(bus.subscribe("a.b", nullptr, failing, nullptr, "t", &id) == BALLAST_OK);
  REQUIRE(bus.subscribe("a.b", nullptr, throwing, nullptr, "t", &id) == BALLAST_OK);
  REQUIRE(bus.subscribe("a.b", &o, throwing, nullptr, "t", &id) == BALLAST_OK);
  REQUIRE(bus.subscribe("a.b", nullptr, Recorder::handler, &after, "t", &id) == BALLAST_OK);
  for (int i = 0; i < 3; ++i) REQUIRE(bus.publish(make("a.b")) == BALLAST_OK);
  bus.shutdown();
  CHECK(after.calls == 3);
  BusStats st = bus.stats();
  CHECK(st.handler_failures == 9);
  CHECK(st.delivered == 12);
}

namespace {
// A queued handler that republishes into another queued subscription served
// by the same (only) dispatcher, whose queue is tiny: the bus must deliver
// in place rather than wait for itself.
struct Relay {
  Bus* bus = nullptr;
  static int handler(void* user, const ballast_event* ev) {
    auto* r = static_cast<Relay*>(user);
    return r->bus->publish(make("b.out", 0, ev->ts_ns));
  }
};
}  // namespace

TEST_CASE("a queued handler publishing into a full queue of its own dispatcher does not deadlock") {
  Bus bus;  // one dispatcher
  Relay relay;
  relay.bus = &bus;
  Order sink;
  uint64_t id = 0;
  auto in = queued(1024);
  auto out = queued(2);
  REQUIRE(bus.subscribe("a.in", &in, Relay::handler, &relay, "relay", &id) == BALLAST_OK);
  REQUIRE(bus.subscribe("b.out", &out, Order::handler, &sink, "sink", &id) == BALLAST_OK);
  for (int i = 0; i < 1000; ++i) REQUIRE(bus.publish(make("a.in", 0, i)) == BALLAST_OK);
  bus.shutdown();
  CHECK(sink.n == 1000);
  CHECK(sink.in_order);
  CHECK(bus.stats().dropped == 0);
  CHECK(bus.stats().handler_failures == 0);
}

namespace {
struct Counter {
  std::atomic<long> n{0};
  static int handler(void* user, const ballast_event*) {
    static_cast<Counter*>(user)->n.fetch_add(1, std::memory_order_relaxed);
    return 0;
  }
};
}  // namespace

TEST_CASE("stress: 4 publishers x 4 subscribers, inline and queued, with churn; counts exact") {
  BusOptions opts;
  opts.dispatcher_threads = 2;
  opts.default_queue_capacity = 64;
  Bus bus(opts);
  Counter subs[4];
  Order fifo;
  uint64_t id = 0;
  auto q = queued();
  REQUIRE(bus.subscribe("stress.a", nullptr, Counter::handler, &subs[0], "t", &id) == BALLAST_OK);
  REQUIRE(bus.subscribe("stress.*", nullptr, Counter::handler, &subs[1], "t", &id) == BALLAST_OK);
  REQUIRE(bus.subscribe("stress.a", &q, Counter::handler, &subs[2], "t", &id) == BALLAST_OK);
  REQUIRE(bus.subscribe("*", &q, Order::handler, &fifo, "t", &id) == BALLAST_OK);
  REQUIRE(bus.subscribe("stress.*", &q, Counter::handler, &subs[3], "t", &id) == BALLAST_OK);
  constexpr int kEach = 25000;
  std::atomic<bool> stop{false};
  // Subscriptions come and go meanwhile (inline and queued, lossy): they
  // must not disturb the others.
  std::thread churn([&] {
    Counter c;
    auto lossy = queued(4, true);
    while (!stop.load()) {
      uint64_t a = 0, b = 0;
      CHECK(bus.subscribe("stress.*", nullptr, Counter::handler, &c, "churn", &a) == BALLAST_OK);
      CHECK(bus.subscribe("*", &lossy, Counter::handler, &c, "churn", &b) == BALLAST_OK);
      CHECK(bus.unsubscribe(a) == BALLAST_OK);
      CHECK(bus.unsubscribe(b) == BALLAST_OK);
    }
  });
  std::vector<std::thread> pubs;
  for (int p = 0; p < 4; ++p) {
    pubs.emplace_back([&bus, p] {
      // Alternate two topics; "stress.a" reaches all five subscriptions.
      for (int i = 0; i < kEach; ++i)
        CHECK(bus.publish(make(i % 2 == 0 ? "stress.a" : "stress.b", p, i)) == BALLAST_OK);
    });
  }
  for (auto& t : pubs) t.join();
  stop.store(true);
  churn.join();
  bus.shutdown();
  const long total = 4L * kEach;
  CHECK(subs[0].n == total / 2);
  CHECK(subs[1].n == total);
  CHECK(subs[2].n == total / 2);
  CHECK(subs[3].n == total);
  CHECK(fifo.n == total);
  CHECK(fifo.in_order);
  BusStats st = bus.stats();
  CHECK(st.published == static_cast<uint64_t>(total));
  CHECK(st.subscriptions == 5);
}
