// The executor's action bookkeeping: one action at a time, merged restarts,
// retries with back-off, and the restart-loop rule.
#include <doctest/doctest.h>

#include "actions.hpp"

using namespace ballast::runner;

namespace {
Action make(uint64_t id, const std::string& name) {
  Action a;
  a.id = id;
  a.name = name;
  return a;
}
}  // namespace

TEST_CASE("actions run one at a time in order; a restart merges into a queued restart") {
  ActionQueue q;
  uint64_t into = 0;
  CHECK(q.push(make(1, "checkpoint_now"), &into));
  CHECK(q.push(make(2, "rollback"), &into));
  CHECK_FALSE(q.push(make(3, "restart"), &into));
  CHECK(into == 2);
  CHECK(q.push(make(4, "escalate"), &into));
  CHECK(q.pop_due(0)->id == 1);
  CHECK(q.pop_due(0)->id == 2);
  CHECK(q.pop_due(0)->id == 4);
  CHECK_FALSE(q.pop_due(0));
}

TEST_CASE("a failed action is retried after a doubling back-off, then given up") {
  ActionQueue q(RetryPolicy{3, 1.0});
  Action a = make(7, "restart");
  CHECK(q.retry(a, 0));  // 2nd try after 1 s
  CHECK_FALSE(q.pop_due(999999999));
  auto second = q.pop_due(1000000000);
  REQUIRE(second);
  CHECK(second->tries == 1);
  CHECK(q.retry(*second, 1000000000));  // 3rd try after 2 s more
  CHECK_FALSE(q.pop_due(2999999999));
  auto third = q.pop_due(3000000000);
  REQUIRE(third);
  CHECK_FALSE(q.retry(*third, 3000000000));  // no 4th try: escalate
  CHECK(q.empty());
}

TEST_CASE("the same fault after each restart without progress is a loop") {
  RestartLoop rule(3);
  CHECK(rule.note("crashed rank:1", 49) == 1);
  CHECK(rule.note("crashed rank:1", 49) == 2);
  CHECK(rule.note("crashed rank:1", 49) == 3);
  CHECK_FALSE(rule.looping());
  CHECK(rule.note("crashed rank:1", 49) == 4);
  CHECK(rule.looping());
  // Progress past the fault's step, or another fault, starts the count again.
  CHECK(rule.note("crashed rank:1", 80) == 1);
  CHECK(rule.note("stuck rank:2", 80) == 1);
  CHECK_FALSE(rule.looping());
}

TEST_CASE("action names") {
  for (const char* a : {"restart", "evict", "replace", "rollback", "checkpoint_now", "pause", "escalate"})
    CHECK(known_action(a));
  CHECK_FALSE(known_action("reboot"));
  CHECK(restarts_job("rollback"));
  CHECK_FALSE(restarts_job("pause"));
}
