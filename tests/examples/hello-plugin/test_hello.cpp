// The hello example plugin, loaded by an embedding host (host.h): its
// hello.seen payload is valid JSON whatever the greeting and the subject hold.
#include <doctest/doctest.h>

#include <ballast/host.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

std::mutex g_mutex;
std::vector<std::string> g_payloads;

int on_seen(void*, const ballast_event* ev) {
  std::lock_guard lock(g_mutex);
  g_payloads.emplace_back(static_cast<const char*>(ev->payload), ev->payload_size);
  return BALLAST_OK;
}

}  // namespace

TEST_CASE("hello.seen is valid JSON with quotes, backslashes and control characters in greeting and subject") {
  ballast_host* host = nullptr;
  REQUIRE(ballast_host_create("test-node", &host) == BALLAST_OK);
  const std::string plugin = std::string(BALLAST_PLUGIN_DIR) + "/ballast-hello.so";
  REQUIRE_MESSAGE(
      ballast_host_load_plugin(host, plugin.c_str(), "{ greeting = 'say \"hi\"\\\\ \\n\\t' }") == BALLAST_OK,
      ballast_last_error());
  ballast_subscribe_options queued{};
  queued.size = sizeof queued;
  queued.delivery = BALLAST_DELIVER_QUEUED;
  uint64_t id = 0;
  REQUIRE(ballast_host_subscribe(host, "hello.seen", &queued, on_seen, nullptr, &id) == BALLAST_OK);
  REQUIRE(ballast_host_start(host) == BALLAST_OK);
  const nlohmann::json report = {{"stage", 0}, {"subject", "node \"7\"\u0001"}, {"kind", "outlier"}, {"score", 5}};
  REQUIRE(ballast_host_publish_json(host, "fault.suspected", report.dump().c_str()) == BALLAST_OK);
  for (int i = 0; i < 1000; ++i) {
    {
      std::lock_guard lock(g_mutex);
      if (!g_payloads.empty()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ballast_host_stop(host);
  ballast_host_destroy(host);
  std::lock_guard lock(g_mutex);
  REQUIRE(g_payloads.size() == 1);
  CAPTURE(g_payloads[0]);
  const auto j = nlohmann::json::parse(g_payloads[0], nullptr, false);
  REQUIRE_FALSE(j.is_discarded());
  CHECK(j["greeting"] == "say \"hi\"\\ \n\t");
  CHECK(j["subject"] == "node \"7\"\u0001");
}
