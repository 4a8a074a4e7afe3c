// The plugin as the host sees it: loaded with dlopen, created with a host
// table implemented here, fed the real traces as step.timing batches through
// its subscription handler; checks the straggler.report events it publishes.
#include <doctest/doctest.h>

#include <ballast/command.h>
#include <ballast/events.h>
#include <ballast/plugin.h>
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "data.hpp"
#include "trace.hpp"

using namespace ballast::straggler;
using straggler_test::data;

namespace {

struct Report {
  double slowdown;
  std::string kind;
  std::vector<std::pair<std::string, std::string>> culprits;  // dimension, name
  int64_t first_step, last_step;
};

// The host side, as small as the plugin needs: the api table comes first so
// that the pointer handed to the plugin leads back here.
struct TestHost {
  ballast_host_api api{};
  std::map<std::string, std::string> config;
  ballast_handler handler = nullptr;
  void* user = nullptr;
  std::string pattern;
  uint32_t delivery = 0;
  bool unsubscribed = false;
  std::vector<Report> reports;
  std::map<std::string, int64_t> counters;
  std::string error;

  TestHost() {
    api.size = sizeof api;
    api.abi_minor = BALLAST_ABI_MINOR;
    api.publish = [](const ballast_host_api* a, const ballast_event* ev) {
      auto* h = self(a);
      REQUIRE(std::string(ev->topic) == "straggler.report");
      REQUIRE(ev->schema == BALLAST_SCHEMA_STRAGGLER_REPORT);
      const auto* r = static_cast<const ballast_straggler_report*>(ev->payload);
      REQUIRE(r->size == sizeof(ballast_straggler_report));
      Report copy{r->slowdown, r->kind, {}, r->first_step, r->last_step};
      for (uint32_t i = 0; i < r->count; ++i) {
        copy.culprits.emplace_back(r->culprits[i].dimension, r->culprits[i].name);
        if (i > 0) CHECK(r->culprits[i].slowdown <= r->culprits[i - 1].slowdown);
      }
      h->reports.push_back(copy);
      return static_cast<int>(BALLAST_OK);
    };
    api.subscribe = [](const ballast_host_api* a, const char* pattern, const ballast_subscribe_options* o,
                       ballast_handler handler, void* user, uint64_t* id) {
      auto* h = self(a);
      h->pattern = pattern;
      h->delivery = o ? o->delivery : static_cast<uint32_t>(BALLAST_DELIVER_INLINE);
      h->handler = handler;
      h->user = user;
      *id = 7;
      return static_cast<int>(BALLAST_OK);
    };
    api.unsubscribe = [](const ballast_host_api* a, uint64_t id) {
      CHECK(id == 7);
      self(a)->unsubscribed = true;
      return static_cast<int>(BALLAST_OK);
    };
    api.log = [](const ballast_host_api*, int, const char* msg) { MESSAGE(msg); };
    api.config_get = [](const ballast_host_api* a, const char* key, const char** value) {
      auto& c = self(a)->config;
      auto it = c.find(key);
      if (it == c.end()) return static_cast<int>(BALLAST_ENOTFOUND);
      *value = it->second.c_str();
      return static_cast<int>(BALLAST_OK);
    };
    api.counter_add = [](const ballast_host_api* a, const char* name, int64_t delta) {
      self(a)->counters[name] += delta;
      return static_cast<int>(BALLAST_OK);
    };
    api.now_ns = [](const ballast_host_api*) { return int64_t{0}; };
    api.set_error = [](const ballast_host_api* a, const char* msg) { self(a)->error = msg; };
    api.last_error = [](const ballast_host_api* a) { return self(a)->error.c_str(); };
  }
  static TestHost* self(const ballast_host_api* a) {
    return reinterpret_cast<TestHost*>(const_cast<ballast_host_api*>(a));
  }
};

const ballast_plugin_descriptor* load_plugin() {
  std::string path = std::string(BALLAST_PLUGIN_DIR) + "/ballast-straggler.so";
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);  // never closed, as the host does
  REQUIRE_MESSAGE(handle, dlerror());
  auto entry = reinterpret_cast<ballast_plugin_entry_fn>(dlsym(handle, BALLAST_PLUGIN_ENTRY));
  REQUIRE(static_cast<bool>(entry));
  const ballast_plugin_descriptor* d = entry(BALLAST_ABI_MINOR);
  REQUIRE(d);
  return d;
}

// Publishes a trace step by step, one batch per rank and step, as ranks would.
void feed(TestHost& host, const Trace& trace) {
  std::map<int64_t, std::map<int32_t, std::vector<ballast_op_timing>>> batches;
  std::vector<std::string> names;
  for (const TraceRow& r : trace.rows) {
    batches[r.step][r.rank].push_back(
        {r.dp_rank, r.stage, r.rank, r.step, nullptr, r.start, r.duration, r.seq_id, r.mc, r.mb_id, r.gmc});
    batches[r.step][r.rank].back().optype = optype_name(r.optype).data();  // names are NUL-terminated literals
  }
  for (auto& [step, ranks] : batches) {
    for (auto& [rank, ops] : ranks) {
      ballast_op_timing_batch batch{sizeof batch, static_cast<uint32_t>(ops.size()), ops.data()};
      ballast_event ev{};
      ev.size = sizeof ev;
      ev.schema = BALLAST_SCHEMA_OP_TIMING_BATCH;
      ev.topic = "step.timing";
      ev.source.rank = rank;
      ev.payload = &batch;
      ev.payload_size = sizeof batch;
      REQUIRE(host.handler(host.user, &ev) == BALLAST_OK);
    }
  }
}

