// Event codec: deep copies, JSON and frames for every well-known schema.
#include <doctest/doctest.h>

#include "event_codec.hpp"

#include <cereal/archives/portable_binary.hpp>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

using namespace ballast;

namespace {

std::string s(const char* p) { return p != nullptr ? p : "<null>"; }

// One sample event per schema, built from local storage, and a check that
// reads every field of the payload back by hand (not through the codec's
// field tables, so that a table mistake shows up here).
struct Case {
  const char* topic;
  uint32_t schema;
  std::function<ballast_event()> make;
  std::function<void(const ballast_event&)> check;
};

ballast_event base(const char* topic, uint32_t schema, const void* payload, uint64_t size) {
  ballast_event ev{};
  ev.size = sizeof ev;
  ev.schema = schema;
  ev.topic = topic;
  ev.ts_ns = 1700000000123456789;
  ev.source = {"node-7", 12, "machine"};
  ev.payload = payload;
  ev.payload_size = size;
  return ev;
}

ballast_metric_sample g_samples[3] = {{"node-7", "cpu.user", 11, 0.25, 0},
                                      {nullptr, "gpu0.util", 12, NAN, BALLAST_SAMPLE_INVALID},
                                      {"node-8", "net.eth0.rx_bytes", -13, 1e300, BALLAST_SAMPLE_COUNTER}};
ballast_metric_batch g_batch = {sizeof(ballast_metric_batch), 3, g_samples};
ballast_op_timing g_ops[2] = {{1, 2, 3, 100, "forward-compute", 1.5, 0.25, 4, 0, 7, 8},
                              {0, 0, 0, -1, nullptr, 0, 0, 0, -1, -1, -1}};
ballast_op_timing_batch g_op_batch = {sizeof(ballast_op_timing_batch), 2, g_ops};
ballast_collective_record g_coll = {sizeof(ballast_collective_record),
                                    BALLAST_COLL_FAILED,
                                    77,
                                    5,
                                    "allreduce",
                                    "bf16",
                                    nullptr,
                                    1024,
                                    2048,
                                    3,
                                    8,
                                    -1,
                                    BALLAST_EPEER,
                                    10,
                                    20,
                                    30,
                                    1,
                                    2,
                                    3,
                                    4};
ballast_fault_report g_fault = {sizeof(ballast_fault_report),
                                BALLAST_FAULT_CONFIRMED,
                                "node-3",
                                24,
                                "outlier",
                                "cpu.user",
                                3.5,
                                0.9,
                                100,
                                200,
                                "{\"distance\":3.5,\"peers\":[1,2]}",
                                "machine"};
ballast_placement_node g_nodes[2] = {{"n0", 0, 0, 0}, {"n1", 1, 0, 8}};
ballast_placement_plan g_plan = {sizeof(ballast_placement_plan), 2, "job-1", "greedy", g_nodes, 1, 2, 3.25, 3.0};
ballast_recovery_action g_action = {sizeof(ballast_recovery_action),
                                    0,
                                    "evict",
                                    "node-3",
                                    "faulty machine",
                                    "{\"grace_s\":30}",
                                    "default",
                                    "fault.confirmed"};
ballast_startup_stage g_stage = {
    sizeof(ballast_startup_stage), BALLAST_OK, "checkpoint_load", "node-1", 5, 1000, 5000, 1ull << 40};
ballast_straggler_culprit g_culprits[1] = {{"optype", "forward-compute", 1.75}};
ballast_straggler_report g_straggler = {sizeof(ballast_straggler_report), 1, 1.9, 1.1, "worker", g_culprits, 10, 20};
// Keys in sorted order: JSON text goes through nlohmann::json, which sorts them.
const char g_json[] = "{\"n\":[1,2,3],\"state\":\"running\"}";
const unsigned char g_bytes[5] = {0, 1, 0xfe, 0xff, 0x42};

template <typename T>
const T& as(const ballast_event& ev) {
  REQUIRE(ev.payload != nullptr);
  REQUIRE(ev.payload_size == sizeof(T));
  return *static_cast<const T*>(ev.payload);
}

std::vector<Case> cases() {
  std::vector<Case> c;
  c.push_back({"metric.sample", BALLAST_SCHEMA_METRIC_BATCH,
               [] { return base("metric.sample", BALLAST_SCHEMA_METRIC_BATCH, &g_batch, sizeof g_batch); },
               [](const ballast_event& ev) {
                 const auto& b = as<ballast_metric_batch>(ev);
                 CHECK(b.size == sizeof b);
                 REQUIRE(b.count == 3);
                 CHECK(s(b.samples[0].node) == "node-7");
                 CHECK(s(b.samples[0].metric) == "cpu.user");
                 CHECK(b.samples[0].ts_ns == 11);
                 CHECK(b.samples[0].value == 0.25);
                 CHECK(b.samples[1].node == nullptr);
                 CHECK(std::isnan(b.samples[1].value));
                 CHECK(b.samples[1].flags == BALLAST_SAMPLE_INVALID);
                 CHECK(b.samples[2].ts_ns == -13);
                 CHECK(b.samples[2].value == 1e300);
                 CHECK(s(b.samples[2].metric) == "net.eth0.rx_bytes");
                 CHECK(b.samples[2].flags == BALLAST_SAMPLE_COUNTER);
               }});
  c.push_back({"step.timing", BALLAST_SCHEMA_OP_TIMING_BATCH,
               [] { return base("step.timing", BALLAST_SCHEMA_OP_TIMING_BATCH, &g_op_batch, sizeof g_op_batch); },
               [](const ballast_event& ev) {
                 const auto& b = as<ballast_op_timing_batch>(ev);
                 REQUIRE(b.count == 2);
                 const ballast_op_timing& o = b.ops[0];
                 CHECK(o.dp_rank == 1);
                 CHECK(o.stage == 2);
                 CHECK(o.rank == 3);
                 CHECK(o.step == 100);
                 CHECK(s(o.optype) == "forward-compute");
                 CHECK(o.start_s == 1.5);
                 CHECK(o.duration_s == 0.25);
                 CHECK(o.seq_id == 4);
                 CHECK(o.mc == 0);
                 CHECK(o.mb_id == 7);
                 CHECK(o.gmc == 8);
                 CHECK(b.ops[1].optype == nullptr);
                 CHECK(b.ops[1].step == -1);
                 CHECK(b.ops[1].gmc == -1);
               }});
  c.push_back({"collective.record", BALLAST_SCHEMA_COLLECTIVE_RECORD,
               [] { return base("collective.record", BALLAST_SCHEMA_COLLECTIVE_RECORD, &g_coll, sizeof g_coll); },
               [](const ballast_event& ev) {
                 const auto& r = as<ballast_collective_record>(ev);
                 CHECK(r.state == BALLAST_COLL_FAILED);
                 CHECK(r.comm_id == 77);
                 CHECK(r.seq == 5);
                 CHECK(s(r.op) == "allreduce");
                 CHECK(s(r.dtype) == "bf16");
                 CHECK(r.algorithm == nullptr);
                 CHECK(r.count == 1024);
                 CHECK(r.bytes == 2048);
                 CHECK(r.rank == 3);
                 CHECK(r.nranks == 8);
                 CHECK(r.peer == -1);
                 CHECK(r.status == BALLAST_EPEER);
                 CHECK(r.issue_ns == 10);
                 CHECK(r.start_ns == 20);
                 CHECK(r.end_ns == 30);
                 CHECK(r.chunks_posted == 1);
                 CHECK(r.chunks_sent == 2);
                 CHECK(r.chunks_received == 3);
                 CHECK(r.chunks_reduced == 4);
               }});
  c.push_back({"fault.confirmed", BALLAST_SCHEMA_FAULT_REPORT,
               [] { return base("fault.confirmed", BALLAST_SCHEMA_FAULT_REPORT, &g_fault, sizeof g_fault); },
               [](const ballast_event& ev) {
                 const auto& f = as<ballast_fault_report>(ev);
                 CHECK(f.stage == BALLAST_FAULT_CONFIRMED);
                 CHECK(s(f.subject) == "node-3");
                 CHECK(f.rank == 24);
                 CHECK(s(f.kind) == "outlier");
                 CHECK(s(f.metric) == "cpu.user");
                 CHECK(f.score == 3.5);
                 CHECK(f.confidence == 0.9);
                 CHECK(f.since_ns == 100);
                 CHECK(f.detected_ns == 200);
                 CHECK(s(f.evidence) == "{\"distance\":3.5,\"peers\":[1,2]}");
                 CHECK(s(f.detector) == "machine");
               }});
  c.push_back({"placement.plan", BALLAST_SCHEMA_PLACEMENT_PLAN,
               [] { return base("placement.plan", BALLAST_SCHEMA_PLACEMENT_PLAN, &g_plan, sizeof g_plan); },
               [](const ballast_event& ev) {
                 const auto& p = as<ballast_placement_plan>(ev);
                 REQUIRE(p.count == 2);
                 CHECK(s(p.job) == "job-1");
                 CHECK(s(p.algorithm) == "greedy");
                 CHECK(s(p.nodes[1].name) == "n1");
                 CHECK(p.nodes[1].pp_stage == 1);
                 CHECK(p.nodes[1].dp_row == 0);
                 CHECK(p.nodes[1].first_rank == 8);
                 CHECK(p.max_dp_spread == 1);
                 CHECK(p.max_pp_spread == 2);
                 CHECK(p.objective == 3.25);
                 CHECK(p.lower_bound == 3.0);
               }});
  c.push_back({"recovery.action", BALLAST_SCHEMA_RECOVERY_ACTION,
               [] { return base("recovery.action", BALLAST_SCHEMA_RECOVERY_ACTION, &g_action, sizeof g_action); },
               [](const ballast_event& ev) {
                 const auto& a = as<ballast_recovery_action>(ev);
                 CHECK(s(a.action) == "evict");
                 CHECK(s(a.subject) == "node-3");
                 CHECK(s(a.reason) == "faulty machine");
                 CHECK(s(a.args) == "{\"grace_s\":30}");
                 CHECK(s(a.policy) == "default");
                 CHECK(s(a.cause_topic) == "fault.confirmed");
               }});
  c.push_back({"startup.stage", BALLAST_SCHEMA_STARTUP_STAGE,
               [] { return base("startup.stage", BALLAST_SCHEMA_STARTUP_STAGE, &g_stage, sizeof g_stage); },
               [](const ballast_event& ev) {
                 const auto& st = as<ballast_startup_stage>(ev);
                 CHECK(st.status == BALLAST_OK);
                 CHECK(s(st.stage) == "checkpoint_load");
                 CHECK(s(st.node) == "node-1");
                 CHECK(st.rank == 5);
                 CHECK(st.start_ns == 1000);
                 CHECK(st.end_ns == 5000);
                 CHECK(st.bytes == (1ull << 40));
               }});
  c.push_back(
      {"straggler.report", BALLAST_SCHEMA_STRAGGLER_REPORT,
       [] { return base("straggler.report", BALLAST_SCHEMA_STRAGGLER_REPORT, &g_straggler, sizeof g_straggler); },
       [](const ballast_event& ev) {
         const auto& r = as<ballast_straggler_report>(ev);
         REQUIRE(r.count == 1);
         CHECK(r.slowdown == 1.9);
         CHECK(r.launch_slowdown == 1.1);
         CHECK(s(r.kind) == "worker");
         CHECK(s(r.culprits[0].dimension) == "optype");
         CHECK(s(r.culprits[0].name) == "forward-compute");
         CHECK(r.culprits[0].slowdown == 1.75);
         CHECK(r.first_step == 10);
         CHECK(r.last_step == 20);
       }});
  c.push_back({"job.state", BALLAST_SCHEMA_JSON,
               [] { return base("job.state", BALLAST_SCHEMA_JSON, g_json, std::strlen(g_json)); },
               [](const ballast_event& ev) {
                 REQUIRE(ev.payload_size == std::strlen(g_json));
                 CHECK(std::string(static_cast<const char*>(ev.payload), ev.payload_size) == g_json);
               }});
  c.push_back({"my.custom", BALLAST_SCHEMA_CUSTOM + 3,
               [] { return base("my.custom", BALLAST_SCHEMA_CUSTOM + 3, g_bytes, sizeof g_bytes); },
               [](const ballast_event& ev) {
                 REQUIRE(ev.payload_size == sizeof g_bytes);
                 CHECK(std::memcmp(ev.payload, g_bytes, sizeof g_bytes) == 0);
               }});
  c.push_back({"job.tick", BALLAST_SCHEMA_NONE, [] { return base("job.tick", BALLAST_SCHEMA_NONE, nullptr, 0); },
               [](const ballast_event& ev) {
                 CHECK(ev.payload == nullptr);
                 CHECK(ev.payload_size == 0);
               }});
  return c;
}

void check_header(const ballast_event& ev, const Case& c) {
  CHECK(ev.size == sizeof(ballast_event));
  CHECK(ev.schema == c.schema);
  CHECK(s(ev.topic) == c.topic);
  CHECK(ev.ts_ns == 1700000000123456789);
  CHECK(s(ev.source.node) == "node-7");
  CHECK(ev.source.rank == 12);
  CHECK(s(ev.source.plugin) == "machine");
}

// Whether any pointer of the copy points into the original's storage.
bool shares_pointer(const ballast_event& a, const ballast_event& b) {
  return a.topic == b.topic || a.source.node == b.source.node || (a.payload != nullptr && a.payload == b.payload);
}

}  // namespace

