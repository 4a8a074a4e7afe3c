// Every well-known payload reaches Lua as a table with the struct's field
// names; JSON payloads are parsed; other schemas arrive as bytes. The
// handler publishes what it received, so the test reads it back as JSON.
#include "policy_test_util.hpp"

using nlohmann::json;
using namespace ballast_test;

namespace {

struct Echo {
  TempDir dir;
  std::unique_ptr<ballast::Policy> policy =
      load_script(dir, "ballast.on('*', function(ev) ballast.publish('echo', ev) end)");
  Recorder r;

  json payload(const ballast_event& e) {
    r.clear();
    policy->handle(e, r);
    INFO((r.errors.empty() ? std::string() : r.errors[0]));
    REQUIRE(r.errors.empty());
    REQUIRE(r.published.size() == 1);
    json ev = json::parse(r.published[0].second);
    return ev.contains("payload") ? ev["payload"] : json();
  }
};

}  // namespace

TEST_CASE("metric batch") {
  ballast_metric_sample s[] = {{"gpu1", "cpu.user", 10, 0.5, 0},
                               {"gpu2", "gpu0.util", 20, 97.0, BALLAST_SAMPLE_COUNTER}};
  ballast_metric_batch b{sizeof b, 2, s};
  Echo echo;
  json p = echo.payload(make_event("metric.sample", BALLAST_SCHEMA_METRIC_BATCH, &b, sizeof b));
  CHECK(p == json{{"count", 2},
                  {"samples",
                   {{{"node", "gpu1"}, {"metric", "cpu.user"}, {"ts_ns", 10}, {"value", 0.5}, {"flags", 0}},
                    {{"node", "gpu2"}, {"metric", "gpu0.util"}, {"ts_ns", 20}, {"value", 97.0}, {"flags", 1}}}}});
}

TEST_CASE("op timing batch") {
  ballast_op_timing o[] = {{1, 2, 9, 100, "forward-compute", 1.5, 0.25, 0, 1, 3, 5}};
  ballast_op_timing_batch b{sizeof b, 1, o};
  Echo echo;
  json p = echo.payload(make_event("step.timing", BALLAST_SCHEMA_OP_TIMING_BATCH, &b, sizeof b));
  CHECK(p == json{{"count", 1},
                  {"ops",
                   {{{"dp_rank", 1},
                     {"stage", 2},
                     {"rank", 9},
                     {"step", 100},
                     {"optype", "forward-compute"},
                     {"start_s", 1.5},
                     {"duration_s", 0.25},
                     {"seq_id", 0},
                     {"mc", 1},
                     {"mb_id", 3},
                     {"gmc", 5}}}}});
}

TEST_CASE("collective record") {
  ballast_collective_record c{};
  c.size = sizeof c;
  c.state = BALLAST_COLL_STARTED;
  c.comm_id = 77;
  c.seq = 5;
  c.op = "allreduce";
  c.dtype = "bf16";
  c.algorithm = "ring";
  c.count = 1024;
  c.bytes = 2048;
  c.rank = 1;
  c.nranks = 8;
  c.peer = -1;
  c.issue_ns = 11;
  c.start_ns = 12;
  c.chunks_posted = 4;
  c.chunks_sent = 3;
  c.chunks_received = 2;
  c.chunks_reduced = 1;
  Echo echo;
  json p = echo.payload(make_event("collective.record", BALLAST_SCHEMA_COLLECTIVE_RECORD, &c, sizeof c));
  CHECK(p == json{{"state", "started"},
                  {"comm_id", 77},
                  {"seq", 5},
                  {"op", "allreduce"},
                  {"dtype", "bf16"},
                  {"algorithm", "ring"},
                  {"count", 1024},
                  {"bytes", 2048},
                  {"rank", 1},
                  {"nranks", 8},
                  {"peer", -1},
                  {"status", 0},
                  {"issue_ns", 11},
                  {"start_ns", 12},
                  {"end_ns", 0},
                  {"chunks_posted", 4},
                  {"chunks_sent", 3},
                  {"chunks_received", 2},
                  {"chunks_reduced", 1}});
}

