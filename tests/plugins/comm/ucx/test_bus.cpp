// With a host present, comm-ucx publishes every operation of the process's
// communicators on the bus as collective.record (and collective.progress
// while one runs). The host loads the plugin; the comm table comes through
// the embedding API, as a trainer embedding the core gets it.
#include <doctest/doctest.h>

#include <ballast/comm.h>
#include <ballast/host.h>

#include "ranks.hpp"
#include "scratch_dir.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

// In sanitizer builds, LeakSanitizer's exit-time tracer crashes on the
// threads UCX leaves running in a process that loaded it (a tool
// incompatibility, not a leak), so this one program runs without it.
extern "C" const char* __asan_default_options() { return "detect_leaks=0"; }

namespace {

struct Seen {
  std::mutex mu;
  std::vector<ballast_collective_record> records;
  std::vector<std::string> ops;
  std::vector<ballast_collective_record> progress;  // collective.progress
};

int on_record(void* user, const ballast_event* e) {
  auto* seen = static_cast<Seen*>(user);
  if (e->schema != BALLAST_SCHEMA_COLLECTIVE_RECORD) return 0;
  std::lock_guard<std::mutex> lock(seen->mu);
  const auto* r = static_cast<const ballast_collective_record*>(e->payload);
  if (std::string(e->topic) == "collective.progress") {
    seen->progress.push_back(*r);
  } else if (std::string(e->topic) == "collective.record") {
    seen->records.push_back(*r);
    seen->ops.push_back(r->op);
  }
  return 0;
}

const std::string kPlugin = std::string(BALLAST_PLUGIN_DIR) + "/ballast-comm-ucx.so";

// The plugin's comm table, from a host of its own (host.h), as a trainer
// embedding the core gets it.
struct CommTable {
  ballast_host* host = nullptr;
  void* const state = nullptr;  // an embedder has no plugin state (comm.h)
  const ballast_comm_api* api = nullptr;

  CommTable() {
    REQUIRE(ballast_host_create("table", &host) == BALLAST_OK);
    REQUIRE_MESSAGE(ballast_host_load_plugin(host, kPlugin.c_str(), nullptr) == BALLAST_OK, ballast_last_error());
    const void* table = nullptr;
    REQUIRE(ballast_host_get_interface(host, "comm-ucx", BALLAST_COMM_INTERFACE, BALLAST_COMM_VERSION, &table) ==
            BALLAST_OK);
    api = static_cast<const ballast_comm_api*>(table);
  }
  ~CommTable() { ballast_host_destroy(host); }
  ballast_comm* init(int rank, int nranks, int port = 0) const {
    ballast_comm_config cfg{};
    cfg.size = sizeof cfg;
    cfg.rank = rank;
    cfg.nranks = nranks;
    cfg.master_addr = "127.0.0.1";
    cfg.master_port = port;
    cfg.timeout_ns = 20000000000;
    cfg.trace_dir = test::scratch().path().c_str();
    ballast_comm* comm = nullptr;
    if (api->init(state, &cfg, &comm) != BALLAST_OK) {
      FAIL_CHECK(api->last_error(state));
      return nullptr;
    }
    return comm;
  }
};

// A host running the plugin, its collective events collected.
struct BusHost {
  ballast_host* host = nullptr;
  Seen seen;
  uint64_t sub = 0;

  explicit BusHost(const char* config) {
    REQUIRE(ballast_host_create("test", &host) == BALLAST_OK);
    REQUIRE_MESSAGE(ballast_host_load_plugin(host, kPlugin.c_str(), config) == BALLAST_OK, ballast_last_error());
    REQUIRE(ballast_host_subscribe(host, "collective.*", nullptr, on_record, &seen, &sub) == BALLAST_OK);
    REQUIRE(ballast_host_start(host) == BALLAST_OK);
  }
  ~BusHost() {
    ballast_host_unsubscribe(host, sub);
    ballast_host_destroy(host);
  }
  // Waits up to 30 s for done() to hold, the lock held while it is asked.
  bool wait_for(const std::function<bool(const Seen&)>& done) {
    for (int i = 0; i < 1500; ++i) {
      {
        std::lock_guard<std::mutex> lock(seen.mu);
        if (done(seen)) return true;
      }
      usleep(20000);
    }
    return false;
  }
};

}  // namespace

