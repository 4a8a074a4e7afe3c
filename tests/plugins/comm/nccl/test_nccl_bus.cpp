// comm-nccl on the bus, without a GPU: the publisher reads records written
// into a real trace ring, as the NCCL communicators write them, and
// publishes them through a real host as collective.record (once, when
// finished) and collective.progress (while in flight); and the built plugin
// starts its publishing timer in a host, or refuses a bad period. That the
// plugin's own communicators' records arrive on the bus needs a GPU: see
// test_comm_nccl.
#include <doctest/doctest.h>

#include <ring_publisher.hpp>
#include <trace_ring.hpp>

#include <ballast/events.h>
#include <ballast/host.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

namespace {

using ballast::comm::RingPublisher;
using ballast::comm::TraceRing;

struct Seen {
  std::mutex mu;
  std::vector<std::string> topics;
  std::vector<ballast_collective_record> records;
  std::vector<std::string> ops;
  std::vector<int32_t> source_ranks;
};

int on_event(void* user, const ballast_event* e) {
  if (e->schema != BALLAST_SCHEMA_COLLECTIVE_RECORD || e->payload_size < sizeof(ballast_collective_record)) return 0;
  auto* seen = static_cast<Seen*>(user);
  const auto* r = static_cast<const ballast_collective_record*>(e->payload);
  std::lock_guard<std::mutex> lock(seen->mu);
  seen->topics.push_back(e->topic);
  seen->records.push_back(*r);
  seen->ops.push_back(r->op);
  seen->source_ranks.push_back(e->source.rank);
  return 0;
}

// A host whose bus the publisher writes to, as the plugin's host table
// would: publish() goes to ballast_host_publish.
struct Bus {
  ballast_host_api api{};  // first: the publisher hands back its address
  ballast_host* host = nullptr;
  Seen seen;
  uint64_t sub = 0;
  int64_t lost = 0;  // the publisher's "records_lost" counter

  Bus() {
    api.size = sizeof api;
    api.publish = [](const ballast_host_api* a, const ballast_event* e) {
      return ballast_host_publish(reinterpret_cast<const Bus*>(a)->host, e);
    };
    api.counter_add = [](const ballast_host_api* a, const char* name, int64_t delta) {
      if (std::string(name) == "records_lost") reinterpret_cast<Bus*>(const_cast<ballast_host_api*>(a))->lost += delta;
      return 0;
    };
    api.config_get = [](const ballast_host_api*, const char*, const char**) { return int(BALLAST_ENOTFOUND); };
    REQUIRE(ballast_host_create("test", &host) == BALLAST_OK);
    REQUIRE(ballast_host_subscribe(host, "collective.*", nullptr, on_event, &seen, &sub) == BALLAST_OK);
    REQUIRE(ballast_host_start(host) == BALLAST_OK);
  }
  ~Bus() { ballast_host_destroy(host); }
  void clear() {
    std::lock_guard<std::mutex> lock(seen.mu);
    seen.topics.clear();
    seen.records.clear();
    seen.ops.clear();
    seen.source_ranks.clear();
  }
};

TraceRing* ring() {
  std::string err;
  TraceRing* r = TraceRing::process_ring("nccl", std::filesystem::temp_directory_path().string(), 2, 4, &err);
  REQUIRE_MESSAGE(r, err);
  return r;
}

// A record as c_start writes it; `finished` as the watchdog or test/wait ends it.
ballast_trace_slot* add(TraceRing* r, uint64_t seq, bool finished, uint64_t* index = nullptr) {
  uint64_t i = 0;
  ballast_trace_slot* t = r->claim(&i);
  if (!t) FAIL("every slot of the ring holds a record in flight");
  *t = ballast_trace_slot{};  // gen stays 0 until published
  t->comm_id = 0xabcd;
  t->seq = seq;
  t->count = 256;
  t->bytes = 1024;
  t->op = BALLAST_OP_ALLREDUCE;
  t->dtype = BALLAST_DT_F32;
  t->algorithm = BALLAST_ALGO_NCCL;
  t->rank = 1;
  t->nranks = 4;
  t->world_rank = 2;
  t->peer = -1;
  t->steps = 1;
  t->wait_peer = t->send_peer = -1;
  t->issue_tick = t->start_tick = t->progress_tick = ballast::comm::trace_tick();
  t->state = BALLAST_TRACE_STARTED;
  TraceRing::publish(t, i);
  if (finished) {
    __atomic_store_n(&t->end_tick, ballast::comm::trace_tick(), __ATOMIC_RELAXED);
    __atomic_store_n(&t->state, BALLAST_TRACE_DONE, __ATOMIC_RELEASE);
  }
  if (index) *index = i;
  return t;
}

}  // namespace