TEST_CASE("OwnedEvent deep-copies every schema and outlives the original") {
  for (const Case& c : cases()) {
    const std::string topic_name = c.topic;
    CAPTURE(topic_name);
    std::string topic = c.topic;  // the copy must not point at this buffer
    ballast_event ev = c.make();
    ev.topic = topic.c_str();
    OwnedEvent copy(ev);
    topic.assign(topic.size(), 'x');
    check_header(copy.view(), c);
    c.check(copy.view());
    CHECK_FALSE(shares_pointer(copy.view(), ev));
    OwnedEvent second = copy;
    OwnedEvent moved = std::move(copy);
    check_header(second.view(), c);
    c.check(second.view());
    c.check(moved.view());
  }
}

TEST_CASE("JSON round trip: struct -> JSON -> struct for every schema") {
  for (const Case& c : cases()) {
    const std::string topic_name = c.topic;
    CAPTURE(topic_name);
    const ballast_event ev = c.make();
    nlohmann::json j = event_to_json(ev);
    // Through text, as a JSON-lines file would carry it.
    nlohmann::json back_text = nlohmann::json::parse(j.dump());
    OwnedEvent back;
    std::string error;
    REQUIRE_MESSAGE(event_from_json(back_text, &back, &error) == BALLAST_OK, error);
    check_header(back.view(), c);
    c.check(back.view());
    CHECK(event_to_json(back.view()).dump() == j.dump());
  }
}

