// A v1 reader accepts v1 structs (status.h, "Sizes"): today's host loads a
// plugin built against ABI headers whose ballast_fault_report and
// ballast_subscribe_options are one field shorter than today's (an older 1.x
// minor) and one built against headers where they are one field longer (a
// newer one). Both are accepted; the fields the shorter one leaves out read
// as their default, and every reader (queued copy, inline JSON, Lua policy,
// journal frame) sees the same report.
#include "error.hpp"
#include "event_codec.hpp"
#include "host.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

using namespace ballast;

namespace {

struct Seen {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<OwnedEvent> events;
  std::vector<nlohmann::json> inline_json;  // event_to_json of the publisher's own struct

  static int queued(void* user, const ballast_event* e) {
    auto* s = static_cast<Seen*>(user);
    std::lock_guard lock(s->mu);
    s->events.emplace_back(*e);
    s->cv.notify_all();
    return 0;
  }
  static int inline_handler(void* user, const ballast_event* e) {
    auto* s = static_cast<Seen*>(user);
    std::lock_guard lock(s->mu);
    s->inline_json.push_back(event_to_json(*e));
    return 0;
  }
  bool wait_for(size_t n) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(20), [&] { return events.size() >= n; });
  }
};

std::string policy_file() {
  const auto path = std::filesystem::temp_directory_path() / "compat-policy.lua";
  std::ofstream(path) << "ballast.on('fault.confirmed', function(ev)\n"
                         "  local p = ev.payload\n"
                         "  return {action = 'evict', subject = p.subject,\n"
                         "          reason = p.kind .. ' ' .. tostring(p.detector) .. ' ' .. p.evidence.z}\n"
                         "end)\n";
  return path.string();
}

}  // namespace

TEST_CASE("a plugin built against a struct one field shorter or longer than today's is accepted") {
  for (const std::string variant : {"shorter", "longer"}) {
    CAPTURE(variant);
    HostOptions options;
    options.log_level = BALLAST_LOG_WARN;
    options.node = "abi-node";
    Host host(options);
    Seen faults, actions;
    const ballast_subscribe_options queued{sizeof queued, BALLAST_DELIVER_QUEUED, 0, 0};
    uint64_t id = 0;
    REQUIRE(host.subscribe("fault.confirmed", &queued, Seen::queued, &faults, "test", &id) == BALLAST_OK);
    REQUIRE(host.subscribe("fault.confirmed", nullptr, Seen::inline_handler, &faults, "test", &id) == BALLAST_OK);
    REQUIRE(host.subscribe("recovery.action", &queued, Seen::queued, &actions, "test", &id) == BALLAST_OK);
    REQUIRE(host.load_policy(policy_file(), PolicyOptions{}) == BALLAST_OK);
    const std::string name = "compat-" + variant;
    REQUIRE(host.load_plugin(std::string(COMPAT_PLUGIN_DIR) + "/" + name + ".so", nlohmann::json::object()) ==
            BALLAST_OK);
    REQUIRE(host.start() == BALLAST_OK);
    const bool delivered = faults.wait_for(1) && actions.wait_for(1);
    host.stop();
    CHECK(host.counter(name + ".refused") == 0);
    CHECK(host.counter(name + ".published") == 1);
    CHECK(host.counter(name + ".subscribe_refused") == 0);
    CHECK(host.counter(name + ".subscribed") == 1);
    // A 1.0 plugin has no node_name to read; a later one reads the host's node.
    CHECK(host.counter(name + ".node_named") == (variant == "shorter" ? 0 : 1));
    // A 1.2 plugin asks to act; a host without a fence always lets it.
    CHECK(host.counter(name + ".fence_ok") == (variant == "shorter" ? 0 : 1));
    CHECK(host.counter(name + ".fence_fenced") == 0);
    CHECK(host.counter("fence.allowed") == (variant == "shorter" ? 0 : 1));
    REQUIRE(delivered);

    const char* detector = variant == "shorter" ? nullptr : "compat";
    // The queued copy: this host's whole struct, the left-out field at its default.
    const ballast_event& ev = faults.events.at(0).view();
    REQUIRE(ev.payload_size == sizeof(ballast_fault_report));
    const auto& r = *static_cast<const ballast_fault_report*>(ev.payload);
    CHECK(r.size == sizeof r);
    CHECK(std::string(r.subject) == "node7");
    CHECK(r.rank == 3);
    CHECK(std::string(r.kind) == "outlier");
    CHECK(r.detected_ns == 2000);
    CHECK(std::string(r.evidence) == "{\"z\":6.5}");
    if (detector == nullptr) {
      CHECK(r.detector == nullptr);
    } else {
      REQUIRE(r.detector != nullptr);
      CHECK(std::string(r.detector) == detector);
    }

    // The publisher's own struct, read inline.
    REQUIRE(faults.inline_json.size() == 1);
    const nlohmann::json& j = faults.inline_json[0];
    CHECK(!j.contains("payload_error"));
    CHECK(j["payload"]["subject"] == "node7");
    CHECK(j["payload"]["detector"] == (detector ? nlohmann::json(detector) : nlohmann::json(nullptr)));

    // The Lua policy read it, and the journal's frame carries it.
    const auto& action = *static_cast<const ballast_recovery_action*>(actions.events.at(0).view().payload);
    CHECK(std::string(action.subject) == "node7");
    CHECK(std::string(action.reason) == std::string("outlier ") + (detector ? detector : "nil") + " 6.5");
    std::vector<unsigned char> frame;
    encode_frame(ev, &frame);
    OwnedEvent back;
    size_t used = 0;
    std::string error;
    REQUIRE(decode_frame(frame.data(), frame.size(), &back, &used, &error) == BALLAST_OK);
    CHECK(event_to_json(back.view())["payload"] == event_to_json(ev)["payload"]);
  }
}