TEST_CASE("finished records are published once as collective.record, running ones as collective.progress each time") {
  TraceRing* r = ring();
  Bus bus;
  RingPublisher pub(&bus.api);
  pub.start_at(r->head(), r->skipped());
  add(r, 1, true);
  ballast_trace_slot* running = add(r, 2, false);
  add(r, 3, true);  // another communicator's, finished while seq 2 runs

  CHECK(pub.publish(*r) == 3);
  {
    std::lock_guard<std::mutex> lock(bus.seen.mu);
    REQUIRE(bus.seen.topics.size() == 3);
    CHECK(bus.seen.topics[0] == "collective.record");
    CHECK(bus.seen.topics[1] == "collective.progress");
    CHECK(bus.seen.topics[2] == "collective.record");
    const ballast_collective_record& first = bus.seen.records[0];
    CHECK(first.seq == 1);
    CHECK(first.comm_id == 0xabcd);
    CHECK(bus.seen.ops[0] == "allreduce");
    CHECK(std::string(first.algorithm) == "nccl");
    CHECK(first.bytes == 1024);
    CHECK(first.rank == 1);
    CHECK(first.nranks == 4);
    CHECK(first.state == BALLAST_COLL_DONE);
    CHECK(first.start_ns > 0);
    CHECK(first.end_ns >= first.start_ns);
    CHECK(bus.seen.source_ranks[0] == 2);  // the world rank
    CHECK(bus.seen.records[1].state == BALLAST_COLL_STARTED);
    CHECK(bus.seen.records[1].end_ns == 0);
  }
  bus.clear();

  // NCCL's profiler moves the running one's counters; then it fails.
  __atomic_store_n(&running->chunks_sent, 5, __ATOMIC_RELAXED);
  CHECK(pub.publish(*r) == 1);
  {
    std::lock_guard<std::mutex> lock(bus.seen.mu);
    REQUIRE(bus.seen.topics.size() == 1);
    CHECK(bus.seen.topics[0] == "collective.progress");
    CHECK(bus.seen.records[0].seq == 2);
    CHECK(bus.seen.records[0].chunks_sent == 5);
  }
  bus.clear();
  running->status = BALLAST_ETIMEDOUT;
  __atomic_store_n(&running->end_tick, ballast::comm::trace_tick(), __ATOMIC_RELAXED);
  __atomic_store_n(&running->state, BALLAST_TRACE_FAILED, __ATOMIC_RELEASE);
  CHECK(pub.publish(*r) == 1);
  CHECK(pub.publish(*r) == 0);  // all told
  std::lock_guard<std::mutex> lock(bus.seen.mu);
  REQUIRE(bus.seen.topics.size() == 1);
  CHECK(bus.seen.topics[0] == "collective.record");
  CHECK(bus.seen.records[0].seq == 2);
  CHECK(bus.seen.records[0].state == BALLAST_COLL_FAILED);
  CHECK(bus.seen.records[0].status == BALLAST_ETIMEDOUT);
}

TEST_CASE("records written before the start are not news; records overwritten before a call are counted lost") {
  TraceRing* r = ring();
  add(r, 100, true);
  Bus bus;
  RingPublisher pub(&bus.api);
  pub.start_at(r->head(), r->skipped());
  CHECK(pub.publish(*r) == 0);
  const uint64_t first = r->head();
  for (uint64_t i = 0; i < r->capacity() + 10; ++i) add(r, 1000 + i, true);
  CHECK(pub.publish(*r) == int(r->capacity()));
  std::lock_guard<std::mutex> lock(bus.seen.mu);
  REQUIRE(bus.seen.records.size() == r->capacity());
  CHECK(bus.seen.records.front().seq == 1000 + 10);  // the 10 oldest were overwritten
  CHECK(bus.lost == 10);
  CHECK(bus.seen.records.back().seq == 1000 + r->capacity() + 9);
  CHECK(r->head() - first == r->capacity() + 10);
}

