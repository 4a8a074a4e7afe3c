// Policy handlers, actions and their validation, the ballast library,
// load errors and reload.
#include "policy_test_util.hpp"
#include "topic.hpp"

#include <ballast/plugin.h>

#include <chrono>

using ballast::Policy;
using ballast::PolicyOptions;
using namespace ballast_test;

namespace {

// Run one event through `script`; the recorder has what came out.
Recorder run_one(const std::string& script, const char* topic = "x", PolicyOptions o = {}) {
  TempDir dir;
  auto p = load_script(dir, script, o);
  Recorder r;
  ballast_event e = make_event(topic);
  p->handle(e, r);
  return r;
}

int load_status(const std::string& script, PolicyOptions o = {}) {
  TempDir dir;
  std::unique_ptr<Policy> p;
  return Policy::load(dir.write("bad.lua", script), o, &p);
}

}  // namespace

TEST_CASE("handlers match exact topics, prefixes and everything, in registration order") {
  TempDir dir;
  auto p = load_script(dir,
                       "ballast.on('fault.confirmed', function() return {action='evict', reason='exact'} end)\n"
                       "ballast.on('fault.*', function() return {action='pause', reason='prefix'} end)\n"
                       "ballast.on('*', function() return {action='escalate', reason='all'} end)\n");
  CHECK(p->patterns() == std::vector<std::string>{"fault.confirmed", "fault.*", "*"});
  Recorder r;
  ballast_event e = make_event("fault.confirmed");
  CHECK(p->handle(e, r) == 3);
  REQUIRE(r.actions.size() == 3);
  CHECK(r.actions[0].reason == "exact");
  CHECK(r.actions[1].reason == "prefix");
  CHECK(r.actions[2].reason == "all");
  r.clear();
  ballast_event f = make_event("fault");  // "fault.*" needs something after the dot
  CHECK(p->handle(f, r) == 1);
  ballast_event g = make_event("fault.suspected.deep");
  CHECK(p->handle(g, r) == 2);
  CHECK(p->name() == "test");
}

TEST_CASE("the event reaches the handler as a table") {
  Recorder r = run_one(
      "ballast.on('x', function(ev)\n"
      "  assert(ev.topic == 'x')\n"
      "  assert(ev.ts_ns == 1700000000123456789)\n"
      "  assert(math.abs(ev.ts - 1700000000.123456789) < 1e-6)\n"
      "  assert(ev.source.node == 'gpu001' and ev.source.rank == 3 and ev.source.plugin == 'test')\n"
      "  assert(ev.payload == nil)\n"
      "  return {action = 'pause'}\n"
      "end)\n");
  CHECK(r.errors.empty());
  CHECK(r.actions.size() == 1);
}

TEST_CASE("a handler returns nothing, one action, or a list of actions") {
  CHECK(run_one("ballast.on('x', function() end)").actions.empty());
  CHECK(run_one("ballast.on('x', function() return false end)").actions.empty());
  CHECK(run_one("ballast.on('x', function() return {} end)").actions.empty());
  Recorder one = run_one(
      "ballast.on('x', function() return {action='evict', subject='gpu3', reason='bad', args={n=2, l={1,2}}} end)");
  REQUIRE(one.actions.size() == 1);
  CHECK(one.actions[0].action == "evict");
  CHECK(one.actions[0].subject == "gpu3");
  CHECK(one.actions[0].reason == "bad");
  CHECK(nlohmann::json::parse(one.actions[0].args_json) == nlohmann::json{{"n", 2}, {"l", {1, 2}}});
  CHECK(one.actions[0].cause_topic == "x");
  CHECK_FALSE(one.actions[0].fallback);
  Recorder list = run_one("ballast.on('x', function() return {{action='evict', subject=7}, {action='replace'}} end)");
  REQUIRE(list.actions.size() == 2);
  CHECK(list.actions[0].subject == "7");
  CHECK(list.actions[0].args_json == "{}");
  CHECK(list.actions[1].action == "replace");
  for (const char* a : ballast::kRecoveryActions) {
    Recorder r = run_one(std::string("ballast.on('x', function() return {action='") + a + "'} end)");
    CHECK(r.errors.empty());
  }
}