TEST_CASE("fault report, with its evidence parsed") {
  ballast_fault_report f{};
  f.size = sizeof f;
  f.stage = BALLAST_FAULT_CONFIRMED;
  f.subject = "gpu7";
  f.rank = -1;
  f.kind = "outlier";
  f.metric = "gpu0.temp";
  f.score = 4.5;
  f.confidence = 0.9;
  f.since_ns = 100;
  f.detected_ns = 200;
  f.evidence = R"({"z": 4.5, "peers": [1, 2], "note": null})";
  f.detector = "machine";
  Echo echo;
  json p = echo.payload(make_event("fault.confirmed", BALLAST_SCHEMA_FAULT_REPORT, &f, sizeof f));
  CHECK(p == json{{"stage", "confirmed"},
                  {"subject", "gpu7"},
                  {"rank", -1},
                  {"kind", "outlier"},
                  {"metric", "gpu0.temp"},
                  {"score", 4.5},
                  {"confidence", 0.9},
                  {"since_ns", 100},
                  {"detected_ns", 200},
                  {"evidence", {{"z", 4.5}, {"peers", {1, 2}}, {"note", nullptr}}},
                  {"detector", "machine"}});
  // Evidence that is not JSON arrives as text, with a warning.
  f.evidence = "{broken";
  f.metric = nullptr;  // NULL strings are absent
  p = echo.payload(make_event("fault.confirmed", BALLAST_SCHEMA_FAULT_REPORT, &f, sizeof f));
  CHECK(p["evidence"] == "{broken");
  CHECK_FALSE(p.contains("metric"));
  REQUIRE(echo.r.logs.size() == 1);
  CHECK(echo.r.logs[0].second.find("evidence is not valid JSON") != std::string::npos);
}

TEST_CASE("placement plan") {
  ballast_placement_node n[] = {{"gpu1", 0, 0, 0}, {"gpu2", 1, 0, 8}};
  ballast_placement_plan pl{};
  pl.size = sizeof pl;
  pl.count = 2;
  pl.job = "llm";
  pl.algorithm = "bnb";
  pl.nodes = n;
  pl.max_dp_spread = 2;
  pl.max_pp_spread = 3;
  pl.objective = 1.5;
  pl.lower_bound = 1.25;
  Echo echo;
  json p = echo.payload(make_event("placement.plan", BALLAST_SCHEMA_PLACEMENT_PLAN, &pl, sizeof pl));
  CHECK(p == json{{"count", 2},
                  {"job", "llm"},
                  {"algorithm", "bnb"},
                  {"nodes",
                   {{{"name", "gpu1"}, {"pp_stage", 0}, {"dp_row", 0}, {"first_rank", 0}},
                    {{"name", "gpu2"}, {"pp_stage", 1}, {"dp_row", 0}, {"first_rank", 8}}}},
                  {"max_dp_spread", 2},
                  {"max_pp_spread", 3},
                  {"objective", 1.5},
                  {"lower_bound", 1.25}});
}

TEST_CASE("recovery action, with its args parsed") {
  ballast_recovery_action a{};
  a.size = sizeof a;
  a.action = "evict";
  a.subject = "gpu3";
  a.reason = "slow";
  a.args = R"({"count": 1})";
  a.policy = "default";
  a.cause_topic = "fault.confirmed";
  Echo echo;
  json p = echo.payload(make_event("recovery.action", BALLAST_SCHEMA_RECOVERY_ACTION, &a, sizeof a));
  CHECK(p == json{{"action", "evict"},
                  {"subject", "gpu3"},
                  {"reason", "slow"},
                  {"args", {{"count", 1}}},
                  {"policy", "default"},
                  {"cause_topic", "fault.confirmed"}});
}

TEST_CASE("startup stage") {
  ballast_startup_stage s{};
  s.size = sizeof s;
  s.status = BALLAST_EIO;
  s.stage = "checkpoint_load";
  s.node = "gpu1";
  s.rank = 4;
  s.start_ns = 10;
  s.end_ns = 30;
  s.bytes = 1u << 20;
  Echo echo;
  json p = echo.payload(make_event("startup.stage", BALLAST_SCHEMA_STARTUP_STAGE, &s, sizeof s));
  CHECK(p == json{{"status", BALLAST_EIO},
                  {"stage", "checkpoint_load"},
                  {"node", "gpu1"},
                  {"rank", 4},
                  {"start_ns", 10},
                  {"end_ns", 30},
                  {"bytes", 1 << 20}});
}

TEST_CASE("straggler report") {
  ballast_straggler_culprit c[] = {{"rank", "17", 1.4}};
  ballast_straggler_report r{};
  r.size = sizeof r;
  r.count = 1;
  r.slowdown = 1.5;
  r.launch_slowdown = 1.1;
  r.kind = "worker";
  r.culprits = c;
  r.first_step = 10;
  r.last_step = 20;
  Echo echo;
  json p = echo.payload(make_event("straggler.report", BALLAST_SCHEMA_STRAGGLER_REPORT, &r, sizeof r));
  CHECK(p == json{{"count", 1},
                  {"slowdown", 1.5},
                  {"launch_slowdown", 1.1},
                  {"kind", "worker"},
                  {"culprits", {{{"dimension", "rank"}, {"name", "17"}, {"slowdown", 1.4}}}},
                  {"first_step", 10},
                  {"last_step", 20}});
}