// A long operation in flight while three laps of short ones go by: the
// writers go round its slot (counted as skipped), it stays readable, its end
// is published, and only records really overwritten are counted lost.
TEST_CASE("a record in flight is gone round by the writers; its end is published; skipped indices are not lost") {
  TraceRing* r = ring();
  Bus bus;
  RingPublisher pub(&bus.api);
  pub.start_at(r->head(), r->skipped());
  const uint64_t cap = r->capacity();
  const uint64_t skipped = r->skipped();
  uint64_t long_index = 0;
  ballast_trace_slot* running = add(r, 7, false, &long_index);
  for (uint64_t i = 0; i < 3 * cap; ++i) add(r, 2000 + i, true);
  CHECK(r->skipped() - skipped == 3);  // once a lap
  ballast_trace_slot s;
  REQUIRE(r->read(long_index, &s));
  CHECK(s.seq == 7);
  CHECK(s.state == BALLAST_TRACE_STARTED);

  CHECK(pub.publish(*r) == int(cap));  // the running one and the cap - 1 newest
  {
    std::lock_guard<std::mutex> lock(bus.seen.mu);
    CHECK(bus.seen.records.front().seq == 7);
    CHECK(bus.seen.topics.front() == "collective.progress");
    CHECK(bus.seen.records.back().seq == 2000 + 3 * cap - 1);
  }
  // Overwritten: 3 cap written, cap - 1 published. The 3 indices skipped
  // count against them as the ones the counter cannot yet tell apart.
  CHECK(bus.lost <= int64_t(2 * cap + 1));
  bus.clear();

  __atomic_store_n(&running->end_tick, ballast::comm::trace_tick(), __ATOMIC_RELAXED);
  __atomic_store_n(&running->state, BALLAST_TRACE_DONE, __ATOMIC_RELEASE);
  CHECK(pub.publish(*r) == 1);
  for (uint64_t i = 0; i < cap; ++i) add(r, 9000 + i, true);  // every slot moves on, its own too
  CHECK(pub.publish(*r) == int(cap));
  std::lock_guard<std::mutex> lock(bus.seen.mu);
  REQUIRE(bus.seen.records.size() == cap + 1);
  CHECK(bus.seen.topics.front() == "collective.record");
  CHECK(bus.seen.records.front().seq == 7);
  CHECK(bus.seen.records.front().state == BALLAST_COLL_DONE);
  CHECK(bus.seen.records[1].seq == 9000);
  CHECK(bus.lost == int64_t(2 * cap + 1));  // exact once the skipped slot moved on
}

// Every slot in flight: the next operation goes unrecorded, and says so.
TEST_CASE("with every slot in flight, an operation goes unrecorded and is counted as dropped") {
  const std::string path = (std::filesystem::temp_directory_path() / "full-ring.btrace").string();
  std::string err;
  static TraceRing* r = nullptr;  // rings live as long as the process, as in a plugin
  r = TraceRing::create(path, 0, 1, &err);
  REQUIRE_MESSAGE(r, err);
  for (uint64_t i = 0; i < r->capacity(); ++i) add(r, i + 1, false);
  CHECK(r->skipped() == 0);
  uint64_t index = 0;
  CHECK(r->claim(&index) == nullptr);
  CHECK(r->dropped() == 1);
  CHECK(r->skipped() == r->capacity());
  CHECK(r->head() == 2 * r->capacity());
  std::filesystem::remove(path);
}

TEST_CASE("the built comm-nccl plugin starts its publisher in a host, and refuses a period that is not positive") {
  const std::string path = std::string(BALLAST_PLUGIN_DIR) + "/ballast-comm-nccl.so";
  ballast_host* host = nullptr;
  REQUIRE(ballast_host_create("test", &host) == BALLAST_OK);
  REQUIRE(ballast_host_start(host) == BALLAST_OK);
  // Loaded into a running host, a plugin is started at once.
  CHECK(ballast_host_load_plugin(host, path.c_str(), "{ publish_period_seconds = 0 }") == BALLAST_EPLUGIN);
  ballast_host_destroy(host);

  REQUIRE(ballast_host_create("test", &host) == BALLAST_OK);
  REQUIRE_MESSAGE(ballast_host_load_plugin(host, path.c_str(), "{ publish_period_seconds = 0.01 }") == BALLAST_OK,
                  ballast_last_error());
  Seen seen;
  uint64_t sub = 0;
  REQUIRE(ballast_host_subscribe(host, "collective.*", nullptr, on_event, &seen, &sub) == BALLAST_OK);
  REQUIRE(ballast_host_start(host) == BALLAST_OK);
  const void* table = nullptr;
  REQUIRE(ballast_host_get_interface(host, "comm-nccl", BALLAST_COMM_INTERFACE, BALLAST_COMM_VERSION, &table) ==
          BALLAST_OK);
  CHECK(table != nullptr);
  usleep(50000);               // several rounds of the timer over a process that has no ring yet
  ballast_host_destroy(host);  // cancels the timer
  std::lock_guard<std::mutex> lock(seen.mu);
  CHECK(seen.topics.empty());
}