TEST_CASE("an invalid action is a policy error followed by the fallback") {
  struct Case {
    const char* ret;
    const char* expected;
  } cases[] = {
      {"{action='reboot'}", "unknown action 'reboot'"},
      {"{action='evict', subjct='x'}", "unknown field 'subjct'"},
      {"{subject='x'}", "needs a field 'action'"},
      {"{action=3}", "'action' must be a string"},
      {"{action='evict', reason={}}", "'reason' must be a string"},
      {"{action='evict', args={1,2}}", "'args' must be a table with string keys"},
      {"{action='evict', args={f=function() end}}", "'args.f': a function"},
      {"{{action='evict'}, {action='nope'}}", "action [2]: unknown action 'nope'"},
      {"'evict'", "not a string"},
      {"{action='evict', [5]=1}", "only the fields"},
  };
  for (const Case& c : cases) {
    PolicyOptions o;
    o.fallback_action = "pause";
    Recorder r = run_one(std::string("ballast.on('x', function() return ") + c.ret + " end)", "x", o);
    INFO(std::string(c.ret));
    REQUIRE(r.errors.size() == 1);
    INFO(r.errors[0]);
    CHECK(r.errors[0].find(c.expected) != std::string::npos);
    CHECK(r.errors[0].find("returned an invalid action") != std::string::npos);
    REQUIRE(r.actions.size() == 1);  // nothing of a bad list is emitted, only the fallback
    CHECK(r.actions[0].fallback);
    CHECK(r.actions[0].action == "pause");
  }
}

TEST_CASE("a script error names the file and line, has a traceback, and leads to the fallback") {
  TempDir dir;
  auto p = load_script(dir,
                       "local function inner(ev)\n"
                       "  return ev.payload.missing.field\n"
                       "end\n"
                       "ballast.on('x', function(ev) return inner(ev) end)\n"
                       "ballast.on('x', function(ev) return {action='pause', reason='second'} end)\n");
  Recorder r;
  ballast_event e = make_event("x");
  CHECK(p->handle(e, r) == 2);
  REQUIRE(r.errors.size() == 1);
  INFO(r.errors[0]);
  CHECK(r.errors[0].find("test.lua:2:") != std::string::npos);
  CHECK(r.errors[0].find("stack traceback") != std::string::npos);
  CHECK(r.errors[0].find("handler for 'x'") != std::string::npos);
  // The second handler still ran; the fallback comes last.
  REQUIRE(r.actions.size() == 2);
  CHECK(r.actions[0].reason == "second");
  CHECK(r.actions[1].fallback);
  CHECK(r.actions[1].action == "escalate");
  CHECK(r.actions[1].reason.find("test.lua:2:") != std::string::npos);
}

TEST_CASE("ballast.publish, ballast.log, ballast.now and ballast.action") {
  TempDir dir;
  auto p =
      load_script(dir,
                  "ballast.log('info', 'loaded')\n"
                  "ballast.on('x', function(ev)\n"
                  "  ballast.publish('policy.note', {n = 1, list = {1, 2}, name = ev.topic, none = ballast.null})\n"
                  "  ballast.log('warn', 'w') ballast.log('debug', 'd') ballast.log('error', 'e')\n"
                  "  local now = ballast.now()\n"
                  "  return ballast.action{action = 'pause', reason = string.format('%.0f', now)}\n"
                  "end)\n"
                  "ballast.on('bad', function() return ballast.action{action = 'reboot'} end)\n"
                  "ballast.on('badlog', function() ballast.log('loud', 'x') end)\n"
                  "ballast.on('badtopic', function() ballast.publish('a b', {}) end)\n"
                  "ballast.on('late', function() ballast.on('y', function() end) end)\n");
  Recorder r;
  ballast_event e = make_event("x");
  p->handle(e, r);
  CHECK(r.errors.empty());
  REQUIRE(r.published.size() == 1);
  CHECK(r.published[0].first == "policy.note");
  CHECK(nlohmann::json::parse(r.published[0].second) ==
        nlohmann::json{{"n", 1}, {"list", {1, 2}}, {"name", "x"}, {"none", nullptr}});
  REQUIRE(r.logs.size() == 4);
  CHECK(r.logs[0] == std::make_pair(int(BALLAST_LOG_INFO), std::string("loaded")));
  CHECK(r.logs[1].first == BALLAST_LOG_WARN);
  CHECK(r.logs[2].first == BALLAST_LOG_DEBUG);
  CHECK(r.logs[3].first == BALLAST_LOG_ERROR);
  REQUIRE(r.actions.size() == 1);
  double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  CHECK(std::abs(std::stod(r.actions[0].reason) - now) < 60);

  struct Case {
    const char* topic;
    const char* expected;
  } cases[] = {{"bad", "test.lua:8: ballast.action: unknown action 'reboot'"},
               {"badlog", "unknown level 'loud'"},
               {"badtopic", "ballast.publish: \"a b\" is not a valid topic"},
               {"late", "top level of the script only"}};
  for (const Case& c : cases) {
    r.clear();
    ballast_event b = make_event(c.topic);
    p->handle(b, r);
    REQUIRE(r.errors.size() == 1);
    INFO(r.errors[0]);
    CHECK(r.errors[0].find(c.expected) != std::string::npos);
  }
}