TEST_CASE("JSON shows well-known payloads by field name") {
  const ballast_event ev = base("fault.confirmed", BALLAST_SCHEMA_FAULT_REPORT, &g_fault, sizeof g_fault);
  nlohmann::json j = event_to_json(ev);
  CHECK(j["schema"] == "fault_report");
  CHECK(j["payload"]["stage"] == "confirmed");
  CHECK(j["payload"]["evidence"]["peers"][1] == 2);  // JSON text shown as JSON
  CHECK(j["ts"].get<double>() == doctest::Approx(1700000000.123456789));
  CHECK(j["source"]["plugin"] == "machine");
}

TEST_CASE("JSON out never carries invalid UTF-8 (nlohmann::json would refuse to dump it)") {
  const char bad_node[] = "node-\xff\xc3";       // a stray byte and a cut sequence
  const char bad_metric[] = "cpu.\xed\xa0\x80";  // an encoded surrogate
  ballast_metric_sample sample = {bad_node, bad_metric, 1, 2.0, 0};
  ballast_metric_batch batch = {sizeof batch, 1, &sample};
  ballast_event ev = base("metric.sample", BALLAST_SCHEMA_METRIC_BATCH, &batch, sizeof batch);
  ev.source.node = bad_node;
  std::string text;
  CHECK_NOTHROW(text = event_to_json(ev).dump());
  const nlohmann::json back = nlohmann::json::parse(text);
  CHECK(back["source"]["node"] == "node-\xef\xbf\xbd\xef\xbf\xbd");
  CHECK(back["payload"]["samples"][0]["metric"] == "cpu.\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
  const char good[] = "n\xc3\xa9ud-\xe2\x82\xac-\xf0\x9f\x98\x80";  // accents, euro sign, emoji: kept
  ev.source.node = good;
  CHECK(event_to_json(ev)["source"]["node"] == good);
}

TEST_CASE("JSON in: schema from the topic, defaults for missing fields, ts in seconds") {
  OwnedEvent ev;
  std::string error;
  auto j = nlohmann::json::parse(R"({"topic":"metric.sample","ts":2.5,
      "payload":{"samples":[{"metric":"cpu.user","value":3}]}})");
  REQUIRE_MESSAGE(event_from_json(j, &ev, &error) == BALLAST_OK, error);
  CHECK(ev.view().schema == BALLAST_SCHEMA_METRIC_BATCH);
  CHECK(ev.view().ts_ns == 2500000000);
  CHECK(ev.view().source.rank == -1);
  const auto& b = *static_cast<const ballast_metric_batch*>(ev.view().payload);
  REQUIRE(b.count == 1);
  CHECK(b.samples[0].value == 3.0);
  CHECK(b.samples[0].node == nullptr);

  j = nlohmann::json::parse(R"({"topic":"fault.suspected","payload":{"subject":"n1","evidence":{"a":1}}})");
  REQUIRE_MESSAGE(event_from_json(j, &ev, &error) == BALLAST_OK, error);
  const auto& f = *static_cast<const ballast_fault_report*>(ev.view().payload);
  CHECK(f.rank == -1);
  CHECK(f.stage == BALLAST_FAULT_SUSPECTED);
  CHECK(s(f.evidence) == "{\"a\":1}");

  j = nlohmann::json::parse(R"({"topic":"job.state","payload":{"x":[1,2]}})");
  REQUIRE(event_from_json(j, &ev, &error) == BALLAST_OK);
  CHECK(ev.view().schema == BALLAST_SCHEMA_JSON);
  CHECK(std::string(static_cast<const char*>(ev.view().payload)) == "{\"x\":[1,2]}");
}