TEST_CASE("JSON payloads are parsed; invalid JSON arrives as text") {
  Echo echo;
  std::string text = R"({"a": 1, "b": [true, false, null], "c": {"d": "e"}, "big": 1e300, "neg": -5})";
  json p = echo.payload(json_event("custom.json", text));
  CHECK(p == json::parse(text));
  p = echo.payload(json_event("custom.json", "[1, 2"));
  CHECK(p == "[1, 2");
  REQUIRE(echo.r.logs.size() == 1);
  CHECK(echo.r.logs[0].second.find("not valid JSON") != std::string::npos);
  std::string deep(100, '[');
  p = echo.payload(json_event("custom.json", deep + std::string(100, ']')));
  CHECK(echo.r.logs.size() == 1);
  CHECK(echo.r.logs[0].second.find("deeper than 64") != std::string::npos);
}

TEST_CASE("opaque payloads arrive as their bytes") {
  TempDir dir;
  auto p = load_script(dir,
                       "ballast.on('raw', function(ev)\n"
                       "  assert(ev.payload == 'ab\\0cd', ev.payload)\n"
                       "  assert(ev.schema == 0x10001)\n"
                       "  return {action = 'pause'}\n"
                       "end)\n");
  Recorder r;
  const char bytes[] = {'a', 'b', '\0', 'c', 'd'};
  ballast_event e = make_event("raw", BALLAST_SCHEMA_CUSTOM + 1, bytes, sizeof bytes);
  p->handle(e, r);
  CHECK(r.errors.empty());
  CHECK(r.actions.size() == 1);
}

TEST_CASE("a well-known payload shorter than its v1 size is left out with a warning") {
  ballast_fault_report f{};
  f.size = sizeof f;
  Echo echo;
  json p =
      echo.payload(make_event("fault.confirmed", BALLAST_SCHEMA_FAULT_REPORT, &f, BALLAST_FAULT_REPORT_V1_SIZE - 8));
  CHECK(p.is_null());
  REQUIRE(echo.r.logs.size() == 1);
  CHECK(echo.r.logs[0].second.find("smaller than the v1 size") != std::string::npos);
  ballast_metric_batch b{sizeof b, 3, nullptr};  // count without samples
  p = echo.payload(make_event("metric.sample", BALLAST_SCHEMA_METRIC_BATCH, &b, sizeof b));
  CHECK(p.is_null());
}

TEST_CASE("a payload of an older minor, without the fields after its v1 size, reads them as their default") {
  ballast_fault_report f{};
  f.size = BALLAST_FAULT_REPORT_V1_SIZE;
  f.subject = "node3";
  f.kind = "slow";
  f.evidence = "{\"never\": \"read\"}";  // past f.size: not the publisher's
  f.detector = "never read";
  Echo echo;
  json p = echo.payload(make_event("fault.confirmed", BALLAST_SCHEMA_FAULT_REPORT, &f, BALLAST_FAULT_REPORT_V1_SIZE));
  CHECK(echo.r.logs.empty());
  CHECK(p["subject"] == "node3");
  CHECK(p["kind"] == "slow");
  CHECK_FALSE(p.contains("evidence"));
  CHECK_FALSE(p.contains("detector"));
}

TEST_CASE("JSON payloads: escapes, unicode, numbers, and malformed text") {
  Echo echo;
  std::string text = R"({"s": "a\"b\\c\/d\b\f\n\r\t", "u": "\u00e9\u4e2d\ud83d\ude00", "raw": "é中",)"
                     R"( "n": [0, -0, 1.5e3, -2E-2, 9223372036854775807, 9223372036854775808, -12],)"
                     R"( "e": {}, "l": [], "deep": [[[{"x": [true]}]]]})";
  json p = echo.payload(json_event("custom.json", text));
  json expected = json::parse(text);
  expected["l"] = json::object();            // an empty Lua table has no way to say it was a list
  expected["n"][5] = 9223372036854775808.0;  // past int64: a float
  CHECK(p == expected);
  CHECK(echo.r.logs.empty());
  for (const char* bad : {"[1,]", "{\"a\" 1}", "\"\\x\"", "\"\\ud800\"", "01", "[1] x", "\"a\nb\"", "tru", "-", "1.",
                          "[", "{\"a\":1,}", "1e999"}) {
    INFO(std::string(bad));
    p = echo.payload(json_event("custom.json", bad));
    CHECK(p == bad);  // delivered as text
    REQUIRE(echo.r.logs.size() == 1);
    CHECK(echo.r.logs[0].second.find("not valid JSON") != std::string::npos);
    CHECK(echo.r.logs[0].second.find("line 1, column") != std::string::npos);
  }
}