TEST_CASE("load errors name the file and the line") {
  CHECK(load_status("ballast.on('x', function() end") == BALLAST_EFORMAT);
  CHECK(std::string(ballast::last_error()).find("bad.lua:1:") != std::string::npos);
  CHECK(load_status("local x = 1\nerror('boom')") == BALLAST_EINVAL);
  CHECK(std::string(ballast::last_error()).find("bad.lua:2: boom") != std::string::npos);
  CHECK(load_status("ballast.on('a*', function() end)") == BALLAST_EINVAL);
  CHECK(std::string(ballast::last_error()).find("ballast.on: \"a*\" is not a valid pattern") != std::string::npos);
  // The bus's grammar: upper case is refused where the script says it.
  CHECK(load_status("ballast.on('Fault.Confirmed', function() end)") == BALLAST_EINVAL);
  CHECK(std::string(ballast::last_error())
            .find("bad.lua:1: ballast.on: " + ballast::invalid_pattern_message("Fault.Confirmed")) !=
        std::string::npos);
  CHECK(load_status("ballast.publish('x', {})") == BALLAST_EINVAL);
  CHECK(std::string(ballast::last_error()).find("only inside a handler") != std::string::npos);
  PolicyOptions o;
  o.fallback_action = "reboot";
  CHECK(load_status("", o) == BALLAST_EINVAL);
  CHECK(std::string(ballast::last_error()).find("fallback action 'reboot'") != std::string::npos);
  std::unique_ptr<Policy> p;
  CHECK(Policy::load("/nonexistent/policy.lua", {}, &p) == BALLAST_ENOTFOUND);
  CHECK(std::string(ballast::last_error()).find("/nonexistent/policy.lua") != std::string::npos);
}

TEST_CASE("reload takes the new file, and keeps the old state when the new one fails") {
  TempDir dir;
  std::string path = dir.write("p.lua", "ballast.on('a', function() return {action='pause'} end)");
  std::unique_ptr<Policy> p;
  REQUIRE(Policy::load(path, {}, &p) == BALLAST_OK);
  dir.write("p.lua", "ballast.on('b', function() return {action='restart'} end)");
  REQUIRE(p->reload() == BALLAST_OK);
  CHECK(p->patterns() == std::vector<std::string>{"b"});
  Recorder r;
  ballast_event b = make_event("b");
  p->handle(b, r);
  REQUIRE(r.actions.size() == 1);
  CHECK(r.actions[0].action == "restart");

  dir.write("p.lua", "ballast.on('c', function( end)");
  CHECK(p->reload() == BALLAST_EFORMAT);
  CHECK(std::string(ballast::last_error()).find("p.lua:1:") != std::string::npos);
  CHECK(p->patterns() == std::vector<std::string>{"b"});
  r.clear();
  p->handle(b, r);
  REQUIRE(r.actions.size() == 1);
  CHECK(r.actions[0].action == "restart");
  CHECK(p->memory_in_use() > 0);
  CHECK(p->path() == path);
}

TEST_CASE("a sink that calls back into the policy is refused, not corrupting it") {
  TempDir dir;
  auto p = load_script(dir,
                       "ballast.on('x', function() ballast.publish('y', {}) return {action='pause'} end)\n"
                       "ballast.on('y', function() return {action='restart'} end)\n");
  struct Reentrant : Recorder {
    Policy* policy = nullptr;
    int reload_status = 0;
    void on_publish(ballast::OwnedEvent event) override {
      Recorder::on_publish(std::move(event));
      ballast_event e = make_event("y");
      policy->handle(e, *this);  // refused
      reload_status = policy->reload();
    }
  } r;
  r.policy = p.get();
  ballast_event e = make_event("x");
  CHECK(p->handle(e, r) == 1);
  CHECK(r.reload_status == BALLAST_ESTATE);
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].find("called from inside a handler") != std::string::npos);
  REQUIRE(r.actions.size() == 1);
  CHECK(r.actions[0].action == "pause");
  r.clear();
  r.policy = nullptr;
  struct Plain : Recorder {
  } plain;
  ballast_event y = make_event("y");
  p->handle(y, plain);
  REQUIRE(plain.actions.size() == 1);
  CHECK(plain.actions[0].action == "restart");
}