struct Running {
  const ballast_plugin_descriptor* d;
  void* state = nullptr;
  Running(const ballast_plugin_descriptor* desc, TestHost& host) : d(desc) {
    REQUIRE(d->create(&host.api, &state) == BALLAST_OK);
    REQUIRE(d->start(state) == BALLAST_OK);
  }
  ~Running() {
    d->stop(state);
    d->destroy(state);
  }
};

}  // namespace

TEST_CASE("the descriptor offers the whatif command") {
  const ballast_plugin_descriptor* d = load_plugin();
  CHECK(std::string(d->name) == "straggler");
  CHECK(std::string(d->kind) == "detector");
  REQUIRE(d->interfaces);
  CHECK(std::string(d->interfaces[0].name) == BALLAST_COMMAND_INTERFACE);
  TestHost host;
  void* state = nullptr;
  REQUIRE(d->create(&host.api, &state) == BALLAST_OK);
  auto* table = static_cast<const ballast_command_table*>(d->get_interface(state, BALLAST_COMMAND_INTERFACE, 1));
  REQUIRE(table);
  REQUIRE(table->count == 1);
  CHECK(std::string(table->commands[0].name) == "whatif");
  CHECK(d->get_interface(state, BALLAST_COMMAND_INTERFACE, 2) == nullptr);
  d->destroy(state);
}

TEST_CASE("AR through the bus handler: reports every 10 steps name the slow worker") {
  TestHost host;
  Running plugin(load_plugin(), host);
  CHECK(host.pattern == "step.timing");
  CHECK(host.delivery == BALLAST_DELIVER_QUEUED);
  feed(host, read_trace(data("AR", "trace.csv.gz")));
  // 44 steps: 43 complete (the last one never is), a report every 10.
  REQUIRE(host.reports.size() == 4);
  for (const Report& r : host.reports) {
    CHECK(r.kind == "worker");
    CHECK(r.slowdown == doctest::Approx(1.973).epsilon(0.02));
    // The slow worker (rank 0: dp_rank 0, stage 0) leads the culprits.
    std::vector<std::pair<std::string, std::string>> top(r.culprits.begin(), r.culprits.begin() + 3);
    CHECK(std::find(top.begin(), top.end(), std::pair<std::string, std::string>{"rank", "0"}) != top.end());
    CHECK(std::find(top.begin(), top.end(), std::pair<std::string, std::string>{"stage", "0"}) != top.end());
    CHECK(std::find(top.begin(), top.end(), std::pair<std::string, std::string>{"dp_rank", "0"}) != top.end());
  }
  CHECK(host.reports[1].last_step > host.reports[0].last_step);
}

TEST_CASE("ST with a rank sending garbage: stage imbalance, garbage counted") {
  TestHost host;
  host.config = {{"window_steps", "16"}, {"report_every", "8"}};
  Running plugin(load_plugin(), host);
  Trace st = read_trace(data("ST", "trace.csv.gz"));

  ballast_op_timing junk[3] = {
      {0, 0, 0, 23, "warp-drive", 0.1, 0.1, 0, 0, 0, 0},
      {0, 0, 0, 23, "forward-compute", NAN, 0.1, 0, 0, 0, 0},
      {0, 0, 0, 23, "forward-compute", 0.1, -1.0, 0, 0, 0, 0},
  };
  ballast_op_timing_batch batch{sizeof batch, 3, junk};
  ballast_event ev{};
  ev.size = sizeof ev;
  ev.schema = BALLAST_SCHEMA_OP_TIMING_BATCH;
  ev.topic = "step.timing";
  ev.payload = &batch;
  ev.payload_size = sizeof batch;
  CHECK(host.handler(host.user, &ev) == BALLAST_OK);
  CHECK(host.counters["rejected_ops"] == 3);

  ev.schema = BALLAST_SCHEMA_JSON;  // not an op batch
  CHECK(host.handler(host.user, &ev) == BALLAST_EINVAL);

  feed(host, st);
  // 32 steps: 31 complete, a report every 8.
  REQUIRE(host.reports.size() == 3);
  for (const Report& r : host.reports) {
    CHECK(r.kind == "stage");
    CHECK(r.culprits.front() == std::pair<std::string, std::string>{"stage", "3"});
    CHECK(r.last_step - r.first_step >= 8);
  }
}

TEST_CASE("a bad configuration value fails create with a message") {
  const ballast_plugin_descriptor* d = load_plugin();
  TestHost host;
  host.config = {{"window_steps", "many"}};
  void* state = nullptr;
  CHECK(d->create(&host.api, &state) == BALLAST_EINVAL);
  CHECK(host.error.find("window_steps") != std::string::npos);
}