TEST_CASE("fence_action: a plugin is told BALLAST_EFENCED when the host's fence refuses, and the host counts it") {
  HostOptions options;
  options.log_level = BALLAST_LOG_ERROR;
  Host host(options);
  std::vector<std::string> asked;
  bool leading = false;
  host.set_action_fence([&](const std::string& plugin, const std::string& kind, const nlohmann::json& record) {
    asked.push_back(plugin + " " + kind + " " + record.dump());
    return leading ? BALLAST_OK : fail(BALLAST_EFENCED, "not the leader");
  });
  REQUIRE(host.load_plugin(std::string(COMPAT_PLUGIN_DIR) + "/compat-longer.so", nlohmann::json::object()) ==
          BALLAST_OK);
  REQUIRE(host.start() == BALLAST_OK);
  host.stop();
  CHECK(host.counter("compat-longer.fence_fenced") == 1);
  CHECK(host.counter("compat-longer.fence_ok") == 0);
  CHECK(host.counter("fence.refused") == 1);
  CHECK(host.counter("fence.allowed") == 0);
  REQUIRE(asked.size() == 1);
  CHECK(asked[0] == R"(compat-longer compat.act {"node":"node7","why":"test"})");

  // The same host once it leads; and what the host refuses before asking the fence.
  leading = true;
  CHECK(host.fence_action("p", "drain", R"({"node":"n1"})") == BALLAST_OK);
  CHECK(host.counter("fence.allowed") == 1);
  CHECK(host.fence_action("p", "Drain!", "{}") == BALLAST_EINVAL);
  CHECK(std::string(last_error()).find("kind 'Drain!'") != std::string::npos);
  CHECK(host.fence_action("p", "drain", "[1]") == BALLAST_EINVAL);
  CHECK(std::string(last_error()).find("not a JSON object") != std::string::npos);
  CHECK(host.fence_action("p", "drain", std::string(70000, ' ').c_str()) == BALLAST_EINVAL);
  CHECK(std::string(last_error()).find("above 64 KiB") != std::string::npos);
  CHECK(host.fence_action("p", nullptr, "{}") == BALLAST_EINVAL);
  // A snapshot (a plugin's whole state: a large job's node list) may be larger than an action's
  // record, up to 1 MiB.
  const std::string nodes = "{\"nodes\":\"" + std::string(200 * 1024, 'n') + "\"}";
  CHECK(host.fence_action("p", "slurm.snapshot", nodes.c_str()) == BALLAST_OK);
  CHECK(host.fence_action("p", "slurm.drain", nodes.c_str()) == BALLAST_EINVAL);
  const std::string huge = "{\"nodes\":\"" + std::string(1100 * 1024, 'n') + "\"}";
  CHECK(host.fence_action("p", "slurm.snapshot", huge.c_str()) == BALLAST_EINVAL);
  CHECK(std::string(last_error()).find("above 1 MiB") != std::string::npos);
  CHECK(host.counter("fence.refused") == 7);
  CHECK(asked.size() == 3);
  // Removed: every action may run again.
  leading = false;
  host.set_action_fence({});
  CHECK(host.fence_action("p", "drain", "{}") == BALLAST_OK);
}

TEST_CASE("a struct shorter than its v1 size is still refused, with the reason") {
  ballast_fault_report r{};
  r.size = BALLAST_FAULT_REPORT_V1_SIZE - 8;
  ballast_event e{};
  e.size = sizeof e;
  e.schema = BALLAST_SCHEMA_FAULT_REPORT;
  e.topic = "fault.confirmed";
  e.payload = &r;
  e.payload_size = sizeof r;
  Host host;
  CHECK(host.publish(e, "test") == BALLAST_EINVAL);
  CHECK(std::string(last_error()).find("v1 size") != std::string::npos);
  ballast_subscribe_options o{BALLAST_SUBSCRIBE_OPTIONS_V1_SIZE - 4, BALLAST_DELIVER_QUEUED, 0, 0};
  uint64_t id = 0;
  CHECK(host.subscribe("a.b", &o, Seen::queued, nullptr, "test", &id) == BALLAST_EINVAL);
  CHECK(std::string(last_error()).find("smaller than ballast_subscribe_options v1") != std::string::npos);
}