TEST_CASE("JSON payloads: strings are valid UTF-8, raw or escaped, up to U+10FFFF") {
  Echo echo;
  // Each boundary of the encoding, raw and as a \u escape (a pair above U+FFFF).
  const std::pair<const char*, const char*> edges[] = {
      {"\x7F", "\\u007f"},
      {"\xC2\x80", "\\u0080"},
      {"\xDF\xBF", "\\u07FF"},
      {"\xE0\xA0\x80", "\\u0800"},
      {"\xED\x9F\xBF", "\\ud7ff"},  // just below the surrogates
      {"\xEE\x80\x80", "\\ue000"},  // just above
      {"\xEF\xBF\xBF", "\\uffff"},
      {"\xF0\x90\x80\x80", "\\ud800\\udc00"},
      {"\xF4\x8F\xBF\xBF", "\\udbff\\udfff"},  // U+10FFFF, the largest 4-byte form allowed
  };
  for (const auto& [raw, escaped] : edges) {
    INFO(escaped);
    std::string text = std::string(R"({"raw": "a)") + raw + R"(b", "esc": "a)" + escaped + R"(b", ")" + raw +
                       R"(": "after\n)" + raw + "\"}";
    json p = echo.payload(json_event("custom.json", text));
    CHECK(echo.r.logs.empty());
    const std::string expected = std::string("a") + raw + "b";
    CHECK(p["raw"] == expected);
    CHECK(p["esc"] == expected);
    CHECK(p[raw] == std::string("after\n") + raw);
  }
}

TEST_CASE("JSON payloads: invalid UTF-8 and unpaired surrogate escapes are refused where they start") {
  Echo echo;
  struct Bad {
    std::string text;
    const char* why;
    int column;
  };
  const Bad bad[] = {
      {"\"ab\x80\"", "a continuation byte without a lead byte", 4},
      {"\"ab\xC3\xA9\xBF\"", "a continuation byte without a lead byte", 6},
      {"\"\xC0\xAF\"", "an overlong form", 2},          // '/' in two bytes
      {"\"\xC1\xBF\"", "an overlong form", 2},          // U+007F in two bytes
      {"\"\xE0\x9F\xBF\"", "an overlong form", 2},      // U+07FF in three
      {"\"\xF0\x8F\xBF\xBF\"", "an overlong form", 2},  // U+FFFF in four
      {"\"x\xED\xA0\x80\"", "a surrogate", 3},          // U+D800
      {"\"x\xED\xBF\xBF\"", "a surrogate", 3},          // U+DFFF
      {"\"\xF4\x90\x80\x80\"", "above U+10FFFF", 2},    // U+110000
      {"\"\xF5\x80\x80\x80\"", "above U+10FFFF", 2},
      {"\"\xF8\x88\x80\x80\x80\"", "never used in UTF-8", 2},
      {"\"\xFF\"", "never used in UTF-8", 2},
      {"\"\xC3\"", "a truncated sequence", 2},  // cut by the closing quote
      {"\"\xE2\x82\"", "a truncated sequence", 2},
      {"\"\xF0\x9F\x98 \"", "a truncated sequence", 2},
      {"\"\xE2\x82", "a truncated sequence", 2},                  // cut by the end of the text
      {"{\"k\xC3\": 1}", "a truncated sequence", 4},              // in a key
      {"[\"ok\", \"\\n\xC3\x28\"]", "a truncated sequence", 11},  // after an escape
      {"\"\\ud800\"", "unpaired surrogate", 8},
      {"\"\\udc00\"", "unpaired surrogate", 8},
      {"\"\\ud800\\u0041\"", "unpaired surrogate", 14},
      {"\"\\ud800\\ud800\"", "unpaired surrogate", 14},
  };
  for (const Bad& b : bad) {
    INFO(b.text);
    json p = echo.payload(json_event("custom.json", b.text));
    REQUIRE(echo.r.logs.size() == 1);
    const std::string& warning = echo.r.logs[0].second;
    INFO(warning);
    CHECK(warning.find("not valid JSON") != std::string::npos);
    CHECK(warning.find(b.why) != std::string::npos);
    CHECK(warning.find("line 1, column " + std::to_string(b.column)) != std::string::npos);
    CHECK(p.is_string());  // delivered as text
  }
}