TEST_CASE("JSON in: errors name the field") {
  struct Bad {
    const char* json;
    const char* error;
  };
  const Bad bad[] = {
      {R"([1])", "event: expected an object"},
      {R"({"ts":1})", "topic: missing"},
      {R"({"topic":"Bad Topic"})",
       "topic: \"Bad Topic\" is not a valid topic (dotted segments of lower-case letters, digits, '_' and '-', "
       "such as \"fault.confirmed\")"},
      {R"({"topic":"metric.sample","payload":{"samples":[{},{},{},{"value":"x"}]}})",
       "payload.samples[3].value: expected a number"},
      {R"({"topic":"metric.sample","payload":{"samples":{}}})", "payload.samples: expected an array"},
      {R"({"topic":"step.timing","payload":{"ops":[{"rank":1.5}]}})", "payload.ops[0].rank: expected an integer"},
      {R"({"topic":"step.timing","payload":{"ops":[{"rank":3000000000}]}})", "payload.ops[0].rank: out of range"},
      {R"({"topic":"collective.record","payload":{"state":"exploded"}})", "payload.state: unknown value \"exploded\""},
      {R"({"topic":"recovery.action","payload":{"acton":"evict"}})", "payload.acton: unknown field of recovery_action"},
      {R"({"topic":"recovery.action","payload":{"action":7}})", "payload.action: expected a string or null"},
      {R"({"topic":"a.b","schema":"nonsense"})", "schema: unknown schema \"nonsense\""},
      {R"({"topic":"a.b","source":{"rank":"x"}})", "source.rank: expected an integer"},
      {R"({"topic":"a.b","schema":"custom","schema_id":65536,"payload":{"bytes_hex":"0g"}})",
       "payload.bytes_hex: not a hex digit at 1"},
      {R"({"topic":"a.b","schema":"none","payload":{"a":1}})",
       "payload: schema \"none\" carries raw bytes only ({\"bytes_hex\": ...})"},
  };
  for (const Bad& b : bad) {
    CAPTURE(b.json);
    OwnedEvent ev;
    std::string error;
    CHECK(event_from_json(nlohmann::json::parse(b.json), &ev, &error) == BALLAST_EFORMAT);
    CHECK(error == b.error);
  }
}

