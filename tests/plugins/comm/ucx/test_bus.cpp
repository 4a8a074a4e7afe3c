// With a host present, comm-ucx publishes every operation of the process's
// communicators on the bus as collective.record (and collective.progress
// while one runs). The host loads the plugin; this program opens the same
// shared object for the comm table, as a trainer embedding the core would.
#include <doctest/doctest.h>

#include <ballast/comm.h>
#include <ballast/host.h>

#include "scratch_dir.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
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
};

int on_record(void* user, const ballast_event* e) {
  auto* seen = static_cast<Seen*>(user);
  if (e->schema != BALLAST_SCHEMA_COLLECTIVE_RECORD || std::string(e->topic) != "collective.record") return 0;
  std::lock_guard<std::mutex> lock(seen->mu);
  const auto* r = static_cast<const ballast_collective_record*>(e->payload);
  seen->records.push_back(*r);
  seen->ops.push_back(r->op);
  return 0;
}

}  // namespace

TEST_CASE("every operation appears on the bus as collective.record") {
  const std::string path = std::string(BALLAST_PLUGIN_DIR) + "/ballast-comm-ucx.so";
  ballast_host* host = nullptr;
  REQUIRE(ballast_host_create("test", &host) == BALLAST_OK);
  REQUIRE_MESSAGE(ballast_host_load_plugin(host, path.c_str(), "{ publish_period_seconds = 0.02 }") == BALLAST_OK,
                  ballast_last_error());
  Seen seen;
  uint64_t sub = 0;
  REQUIRE(ballast_host_subscribe(host, "collective.*", nullptr, on_record, &seen, &sub) == BALLAST_OK);
  REQUIRE(ballast_host_start(host) == BALLAST_OK);

  void* so = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  REQUIRE(so);
  auto entry = reinterpret_cast<ballast_plugin_entry_fn>(dlsym(so, BALLAST_PLUGIN_ENTRY));
  const ballast_plugin_descriptor* d = entry(BALLAST_ABI_MINOR);
  ballast_host_api api_host{};
  api_host.size = sizeof api_host;
  void* state = nullptr;
  REQUIRE(d->create(&api_host, &state) == BALLAST_OK);
  auto* api = static_cast<const ballast_comm_api*>(d->get_interface(state, BALLAST_COMM_INTERFACE, BALLAST_COMM_VERSION));
  REQUIRE(api);
  ballast_comm_config cfg{};
  cfg.size = sizeof cfg;
  cfg.rank = 0;
  cfg.nranks = 1;
  cfg.trace_dir = test::scratch().path().c_str();
  ballast_comm* comm = nullptr;
  REQUIRE_MESSAGE(api->init(state, &cfg, &comm) == BALLAST_OK, api->last_error(state));
  float in[4] = {1, 2, 3, 4}, out[4];
  ballast_comm_args a{};
  a.size = sizeof a;
  a.op = BALLAST_OP_ALLREDUCE;
  a.dtype = BALLAST_DT_F32;
  a.sendbuf = in;
  a.recvbuf = out;
  a.count = 4;
  for (int i = 0; i < 5; ++i) REQUIRE(api->run(comm, &a) == BALLAST_OK);
  ballast_comm_info info{};
  info.size = sizeof info;
  api->info(comm, &info);
  for (int i = 0; i < 100; ++i) {
    {
      std::lock_guard<std::mutex> lock(seen.mu);
      if (seen.records.size() >= 5) break;
    }
    usleep(20000);
  }
  ballast_host_unsubscribe(host, sub);
  ballast_host_destroy(host);
  std::lock_guard<std::mutex> lock(seen.mu);
  REQUIRE(seen.records.size() == 5);
  for (size_t i = 0; i < 5; ++i) {
    CHECK(seen.ops[i] == "allreduce");
    CHECK(seen.records[i].seq == i + 1);
    CHECK(seen.records[i].comm_id == info.comm_id);
    CHECK(seen.records[i].bytes == 16);
    CHECK(seen.records[i].state == BALLAST_COLL_DONE);
    CHECK(seen.records[i].end_ns >= seen.records[i].start_ns);
  }
  api->destroy(comm);
  d->destroy(state);
}
