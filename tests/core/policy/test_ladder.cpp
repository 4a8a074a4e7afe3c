// scripts/default.lua as ByteRobust's ladder: each rung's event and the
// actions it gets (the rungs are listed in the script's header).
#include "policy_test_util.hpp"

using ballast::Policy;
using namespace ballast_test;

namespace {

std::unique_ptr<Policy> ladder() {
  std::unique_ptr<Policy> p;
  int rc = Policy::load(std::string(BALLAST_SOURCE_DIR) + "/scripts/default.lua", {}, &p);
  INFO(ballast::last_error());
  REQUIRE(rc == BALLAST_OK);
  return p;
}

// A fault.confirmed as the executor or a detector publishes it, at second t.
struct Fault {
  std::string subject, kind, detector, evidence;
  int rank = -1;
  double t = 1000;

  ballast_fault_report report() const {
    ballast_fault_report f{};
    f.size = sizeof f;
    f.stage = BALLAST_FAULT_CONFIRMED;
    f.subject = subject.c_str();
    f.rank = rank;
    f.kind = kind.c_str();
    f.metric = "process.exit";
    f.confidence = 1.0;
    f.detector = detector.c_str();
    f.evidence = evidence.empty() ? nullptr : evidence.c_str();
    return f;
  }
};

std::vector<ballast::PolicyAction> handle(Policy& p, const Fault& fault) {
  Recorder r;
  const ballast_fault_report f = fault.report();
  ballast_event e = make_event("fault.confirmed", BALLAST_SCHEMA_FAULT_REPORT, &f, sizeof f);
  e.ts_ns = int64_t(fault.t * 1e9);
  p.handle(e, r);
  INFO((r.errors.empty() ? std::string() : r.errors[0]));
  CHECK(r.errors.empty());
  return r.actions;
}

std::string verdict(const std::string& causes) {
  return R"({"verdict":"hang","communicator":"43a3","seq":7,"op":"allreduce","ranks":[0,1,2,3],"root_cause":)" +
         causes + "}";
}

}  // namespace

TEST_CASE("ladder: a hang verdict naming one rank isolates its node, once per verdict") {
  auto p = ladder();
  const std::string ev = verdict(R"([{"rank":2,"kind":"not_joined","evidence":"never started seq 7"}])");
  auto a = handle(*p, {"rank:2", "not_joined", "hang", ev, 2});
  REQUIRE(a.size() == 2);
  CHECK(a[0].action == "evict");
  CHECK(a[0].subject == "rank:2");
  CHECK(a[1].action == "replace");
  CHECK(a[1].subject == "rank:2");
  CHECK(a[0].reason.find("isolating the node of rank 2") != std::string::npos);
  CHECK(handle(*p, {"rank:2", "not_joined", "hang", ev, 2, 1001}).empty());  // the same verdict again
}

TEST_CASE("ladder: an uncertain hang verdict over-evicts the group it names") {
  auto p = ladder();
  const std::string ev =
      verdict(R"([{"rank":1,"kind":"stuck","evidence":"x"},{"rank":3,"kind":"link","evidence":"y","link":[0,3]}])");
  auto a = handle(*p, {"rank:1", "stuck", "hang", ev, 1});
  REQUIRE(a.size() == 6);
  for (size_t i = 0; i < 6; i += 2) {
    CHECK(a[i].action == "evict");
    CHECK(a[i + 1].action == "replace");
    CHECK(a[i].reason.find("uncertain verdict, over-evicting the group of ranks 0,1,3") != std::string::npos);
  }
  CHECK(a[0].subject == "rank:0");
  CHECK(a[2].subject == "rank:1");
  CHECK(a[4].subject == "rank:3");
  CHECK(handle(*p, {"rank:3", "link", "hang", ev, 3}).empty());  // the verdict's other event
}

TEST_CASE("ladder: a hang verdict on a rank the executor saw crash is that crash, not a second fault") {
  auto p = ladder();
  auto crash =
      handle(*p, {"rank:1", "crashed", "executor", R"({"pid":42,"how":"was killed by signal 9","step":30})", 1, 1000});
  REQUIRE(crash.size() == 1);
  CHECK(crash[0].action == "restart");
  CHECK(handle(*p, {"rank:1", "not_joined", "hang", verdict(R"([{"rank":1,"kind":"not_joined","evidence":"gone"}])"), 1,
                    1002})
            .empty());
}

