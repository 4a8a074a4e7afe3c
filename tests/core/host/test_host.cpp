// The host end to end with real plugins, a real Lua policy and a real bus:
// life cycle, the host API table, failing plugins, timers, policy actions,
// policy errors and reload, the journal.
#include "config_file.hpp"
#include "error.hpp"
#include "event_codec.hpp"
#include "host_config.hpp"
#include "journal.hpp"

#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

namespace fs = std::filesystem;
using namespace ballast;

namespace {

const std::string kHello = std::string(BALLAST_PLUGIN_DIR) + "/ballast-hello.so";

// Collects the events of one pattern (queued delivery) as JSON.
struct Collector {
  std::mutex mutex;
  std::vector<nlohmann::json> events;
  static int handler(void* user, const ballast_event* ev) {
    auto* c = static_cast<Collector*>(user);
    std::lock_guard lock(c->mutex);
    c->events.push_back(event_to_json(*ev));
    return 0;
  }
  size_t size() {
    std::lock_guard lock(mutex);
    return events.size();
  }
  nlohmann::json at(size_t i) {
    std::lock_guard lock(mutex);
    return events.at(i);
  }
  // Wait (bounded) until at least n events arrived.
  bool wait_for(size_t n, int max_ms = 5000) {
    for (int i = 0; i < max_ms / 5; ++i) {
      if (size() >= n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return size() >= n;
  }
};

uint64_t collect(Host& host, const char* pattern, Collector& c) {
  ballast_subscribe_options opts{sizeof opts, BALLAST_DELIVER_QUEUED, 0, 0};
  uint64_t id = 0;
  REQUIRE(host.subscribe(pattern, &opts, Collector::handler, &c, "test", &id) == BALLAST_OK);
  return id;
}

std::string write_file(const std::string& name, const std::string& text) {
  fs::path dir = fs::temp_directory_path() / ("ballast-host-" + std::to_string(getpid()));
  fs::create_directories(dir);
  fs::path p = dir / name;
  std::ofstream(p) << text;
  return p.string();
}

}  // namespace

TEST_CASE("a C plugin subscribes and publishes through the host API table") {
  Host host;
  REQUIRE(host.load_plugin(kHello, {{"greeting", "hi"}}) == BALLAST_OK);
  Collector seen;
  collect(host, "hello.seen", seen);
  REQUIRE(host.start() == BALLAST_OK);
  REQUIRE(host.publish_json("fault.suspected", R"({"stage":0,"subject":"gpu7","kind":"outlier","score":5})", "test") ==
          BALLAST_OK);
  REQUIRE(seen.wait_for(1));
  nlohmann::json ev = seen.at(0);
  CHECK(ev["topic"] == "hello.seen");
  CHECK(ev["source"]["plugin"] == "hello");
  CHECK(ev["payload"]["greeting"] == "hi");
  CHECK(ev["payload"]["subject"] == "gpu7");
  CHECK(host.counter("hello.seen") == 1);
  host.stop();
}

TEST_CASE("plugin timers fire until the plugin stops") {
  Host host;
  REQUIRE(host.load_plugin(kHello, {{"period_ms", 5}}) == BALLAST_OK);
  Collector ticks;
  collect(host, "hello.tick", ticks);
  REQUIRE(host.start() == BALLAST_OK);
  CHECK(ticks.wait_for(3));
  host.stop();
}

TEST_CASE("a plugin whose create fails is reported and the host keeps running") {
  Host host;
  CHECK(host.load_plugin(std::string(BALLAST_BINARY_DIR) + "/tests/loader-plugins/create_fails.so", {}) == BALLAST_EIO);
  std::string message = last_error();
  CHECK(message.find("createfails") != std::string::npos);
  CHECK(message.find("cannot reach the metrics endpoint") != std::string::npos);
  CHECK(host.load_plugin(kHello, {}) == BALLAST_OK);
  CHECK(host.plugin_count() == 1);
  CHECK(host.start() == BALLAST_OK);
  host.stop();
}

TEST_CASE("a plugin with bad config fails to create with a message naming the key") {
  Host host;
  CHECK(host.load_plugin(kHello, {{"period_ms", "soon"}}) != BALLAST_OK);
  CHECK(std::string(last_error()).find("period_ms") != std::string::npos);
}

TEST_CASE("a refused plugin file leaves the host usable") {
  Host host;
  CHECK(host.load_plugin(std::string(BALLAST_BINARY_DIR) + "/tests/loader-plugins/new_major.so", {}) ==
        BALLAST_EVERSION);
  CHECK(host.load_plugin(kHello, {}) == BALLAST_OK);
}

TEST_CASE("the policy turns events into recovery.action events") {
  Host host;
  std::string policy = write_file("evict.lua", R"(
    ballast.on("fault.confirmed", function(ev)
      return { action = "evict", subject = ev.payload.subject, reason = "confirmed " .. ev.payload.kind,
               args = { drain = true } }
    end)
  )");
  REQUIRE(host.load_policy(policy, {}) == BALLAST_OK);
  Collector actions;
  collect(host, "recovery.action", actions);
  REQUIRE(host.start() == BALLAST_OK);
  REQUIRE(host.publish_json("fault.confirmed", R"({"stage":1,"subject":"gpu3","kind":"xid"})", "test") == BALLAST_OK);
  REQUIRE(actions.wait_for(1));
  nlohmann::json a = actions.at(0)["payload"];
  CHECK(a["action"] == "evict");
  CHECK(a["subject"] == "gpu3");
  CHECK(a["reason"] == "confirmed xid");
  host.stop();
}

TEST_CASE("a failing policy publishes policy.error and the fallback action, and the host goes on") {
  Host host;
  std::string policy = write_file("broken.lua", R"(
    ballast.on("fault.confirmed", function(ev) local x = nil; return x.field end)
    ballast.on("job.state", function(ev) while true do end end)
  )");
  PolicyOptions options;
  options.fallback_action = "pause";
  options.call_deadline_ms = 50;
  REQUIRE(host.load_policy(policy, options) == BALLAST_OK);
  Collector actions, errors;
  collect(host, "recovery.action", actions);
  collect(host, "policy.error", errors);
  REQUIRE(host.start() == BALLAST_OK);
  REQUIRE(host.publish_json("fault.confirmed", R"({"stage":1,"subject":"gpu3"})", "test") == BALLAST_OK);
  REQUIRE(host.publish_json("job.state", R"({"state":"running"})", "test") == BALLAST_OK);
  REQUIRE(actions.wait_for(2));
  REQUIRE(errors.wait_for(2));
  CHECK(actions.at(0)["payload"]["action"] == "pause");
  CHECK(actions.at(1)["payload"]["action"] == "pause");
  CHECK(errors.at(0)["payload"]["message"].get<std::string>().find("broken.lua") != std::string::npos);
  host.stop();
}

TEST_CASE("a policy reloads while the host runs, and a broken reload keeps the old one") {
  Host host;
  std::string path = write_file("reload.lua", R"(ballast.on("job.state", function(ev) return {action="pause"} end))");
  REQUIRE(host.load_policy(path, {}) == BALLAST_OK);
  Collector actions;
  collect(host, "recovery.action", actions);
  REQUIRE(host.start() == BALLAST_OK);
  host.publish_json("job.state", "{}", "test");
  REQUIRE(actions.wait_for(1));
  write_file("reload.lua", R"(ballast.on("job.state", function(ev) return {action="checkpoint_now"} end))");
  REQUIRE(host.reload_policy() == BALLAST_OK);
  host.publish_json("job.state", "{}", "test");
  REQUIRE(actions.wait_for(2));
  CHECK(actions.at(1)["payload"]["action"] == "checkpoint_now");
  write_file("reload.lua", "this is not lua");
  CHECK(host.reload_policy() != BALLAST_OK);
  host.publish_json("job.state", "{}", "test");
  REQUIRE(actions.wait_for(3));
  CHECK(actions.at(2)["payload"]["action"] == "checkpoint_now");
  host.stop();
}

TEST_CASE("run() returns when another thread asks the host to stop") {
  Host host;
  REQUIRE(host.load_plugin(kHello, {}) == BALLAST_OK);
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    host.request_stop();
  });
  CHECK(host.run(false) == BALLAST_OK);
  stopper.join();
  CHECK_FALSE(host.running());
}