TEST_CASE("an event of schema none with payload bytes round-trips: frame -> JSON -> event -> frame") {
  const unsigned char bytes[] = {0x00, 0xff, 0x41, 0x0a};
  ballast_event e{};
  e.size = sizeof e;
  e.schema = BALLAST_SCHEMA_NONE;
  e.topic = "opaque.bytes";
  e.ts_ns = 42;
  e.source.rank = -1;
  e.payload = bytes;
  e.payload_size = sizeof bytes;
  std::vector<unsigned char> frame;
  encode_frame(e, &frame);
  OwnedEvent decoded;
  size_t consumed = 0;
  std::string why;
  REQUIRE(decode_frame(frame.data(), frame.size(), &decoded, &consumed, &why) == BALLAST_OK);
  nlohmann::json j = event_to_json(decoded.view());
  CHECK(j["payload"]["bytes_hex"] == "00ff410a");
  OwnedEvent back;
  std::string error;
  REQUIRE(event_from_json(nlohmann::json::parse(j.dump()), &back, &error) == BALLAST_OK);
  CHECK(back.view().schema == BALLAST_SCHEMA_NONE);
  REQUIRE(back.view().payload_size == sizeof bytes);
  CHECK(std::memcmp(back.view().payload, bytes, sizeof bytes) == 0);
  std::vector<unsigned char> again;
  encode_frame(back.view(), &again);
  CHECK(again == frame);
}