// Rank 1 is another process that joins the allreduce 600 ms late: meanwhile
// rank 0's operation is in flight, and the timer publishes it as progress.
TEST_CASE("an operation in flight appears as collective.progress, then as collective.record") {
  const int port = test::reserve_ports(1);
  // First in this file: the fork comes before anything here started threads
  // (the host's, UCX's).
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    int rc = 1;
    {
      CommTable t;
      if (ballast_comm* comm = t.init(1, 2, port)) {
        usleep(600000);
        float in[1024] = {}, out[1024];
        ballast_comm_args a = test::args_of(BALLAST_OP_ALLREDUCE, in, out, 1024);
        rc = t.api->run(comm, &a) == BALLAST_OK ? 0 : 2;
        t.api->destroy(comm);
      }
    }
    _exit(rc);
  }
  {
    BusHost bus("{ publish_period_seconds = 0.02 }");
    CommTable t;
    ballast_comm* comm = t.init(0, 2, port);
    REQUIRE(comm);
    float in[1024], out[1024];
    for (int i = 0; i < 1024; ++i) in[i] = 1;
    ballast_comm_args a = test::args_of(BALLAST_OP_ALLREDUCE, in, out, 1024);
    CHECK(t.api->run(comm, &a) == BALLAST_OK);
    CHECK(out[1023] == 1);  // the child's zeros added
    CHECK(bus.wait_for([](const Seen& s) { return !s.records.empty(); }));
    t.api->destroy(comm);
    std::lock_guard<std::mutex> lock(bus.seen.mu);
    const Seen& seen = bus.seen;
    REQUIRE(!seen.progress.empty());
    REQUIRE(seen.records.size() == 1);
    for (const auto& p : seen.progress) {
      CHECK(p.seq == seen.records[0].seq);
      CHECK(p.comm_id == seen.records[0].comm_id);
      CHECK(p.end_ns == 0);
      CHECK((p.state == BALLAST_COLL_ISSUED || p.state == BALLAST_COLL_STARTED));
    }
    CHECK(seen.records[0].state == BALLAST_COLL_DONE);
    CHECK(seen.records[0].nranks == 2);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("every operation appears on the bus as collective.record") {
  BusHost bus("{ publish_period_seconds = 0.02 }");
  CommTable t;
  ballast_comm* comm = t.init(0, 1);
  REQUIRE(comm);
  float in[4] = {1, 2, 3, 4}, out[4];
  ballast_comm_args a = test::args_of(BALLAST_OP_ALLREDUCE, in, out, 4);
  for (int i = 0; i < 5; ++i) REQUIRE(t.api->run(comm, &a) == BALLAST_OK);
  ballast_comm_info info{};
  info.size = sizeof info;
  t.api->info(comm, &info);
  bus.wait_for([](const Seen& s) { return s.records.size() >= 5; });
  t.api->destroy(comm);
  std::lock_guard<std::mutex> lock(bus.seen.mu);
  const Seen& seen = bus.seen;
  REQUIRE(seen.records.size() == 5);
  for (size_t i = 0; i < 5; ++i) {
    CHECK(seen.ops[i] == "allreduce");
    CHECK(seen.records[i].seq == i + 1);
    CHECK(seen.records[i].comm_id == info.comm_id);
    CHECK(seen.records[i].bytes == 16);
    CHECK(seen.records[i].state == BALLAST_COLL_DONE);
    CHECK(seen.records[i].end_ns >= seen.records[i].start_ns);
  }
}

// More operations in one publish period than the ring's slots: the ones
// overwritten before the timer read them are counted, every other one
// published once.
TEST_CASE("records overwritten before the timer read them are counted as comm-ucx.records_lost") {
  BusHost bus("{ publish_period_seconds = 0.5 }");
  CommTable t;
  ballast_comm* comm = t.init(0, 1);
  REQUIRE(comm);
  float in[4] = {1, 2, 3, 4}, out[4];
  ballast_comm_args a = test::args_of(BALLAST_OP_ALLREDUCE, in, out, 4);
  constexpr int kOps = 5000;  // the ring holds 1024
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kOps; ++i) REQUIRE(t.api->run(comm, &a) == BALLAST_OK);
  // Each read of the timer while they ran (one per period), and the one
  // after, takes at most a ring's worth (usually they take one period).
  const double ran_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t reads = int64_t(ran_s / 0.5) + 2;
  int64_t lost = 0;
  const bool all = bus.wait_for([&](const Seen& s) {
    ballast_host_counter(bus.host, "comm-ucx.records_lost", &lost);
    return int64_t(s.records.size()) + lost >= kOps;
  });
  t.api->destroy(comm);
  std::lock_guard<std::mutex> lock(bus.seen.mu);
  CHECK(all);
  CHECK(lost >= kOps - reads * 1024);
  CHECK(int64_t(bus.seen.records.size()) + lost == kOps);
  for (size_t i = 1; i < bus.seen.records.size(); ++i) CHECK(bus.seen.records[i].seq > bus.seen.records[i - 1].seq);
}