TEST_CASE("a config builds the host; the journal records the events") {
  std::string journal = write_file("events.journal", "");
  fs::remove(journal);
  std::string config_path =
      write_file("config.lua", "return { node = 'n1', journal = '" + journal + "', plugins = { { path = '" + kHello +
                                   "', config = { greeting = 'cfg' } } } }");
  nlohmann::json config;
  REQUIRE(eval_lua_table(config_path, false, &config) == BALLAST_OK);
  std::unique_ptr<Host> host;
  REQUIRE(host_from_config(config, fs::path(config_path).parent_path().string(), &host) == BALLAST_OK);
  CHECK(host->node() == "n1");
  REQUIRE(host->start() == BALLAST_OK);
  host->publish_json("fault.suspected", R"({"stage":0,"subject":"gpu1"})", "test");
  host->stop();
  host.reset();
  std::vector<std::string> topics;
  int rc = read_journal(
      journal, JournalMode::refuse_bad, [&](const OwnedEvent& ev, uint64_t) { topics.push_back(ev.view().topic); },
      [](const JournalProblem&) {});
  CHECK(rc == BALLAST_OK);
  REQUIRE(topics.size() == 2);
  CHECK(topics[0] == "fault.suspected");
  CHECK(topics[1] == "hello.seen");
}