TEST_CASE("schema_for_topic") {
  CHECK(schema_for_topic("metric.sample") == BALLAST_SCHEMA_METRIC_BATCH);
  CHECK(schema_for_topic("step.timing") == BALLAST_SCHEMA_OP_TIMING_BATCH);
  CHECK(schema_for_topic("collective.record") == BALLAST_SCHEMA_COLLECTIVE_RECORD);
  CHECK(schema_for_topic("collective.progress") == BALLAST_SCHEMA_COLLECTIVE_RECORD);
  CHECK(schema_for_topic("fault.suspected") == BALLAST_SCHEMA_FAULT_REPORT);
  CHECK(schema_for_topic("fault.confirmed") == BALLAST_SCHEMA_FAULT_REPORT);
  CHECK(schema_for_topic("node.silent") == BALLAST_SCHEMA_FAULT_REPORT);
  CHECK(schema_for_topic("placement.plan") == BALLAST_SCHEMA_PLACEMENT_PLAN);
  CHECK(schema_for_topic("recovery.action") == BALLAST_SCHEMA_RECOVERY_ACTION);
  CHECK(schema_for_topic("startup.stage") == BALLAST_SCHEMA_STARTUP_STAGE);
  CHECK(schema_for_topic("straggler.report") == BALLAST_SCHEMA_STRAGGLER_REPORT);
  CHECK(schema_for_topic("job.state") == BALLAST_SCHEMA_JSON);
  CHECK(schema_for_topic("metric.sample.x") == BALLAST_SCHEMA_JSON);
  CHECK(std::string(schema_name(BALLAST_SCHEMA_STARTUP_STAGE)) == "startup_stage");
  CHECK(std::string(schema_name(BALLAST_SCHEMA_CUSTOM + 1)) == "custom");
}

TEST_CASE("frame round trip: struct -> frame -> struct for every schema") {
  std::vector<unsigned char> stream;
  for (const Case& c : cases()) encode_frame(c.make(), &stream);
  size_t at = 0;
  for (const Case& c : cases()) {
    const std::string topic_name = c.topic;
    CAPTURE(topic_name);
    OwnedEvent back;
    size_t consumed = 0;
    std::string error;
    REQUIRE_MESSAGE(decode_frame(stream.data() + at, stream.size() - at, &back, &consumed, &error) == BALLAST_OK,
                    error);
    check_header(back.view(), c);
    c.check(back.view());
    at += consumed;
  }
  CHECK(at == stream.size());
}

TEST_CASE("CRC-32C matches the published check value") {
  CHECK(crc32c("123456789", 9) == 0xE3069283u);
  CHECK(crc32c("", 0) == 0u);
}

namespace {

std::vector<unsigned char> one_frame() {
  std::vector<unsigned char> f;
  encode_frame(base("placement.plan", BALLAST_SCHEMA_PLACEMENT_PLAN, &g_plan, sizeof g_plan), &f);
  return f;
}

void put32(std::vector<unsigned char>& f, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) f[at + i] = static_cast<unsigned char>(v >> (8 * i));
}

std::string decode_error(const std::vector<unsigned char>& f) {
  OwnedEvent ev;
  size_t consumed = 0;
  std::string error;
  CHECK(decode_frame(f.data(), f.size(), &ev, &consumed, &error) == BALLAST_EFORMAT);
  return error;
}

