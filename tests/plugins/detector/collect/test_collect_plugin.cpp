// The collector as a plugin in the real host: batches of real samples on the
// bus, named after the configured node (else the host's node), and one log
// line when NVML is absent.
#include <doctest/doctest.h>

#include <ballast/host.h>
#include <unistd.h>

#include <chrono>
#include <mutex>
#include <set>
#include <string>
#include <thread>

namespace {

struct Seen {
  std::mutex mu;
  int batches = 0;
  std::set<std::string> metrics, nodes;
  int flagged = 0;
};

int on_batch(void* user, const ballast_event* ev) {
  auto* seen = static_cast<Seen*>(user);
  if (ev->schema != BALLAST_SCHEMA_METRIC_BATCH) return 0;
  const auto* b = static_cast<const ballast_metric_batch*>(ev->payload);
  std::lock_guard<std::mutex> lock(seen->mu);
  ++seen->batches;
  for (uint32_t i = 0; i < b->count; ++i) {
    seen->metrics.insert(b->samples[i].metric);
    seen->nodes.insert(b->samples[i].node);
    if (b->samples[i].flags & (BALLAST_SAMPLE_INVALID | BALLAST_SAMPLE_COUNTER_RESET)) ++seen->flagged;
  }
  return 0;
}

}  // namespace

TEST_CASE("the collector publishes real node and process metrics") {
  ballast_host* host = nullptr;
  REQUIRE(ballast_host_create("n1", &host) == BALLAST_OK);
  std::string config = "{ period = 0.1, node = 'gpu-node-7', pids = { " + std::to_string(getpid()) + " } }";
  REQUIRE(ballast_host_load_plugin(host, BALLAST_PLUGIN_DIR "/ballast-collect.so", config.c_str()) == BALLAST_OK);
  Seen seen;
  uint64_t id = 0;
  REQUIRE(ballast_host_subscribe(host, "metric.sample", nullptr, on_batch, &seen, &id) == BALLAST_OK);
  REQUIRE(ballast_host_start(host) == BALLAST_OK);
  for (int i = 0; i < 100; ++i) {  // until three batches came, at most 10 s
    {
      std::lock_guard<std::mutex> lock(seen.mu);
      if (seen.batches >= 3) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ballast_host_destroy(host);
  REQUIRE(seen.batches >= 3);
  CHECK(seen.nodes == std::set<std::string>{"gpu-node-7"});
  for (const char* m : {"cpu.user", "mem.used_bytes", "load.1", "net.lo.rx_bytes", "proc.cpu", "proc.rss_bytes"}) {
    INFO(m);
    CHECK(seen.metrics.count(m));
  }
  CHECK(seen.flagged == 0);
}

TEST_CASE("without a node of its own the collector names its samples after the host's node, not the machine") {
  ballast_host* host = nullptr;
  REQUIRE(ballast_host_create("host-node-3", &host) == BALLAST_OK);
  REQUIRE(ballast_host_load_plugin(host, BALLAST_PLUGIN_DIR "/ballast-collect.so", "{ period = 0.05 }") == BALLAST_OK);
  Seen seen;
  uint64_t id = 0;
  REQUIRE(ballast_host_subscribe(host, "metric.sample", nullptr, on_batch, &seen, &id) == BALLAST_OK);
  REQUIRE(ballast_host_start(host) == BALLAST_OK);
  for (int i = 0; i < 100; ++i) {  // until a sample came, at most 10 s
    {
      std::lock_guard<std::mutex> lock(seen.mu);
      if (!seen.nodes.empty()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ballast_host_destroy(host);
  CHECK(seen.nodes == std::set<std::string>{"host-node-3"});
}

TEST_CASE("a bad configuration is refused with the key named") {
  ballast_host* host = nullptr;
  REQUIRE(ballast_host_create("n1", &host) == BALLAST_OK);
  CHECK(ballast_host_load_plugin(host, BALLAST_PLUGIN_DIR "/ballast-collect.so", "{ pids = 'abc' }") != BALLAST_OK);
  CHECK(std::string(ballast_last_error()).find("pids") != std::string::npos);
  CHECK(ballast_host_load_plugin(host, BALLAST_PLUGIN_DIR "/ballast-collect.so", "{ period = 0 }") != BALLAST_OK);
  CHECK(std::string(ballast_last_error()).find("period") != std::string::npos);
  ballast_host_destroy(host);
}