TEST_CASE("publish_decoded: the journal takes the frame, unless publishing changed the event") {
  std::string journal = write_file("decoded.journal", "");
  fs::remove(journal);
  Host host;
  REQUIRE(host.open_journal(journal) == BALLAST_OK);
  REQUIRE(host.start() == BALLAST_OK);
  const char* payload = R"({"subject":"gpu3"})";
  auto event = [&](int64_t ts, const char* node, const char* plugin) {
    ballast_event ev{};
    ev.size = sizeof ev;
    ev.schema = BALLAST_SCHEMA_JSON;
    ev.topic = "fault.suspected";
    ev.ts_ns = ts;
    ev.source.node = node;
    ev.source.rank = 2;
    ev.source.plugin = plugin;
    ev.payload = payload;
    ev.payload_size = std::strlen(payload);
    return ev;
  };
  // As an agent sent them: the frame is the event the bus sees.
  std::vector<unsigned char> as_sent;
  encode_frame(event(111, "n7", "collect"), &as_sent);
  CHECK(host.publish_decoded(event(111, "n7", "collect"), "collect", as_sent.data(), as_sent.size()) == BALLAST_OK);
  // Publishing fills in the time and the node, and names the publisher: the
  // journal must hold what was published, not the frame.
  std::vector<unsigned char> stale;
  encode_frame(event(0, nullptr, "collect"), &stale);
  CHECK(host.publish_decoded(event(0, nullptr, "collect"), "collect", stale.data(), stale.size()) == BALLAST_OK);
  CHECK(host.publish_decoded(event(222, "n7", "collect"), "cluster", as_sent.data(), as_sent.size()) == BALLAST_OK);
  host.stop();
  std::vector<nlohmann::json> got;
  REQUIRE(read_journal(
              journal, JournalMode::refuse_bad,
              [&](const OwnedEvent& ev, uint64_t) { got.push_back(event_to_json(ev.view())); },
              [](const JournalProblem&) {}) == BALLAST_OK);
  REQUIRE(got.size() == 3);
  CHECK(got[0]["ts_ns"] == 111);
  CHECK(got[0]["source"]["node"] == "n7");
  CHECK(got[0]["source"]["plugin"] == "collect");
  CHECK(got[0]["payload"]["subject"] == "gpu3");
  CHECK(got[1]["ts_ns"] != 0);
  CHECK(got[1]["source"]["node"] == host.node());
  CHECK(got[2]["ts_ns"] == 222);
  CHECK(got[2]["source"]["plugin"] == "cluster");
  // The first is the frame as it came, byte for byte.
  std::ifstream in(journal, std::ios::binary);
  std::vector<unsigned char> head(as_sent.size());
  in.read(reinterpret_cast<char*>(head.data()), static_cast<std::streamsize>(head.size()));
  CHECK(head == as_sent);
}

TEST_CASE("config errors name the field") {
  std::unique_ptr<Host> host;
  CHECK(host_from_config({{"bus", {{"dispatcher_threads", 0}}}}, "/", &host) == BALLAST_EINVAL);
  CHECK(std::string(last_error()).find("bus.dispatcher_threads") != std::string::npos);
  CHECK(host_from_config({{"policy", {{"script", "x.lua"}, {"fallback", "explode"}}}}, "/", &host) == BALLAST_EINVAL);
  CHECK(std::string(last_error()).find("policy.fallback") != std::string::npos);
  CHECK(host_from_config({{"plugins", {42}}}, "/", &host) == BALLAST_EINVAL);
  CHECK(std::string(last_error()).find("plugins[1]") != std::string::npos);
}

TEST_CASE("a policy that also watches its own actions does not block its dispatcher on its own full queue") {
  HostOptions options;
  options.bus.default_queue_capacity = 8;  // small, so that the policy's queue fills up
  Host host(options);
  std::string policy = write_file("self.lua", R"(
    seen = 0
    ballast.on("recovery.action", function(ev) seen = seen + 1 end)
    ballast.on("job.state", function(ev) return { action = "checkpoint_now", reason = "tick" } end)
  )");
  REQUIRE(host.load_policy(policy, {}) == BALLAST_OK);
  Collector actions;
  collect(host, "recovery.action", actions);
  REQUIRE(host.start() == BALLAST_OK);
  for (int i = 0; i < 500; ++i) REQUIRE(host.publish_json("job.state", "{}", "test") == BALLAST_OK);
  CHECK(actions.wait_for(500, 20000));
  host.stop();
}