// Replace the body and fix the length and checksum, so that only the body's
// content is wrong: this reaches the body decoder.
std::vector<unsigned char> with_body(std::vector<unsigned char> body) {
  std::vector<unsigned char> f = one_frame();
  f.resize(kFrameHeaderSize);
  put32(f, 8, static_cast<uint32_t>(body.size()));
  put32(f, 12, crc32c(body.data(), body.size()));
  f.insert(f.end(), body.begin(), body.end());
  return f;
}

}  // namespace

TEST_CASE("decode_frame refuses bad headers with a reason") {
  std::vector<unsigned char> f = one_frame();
  CHECK(decode_error(std::vector<unsigned char>(f.begin(), f.begin() + 7)) ==
        "truncated frame header: 7 bytes left, 16 needed");
  auto g = f;
  g[0] = 'X';
  CHECK(decode_error(g).rfind("bad magic", 0) == 0);
  g = f;
  g[4] = 9;
  CHECK(decode_error(g) == "unknown frame version 9");
  g = f;
  g[6] = 1;
  CHECK(decode_error(g) == "unknown frame flags 1");
  g = f;
  put32(g, 8, kMaxFrameBody + 1);
  CHECK(decode_error(g) == "frame body of 67108865 bytes is above the limit of 67108864");
  const size_t body = f.size() - kFrameHeaderSize;
  g = std::vector<unsigned char>(f.begin(), f.end() - 3);
  CHECK(decode_error(g) ==
        "truncated frame: header says " + std::to_string(body) + " bytes, " + std::to_string(body - 3) + " left");
  g = f;
  g[kFrameHeaderSize + 5] ^= 0x10;
  CHECK(decode_error(g).rfind("checksum mismatch", 0) == 0);
}

TEST_CASE("a frame claiming one operation per body byte is refused before allocating (memory bounded)") {
  // An empty step.timing batch: its body ends with the ops count (u32).
  ballast_op_timing_batch empty{sizeof empty, 0, nullptr};
  std::vector<unsigned char> f;
  encode_frame(base("step.timing", BALLAST_SCHEMA_OP_TIMING_BATCH, &empty, sizeof empty), &f);
  const std::vector<unsigned char> prefix(f.begin() + kFrameHeaderSize, f.end() - 4);
  const uint32_t pad = 1u << 20;
  auto body_with = [&](uint32_t count) {
    std::vector<unsigned char> body = prefix;
    for (int i = 0; i < 4; ++i) body.push_back(static_cast<unsigned char>(count >> (8 * i)));
    body.resize(body.size() + pad, 0);
    return with_body(body);
  };
  // One 64-byte ballast_op_timing per body byte would be 64 MiB for this 1 MiB frame.
  CHECK(decode_error(body_with(pad)) == "malformed frame body: ops: 1048576 entries cannot fit in the body");
  // As many as can fit (53 bytes each at least, zeros: no strings) decode, in
  // memory proportional to the body.
  const uint32_t fit = pad / 53;
  std::vector<unsigned char> g = body_with(fit);
  std::vector<unsigned char> body(g.begin() + kFrameHeaderSize, g.end());
  body.resize(body.size() - (pad - size_t{fit} * 53));
  g = with_body(body);
  OwnedEvent ev;
  size_t consumed = 0;
  std::string error;
  REQUIRE_MESSAGE(decode_frame(g.data(), g.size(), &ev, &consumed, &error) == BALLAST_OK, error);
  CHECK(static_cast<const ballast_op_timing_batch*>(ev.view().payload)->count == fit);
}

