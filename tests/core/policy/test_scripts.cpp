// The policies shipped in scripts/ load and do what their comments say.
#include "policy_test_util.hpp"

using ballast::Policy;
using namespace ballast_test;

namespace {

std::unique_ptr<Policy> shipped(const char* name) {
  std::unique_ptr<Policy> p;
  int rc = Policy::load(std::string(BALLAST_SOURCE_DIR) + "/scripts/" + name, {}, &p);
  INFO(ballast::last_error());
  REQUIRE(rc == BALLAST_OK);
  return p;
}

ballast_fault_report fault(uint32_t stage, const char* subject, const char* kind, double confidence) {
  ballast_fault_report f{};
  f.size = sizeof f;
  f.stage = stage;
  f.subject = subject;
  f.rank = -1;
  f.kind = kind;
  f.metric = "gpu0.util";
  f.confidence = confidence;
  f.detector = "machine";
  return f;
}

ballast_event fault_event(const char* topic, const ballast_fault_report& f) {
  return make_event(topic, BALLAST_SCHEMA_FAULT_REPORT, &f, sizeof f);
}

}  // namespace

TEST_CASE("default.lua: a confirmed machine fault evicts and replaces the machine") {
  auto p = shipped("default.lua");
  Recorder r;
  auto f = fault(BALLAST_FAULT_CONFIRMED, "gpu007", "outlier", 0.97);
  auto e = fault_event("fault.confirmed", f);
  CHECK(p->handle(e, r) == 1);
  CHECK(r.errors.empty());
  REQUIRE(r.actions.size() == 2);
  CHECK(r.actions[0].action == "evict");
  CHECK(r.actions[0].subject == "gpu007");
  CHECK(r.actions[1].action == "replace");
  CHECK(r.actions[1].subject == "gpu007");
  CHECK(nlohmann::json::parse(r.actions[1].args_json) == nlohmann::json{{"count", 1}});
  CHECK(r.actions[0].reason.find("outlier") != std::string::npos);
  CHECK(r.actions[0].cause_topic == "fault.confirmed");
}

TEST_CASE("default.lua: a confirmed rank fault restarts the rank") {
  auto p = shipped("default.lua");
  Recorder r;
  auto f = fault(BALLAST_FAULT_CONFIRMED, "rank:12", "crashed", 1.0);
  f.rank = 12;
  auto e = fault_event("fault.confirmed", f);
  p->handle(e, r);
  REQUIRE(r.actions.size() == 1);
  CHECK(r.actions[0].action == "restart");
  CHECK(r.actions[0].subject == "rank:12");
}

TEST_CASE("default.lua: a confident suspicion checkpoints once per cooldown, a weak one does nothing") {
  auto p = shipped("default.lua");
  Recorder r;
  auto weak = fault(BALLAST_FAULT_SUSPECTED, "gpu003", "outlier", 0.5);
  auto e1 = fault_event("fault.suspected", weak);
  p->handle(e1, r);
  CHECK(r.actions.empty());
  auto strong = fault(BALLAST_FAULT_SUSPECTED, "gpu003", "outlier", 0.95);
  auto e2 = fault_event("fault.suspected", strong);
  p->handle(e2, r);
  REQUIRE(r.actions.size() == 1);
  CHECK(r.actions[0].action == "checkpoint_now");
  CHECK(r.actions[0].reason.find("gpu003") != std::string::npos);
  p->handle(e2, r);  // within the cooldown
  CHECK(r.actions.size() == 1);
  CHECK(r.logs.size() == 1);
  CHECK(r.errors.empty());
}

TEST_CASE("default.lua: a worker straggler blamed in 3 reports in a row is evicted, other stragglers are not") {
  auto p = shipped("default.lua");
  Recorder r;
  ballast_straggler_culprit culprits[] = {{"rank", "17", 1.4}, {"rank", "5", 1.1}, {"stage", "2", 1.1}};
  ballast_straggler_report rep{};
  rep.size = sizeof rep;
  rep.count = 3;
  rep.slowdown = 1.5;
  rep.kind = "worker";
  rep.culprits = culprits;
  auto e = make_event("straggler.report", BALLAST_SCHEMA_STRAGGLER_REPORT, &rep, sizeof rep);
  p->handle(e, r);
  p->handle(e, r);
  CHECK(r.actions.empty());  // two reports may be noise
  // The third blames rank 5 first, but rank 17 has the most blame over the three.
  ballast_straggler_culprit third[] = {{"rank", "5", 1.45}, {"rank", "17", 1.3}};
  rep.culprits = third;
  rep.count = 2;
  p->handle(e, r);
  REQUIRE(r.actions.size() == 2);
  CHECK(r.actions[0].action == "evict");
  CHECK(r.actions[0].subject == "rank:17");
  CHECK(r.actions[1].action == "replace");
  CHECK(r.actions[1].subject == "rank:17");
  CHECK(r.actions[0].reason.find("over 3 reports") != std::string::npos);

  r.clear();
  rep.culprits = culprits;
  rep.count = 3;
  p->handle(e, r);
  p->handle(e, r);
  rep.slowdown = 1.05;  // small: nothing, and the run of reports starts again
  p->handle(e, r);
  rep.slowdown = 1.5;
  p->handle(e, r);
  CHECK(r.actions.empty());

  rep.slowdown = 1.6;
  rep.kind = "stage";  // no single machine to blame: logged only
  p->handle(e, r);
  CHECK(r.actions.empty());
  CHECK(r.logs.back().second.find("no single worker to evict") != std::string::npos);
  CHECK(r.errors.empty());
}

TEST_CASE("default.lua: a silent node pauses the job and escalates") {
  auto p = shipped("default.lua");
  Recorder r;
  auto f = fault(BALLAST_FAULT_SUSPECTED, "gpu042", "silent", 0.8);
  auto e = fault_event("node.silent", f);
  p->handle(e, r);
  REQUIRE(r.actions.size() == 2);
  CHECK(r.actions[0].action == "pause");
  CHECK(r.actions[1].action == "escalate");
  CHECK(r.actions[1].subject == "gpu042");
  CHECK(r.errors.empty());
}

TEST_CASE("default.lua subscribes to exactly what it handles") {
  auto p = shipped("default.lua");
  CHECK(p->patterns() ==
        std::vector<std::string>{"fault.confirmed", "fault.suspected", "straggler.report", "node.silent"});
  Recorder r;
  auto e = make_event("metric.sample");
  CHECK(p->handle(e, r) == 0);
}

TEST_CASE("observe.lua logs faults and stragglers and takes no action") {
  auto p = shipped("observe.lua");
  Recorder r;
  auto f = fault(BALLAST_FAULT_CONFIRMED, "gpu007", "outlier", 0.97);
  auto e = fault_event("fault.confirmed", f);
  CHECK(p->handle(e, r) == 1);
  auto s = fault_event("node.silent", f);
  CHECK(p->handle(s, r) == 1);
  CHECK(r.actions.empty());
  CHECK(r.errors.empty());
  REQUIRE(r.logs.size() == 2);
  CHECK(r.logs[0].second.find("gpu007") != std::string::npos);
}