TEST_CASE("ladder: a NaN rolls back to the checkpoint before its step; a NaN again at that step escalates") {
  auto p = ladder();
  auto a = handle(*p, {"rank:0", "nan", "executor",
                       R"({"step":57,"message":"the loss of step 57 is not finite","error_kind":"nan"})", 0});
  REQUIRE(a.size() == 1);
  CHECK(a[0].action == "rollback");
  CHECK(a[0].subject.empty());
  CHECK(nlohmann::json::parse(a[0].args_json) == nlohmann::json{{"before_step", 57}});
  auto again = handle(*p, {"rank:0", "nan", "executor", R"({"step":57})", 0, 1100});
  REQUIRE(again.size() == 1);
  CHECK(again[0].action == "escalate");
  CHECK(again[0].reason.find("NaN loss again at step 57") != std::string::npos);
  auto later = handle(*p, {"rank:0", "nan", "executor", R"({"step":90})", 0, 1200});
  REQUIRE(later.size() == 1);
  CHECK(later[0].action == "rollback");
}

TEST_CASE("ladder: a user-code error stops the job for a person with the trainer's message, no eviction") {
  auto p = ladder();
  auto a = handle(*p, {"rank:3", "user_error", "executor",
                       R"({"step":12,"message":"user code raised an error at step 12","error_kind":"user"})", 3});
  REQUIRE(a.size() == 1);
  CHECK(a[0].action == "escalate");
  CHECK(a[0].reason == "user-code error at step 12 on rank:3: user code raised an error at step 12");
}

TEST_CASE("ladder: crashes restart the job; the fourth within the window escalates; later ones restart again") {
  auto p = ladder();
  for (double t : {0.0, 600.0, 1200.0}) {
    auto a = handle(*p, {"rank:1", "crashed", "executor", "", 1, t});
    REQUIRE(a.size() == 1);
    CHECK(a[0].action == "restart");
  }
  auto a = handle(*p, {"rank:2", "crashed", "executor", "", 2, 1700});
  REQUIRE(a.size() == 1);
  CHECK(a[0].action == "escalate");
  CHECK(a[0].reason.find("3 restarts within 1800 s") != std::string::npos);
  auto b = handle(*p, {"rank:2", "crashed", "executor", "", 2, 5000});
  REQUIRE(b.size() == 1);
  CHECK(b[0].action == "restart");
  // Reported with it (several nodes of one outage): restarted, counted once.
  for (int i = 0; i < 4; ++i) {
    auto c = handle(*p, {"node-" + std::to_string(i), "unknown", "inspection", "", -1, 5003});
    REQUIRE(c.size() == 1);
    CHECK(c[0].action == "restart");
  }
}

TEST_CASE("ladder: an explicit machine fault evicts and replaces at once; an unknown one restarts") {
  auto p = ladder();
  auto a = handle(*p, {"node-17", "hardware", "inspection", R"({"class":"GPU","desc":"GPU xid Error"})"});
  REQUIRE(a.size() == 2);
  CHECK(a[0].action == "evict");
  CHECK(a[0].subject == "node-17");
  CHECK(a[1].action == "replace");
  auto u = handle(*p, {"node-18", "unknown", "inspection", ""});
  REQUIRE(u.size() == 1);
  CHECK(u[0].action == "restart");
  CHECK(u[0].subject == "node-18");
}

TEST_CASE("ladder: a hang verdict whose rank's process is gone, before the executor said so, restarts") {
  auto p = ladder();
  auto a = handle(
      *p,
      {"rank:1", "not_joined", "hang",
       verdict(
           R"([{"rank":1,"kind":"not_joined","evidence":"process pid 20671 is gone (shut down) but did not join seq 7"}])"),
       1});
  REQUIRE(a.size() == 1);
  CHECK(a[0].action == "restart");
  CHECK(a[0].reason.find("the process is gone") != std::string::npos);
}

TEST_CASE("ladder: a verdict naming a crashed rank among others is that crash, whichever cause's event comes first") {
  auto p = ladder();
  REQUIRE(handle(*p, {"rank:1", "crashed", "executor", R"({"pid":42,"step":30})", 1, 1000}).size() == 1);
  const std::string ev = verdict(R"([{"rank":1,"kind":"crashed","evidence":"process pid 42 is gone"},)"
                                 R"({"rank":3,"kind":"crashed","evidence":"process pid 44 is gone"}])");
  CHECK(handle(*p, {"rank:3", "crashed", "hang", ev, 3, 1003}).empty());
  CHECK(handle(*p, {"rank:1", "crashed", "hang", ev, 1, 1003}).empty());
}

TEST_CASE("ladder: a verdict whose causes are all gone processes restarts, it does not over-evict") {
  auto p = ladder();
  const std::string ev = verdict(R"([{"rank":1,"kind":"crashed","evidence":"process pid 42 is gone"},)"
                                 R"({"rank":3,"kind":"crashed","evidence":"process pid 44 is gone"}])");
  auto a = handle(*p, {"rank:1", "crashed", "hang", ev, 1});
  REQUIRE(a.size() == 1);
  CHECK(a[0].action == "restart");
  CHECK(handle(*p, {"rank:3", "crashed", "hang", ev, 3}).empty());
}