TEST_CASE("decode_frame refuses well-checksummed garbage bodies") {
  const std::vector<unsigned char> good = one_frame();
  const std::vector<unsigned char> body(good.begin() + kFrameHeaderSize, good.end());
  // Truncated bodies: the decoder runs out of input at some field.
  for (size_t n = 0; n < body.size(); ++n) {
    CAPTURE(n);
    CHECK(decode_error(with_body(std::vector<unsigned char>(body.begin(), body.begin() + n)))
              .rfind("malformed frame body", 0) == 0);
  }
  // Trailing bytes.
  auto longer = body;
  longer.push_back(0);
  CHECK(decode_error(with_body(longer)) == "malformed frame body: 1 unread bytes at the end of the body");
  // A string length far beyond the body: refused before allocating it.
  std::vector<unsigned char> huge = {1, 0x10, 0, 0, 0};  // endianness byte, schema
  huge.push_back(1);                                     // topic present
  for (int i = 0; i < 8; ++i) huge.push_back(0xff);      // length 2^64-1
  CHECK(decode_error(with_body(huge)) ==
        "malformed frame body: topic length 18446744073709551615 is past the end "
        "of the body");
  // Random bodies with a valid checksum never crash and are never trusted
  // unless they decode to a well-formed event.
  std::mt19937 rng(42);
  int refused = 0;
  for (int i = 0; i < 2000; ++i) {
    std::vector<unsigned char> r(rng() % 200);
    for (auto& b : r) b = static_cast<unsigned char>(rng());
    OwnedEvent ev;
    size_t consumed = 0;
    std::string error;
    auto f = with_body(r);
    if (decode_frame(f.data(), f.size(), &ev, &consumed, &error) != BALLAST_OK) ++refused;
  }
  CHECK(refused == 2000);
  // Mutations of a good body: each byte flipped in turn.
  for (size_t i = 0; i < body.size(); ++i) {
    auto m = body;
    m[i] ^= 0xA5;
    OwnedEvent ev;
    size_t consumed = 0;
    std::string error;
    auto f = with_body(m);
    const int rc = decode_frame(f.data(), f.size(), &ev, &consumed, &error);
    CHECK((rc == BALLAST_OK || rc == BALLAST_EFORMAT));
  }
}

namespace {

// A metric batch body written field by field through cereal's own portable
// binary archive, in the byte order asked for: the format encode_frame and
// decode_frame implement by hand.
std::vector<unsigned char> cereal_metric_body(cereal::PortableBinaryOutputArchive::Options order) {
  std::ostringstream os(std::ios::binary);
  {
    cereal::PortableBinaryOutputArchive ar(os, order);
    auto str = [&ar](const std::string& s) {
      ar(uint8_t{1}, uint64_t{s.size()});
      ar(cereal::binary_data(s.data(), s.size()));
    };
    ar(uint32_t{BALLAST_SCHEMA_METRIC_BATCH});
    str("metric.sample");
    ar(int64_t{1700000000123456789});
    str("node-7");
    ar(int32_t{12});
    ar(uint8_t{0});  // no plugin
    ar(uint32_t{2});
    for (int i = 0; i < 2; ++i) {
      str("node-7");
      str("gpu" + std::to_string(i) + ".util");
      ar(int64_t{1000 + i}, 0.25 + i, uint32_t(i));
    }
  }
  const std::string b = os.str();
  return {b.begin(), b.end()};
}

}  // namespace

TEST_CASE("frame bodies are cereal's portable binary archive, in both byte orders") {
  using Options = cereal::PortableBinaryOutputArchive::Options;
  const auto little = cereal_metric_body(Options::LittleEndian());
  const auto big = cereal_metric_body(Options::BigEndian());
  REQUIRE(little != big);
  for (const auto* body : {&little, &big}) {
    OwnedEvent ev;
    size_t consumed = 0;
    std::string error;
    const auto f = with_body(*body);
    REQUIRE_MESSAGE(decode_frame(f.data(), f.size(), &ev, &consumed, &error) == BALLAST_OK, error);
    const ballast_event& e = ev.view();
    CHECK(s(e.topic) == "metric.sample");
    CHECK(e.ts_ns == 1700000000123456789);
    CHECK(s(e.source.node) == "node-7");
    CHECK(e.source.rank == 12);
    CHECK(e.source.plugin == nullptr);
    const auto* b = static_cast<const ballast_metric_batch*>(e.payload);
    REQUIRE(b->count == 2);
    CHECK(s(b->samples[1].metric) == "gpu1.util");
    CHECK(b->samples[1].ts_ns == 1001);
    CHECK(b->samples[1].value == 1.25);
    CHECK(b->samples[1].flags == 1);
    // Encoded again: cereal's little-endian body, byte for byte.
    std::vector<unsigned char> again;
    encode_frame(e, &again);
    CHECK(std::vector<unsigned char>(again.begin() + kFrameHeaderSize, again.end()) == little);
  }
  // A byte-order marker cereal never writes.
  auto odd = little;
  odd[0] = 2;
  CHECK(decode_error(with_body(odd)) == "malformed frame body: bad byte-order marker 2");
}