TEST_CASE("an embedder gets a loaded plugin's interface table through the C API") {
  ballast_host* h = nullptr;
  REQUIRE(ballast_host_create("n", &h) == BALLAST_OK);
  REQUIRE(ballast_host_load_plugin(h, (std::string(BALLAST_BINARY_DIR) + "/tests/loader-plugins/good.so").c_str(),
                                   nullptr) == BALLAST_OK);
  const void* table = nullptr;
  CHECK(ballast_host_get_interface(h, "good", "test.echo", 1, &table) == BALLAST_OK);
  CHECK(table != nullptr);
  CHECK(ballast_host_get_interface(h, "good", "test.echo", 2, &table) == BALLAST_ENOTFOUND);
  CHECK(ballast_host_get_interface(h, "other", "test.echo", 1, &table) == BALLAST_ENOTFOUND);
  ballast_host_destroy(h);
}

namespace {
struct LateApi {
  uint32_t size;
  int (*publish)();
  int (*ticks_during_stop)();
  int (*cancel_again)();
};
}  // namespace

TEST_CASE("plugin.h's stop(): timers cancelled before it, publish refused after it") {
  Host host;
  REQUIRE(host.load_plugin(std::string(HOST_PLUGIN_DIR) + "/late.so", {}) == BALLAST_OK);
  const auto* late = static_cast<const LateApi*>(host.get_interface("late", "test.late", 1));
  REQUIRE(late != nullptr);
  CHECK(host.get_interface("", "test.late", 1) == late);  // "": the first plugin that offers it
  REQUIRE(host.start() == BALLAST_OK);
  CHECK(late->publish() == BALLAST_OK);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  host.stop();
  CHECK(late->ticks_during_stop() == 0);
  CHECK(late->cancel_again() == BALLAST_OK);  // cancelled by the host already: not an error
  CHECK(late->publish() == BALLAST_ESTATE);
  CHECK(std::string(last_error()).find("publish after its stop() returned") != std::string::npos);
}

TEST_CASE("the policy is a subscriber like any plugin: its publications are events of the topic's struct") {
  Host host;
  std::string policy = write_file("publisher.lua", R"(
    ballast.on("job.state", function(ev)
      ballast.publish("fault.suspected", { stage = "suspected", subject = "gpu9", kind = "slow", score = 2.5 })
    end)
    ballast.on("job.bad", function(ev)
      ballast.publish("fault.suspected", { subject = 42 })
    end)
  )");
  REQUIRE(host.load_policy(policy, {}) == BALLAST_OK);
  Collector faults, errors;
  ballast_subscribe_options opts{sizeof opts, BALLAST_DELIVER_QUEUED, 0, 0};
  uint64_t id = 0;
  // The raw event, to see its schema.
  struct Raw {
    std::mutex mutex;
    std::vector<uint32_t> schemas;
    std::vector<std::string> sources;
    static int handler(void* user, const ballast_event* ev) {
      auto* r = static_cast<Raw*>(user);
      std::lock_guard lock(r->mutex);
      r->schemas.push_back(ev->schema);
      r->sources.emplace_back(ev->source.plugin ? ev->source.plugin : "");
      return 0;
    }
  } raw;
  REQUIRE(host.subscribe("fault.suspected", &opts, Raw::handler, &raw, "test", &id) == BALLAST_OK);
  collect(host, "fault.suspected", faults);
  collect(host, "policy.error", errors);
  REQUIRE(host.start() == BALLAST_OK);
  REQUIRE(host.publish_json("job.state", "{}", "test") == BALLAST_OK);
  REQUIRE(faults.wait_for(1));
  CHECK(faults.at(0)["payload"]["subject"] == "gpu9");
  CHECK(faults.at(0)["payload"]["score"] == 2.5);
  {
    std::lock_guard lock(raw.mutex);
    REQUIRE(raw.schemas.size() == 1);
    CHECK(raw.schemas[0] == BALLAST_SCHEMA_FAULT_REPORT);
    CHECK(raw.sources[0] == "policy");
  }
  // A payload that does not fit the topic's struct is the script's error,
  // naming the field.
  REQUIRE(host.publish_json("job.bad", "{}", "test") == BALLAST_OK);
  REQUIRE(errors.wait_for(1));
  const std::string message = errors.at(0)["payload"]["message"];
  CHECK(message.find("publisher.lua") != std::string::npos);
  CHECK(message.find("payload.subject: expected a string") != std::string::npos);
  host.stop();
}
