// The NCCL watchdog's judgement of an operation in flight (watchdog.hpp),
// apart from CUDA and NCCL: runs without a GPU.
#include <doctest/doctest.h>

#include <watchdog.hpp>

#include <ballast/status.h>

#include <cstdlib>
#include <string>

namespace {

using namespace ballast::comm_nccl;

constexpr int64_t kMs = 1000000;

// An operation started at 1 s with a 10 s deadline, looked at 2 s in:
// NCCL idle, its event not passed yet.
OpState running_op() {
  OpState s;
  s.started = 1000 * kMs;
  s.deadline = s.started + 10000 * kMs;
  s.now = s.started + 2000 * kMs;
  return s;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("an operation whose event passed is done, even past its deadline, unless NCCL still works on it") {
  OpState s = running_op();
  CHECK(decide(s) == Verdict::running);
  s.event = EventState::done;
  CHECK(decide(s) == Verdict::done);
  s.now = s.deadline + 1;
  CHECK(decide(s) == Verdict::done);
  s.now = s.started + kMs;
  s.nccl = NcclState::in_progress;  // still connecting: the event says nothing yet
  CHECK(decide(s) == Verdict::running);
  CHECK(status_of(Verdict::done) == BALLAST_OK);
  CHECK(describe(Verdict::done, "allreduce seq 1", s, "").empty());
}

TEST_CASE("the deadline fails an operation that did not complete, whatever NCCL says") {
  OpState s = running_op();
  s.now = s.deadline;
  CHECK(decide(s) == Verdict::running);  // at the deadline, not past it
  s.now = s.deadline + 1;
  CHECK(decide(s) == Verdict::timed_out);
  s.nccl = NcclState::in_progress;
  CHECK(decide(s) == Verdict::timed_out);
  CHECK(status_of(Verdict::timed_out) == BALLAST_ETIMEDOUT);
  s.now = s.started + 10500 * kMs;
  const std::string m = describe(Verdict::timed_out, "allreduce seq 7 on communicator 00ab (rank 1 of 4)", s, "");
  CHECK(contains(m, "allreduce seq 7 on communicator 00ab (rank 1 of 4)"));
  CHECK(contains(m, "timed out"));
  CHECK(contains(m, "10.500 s"));
  CHECK(contains(m, "ncclCommAbort was called"));
}

TEST_CASE("abort(), then an asynchronous NCCL error, then a CUDA error come before anything else") {
  OpState s = running_op();
  s.event = EventState::done;
  s.now = s.deadline + 1;
  s.nccl = NcclState::error;
  CHECK(decide(s) == Verdict::nccl_error);
  s.event = EventState::error;
  CHECK(decide(s) == Verdict::nccl_error);
  s.abort_requested = true;
  CHECK(decide(s) == Verdict::aborted);
  s.abort_requested = false;
  s.nccl = NcclState::ok;
  CHECK(decide(s) == Verdict::cuda_error);
  CHECK(status_of(Verdict::aborted) == BALLAST_EABORTED);
  CHECK(status_of(Verdict::nccl_error) == BALLAST_EPEER);
  CHECK(status_of(Verdict::cuda_error) == BALLAST_EIO);

  s = running_op();
  const std::string nccl = describe(Verdict::nccl_error, "broadcast seq 3", s,
                                    "remote process exited or there was a network error: NET/Socket");
  CHECK(contains(nccl, "broadcast seq 3 failed in NCCL after 2.000 s: remote process exited"));
  CHECK(contains(nccl, "ncclCommAbort was called"));
  const std::string ab = describe(Verdict::aborted, "barrier seq 9", s, "the launcher saw rank 3 die");
  CHECK(contains(ab, "barrier seq 9 aborted after 2.000 s: the launcher saw rank 3 die"));
  CHECK(contains(describe(Verdict::cuda_error, "recv with rank 2", s, "an illegal memory access"),
                 "CUDA error an illegal memory access"));
}

TEST_CASE(
    "an operation that showed life and then none for the stall limit has stalled; one never seen running has not") {
  OpState s = running_op();
  s.stall_ns = 500 * kMs;
  s.now = s.started + 5000 * kMs;
  CHECK(decide(s) == Verdict::running);  // queued behind the caller's kernels: only the deadline counts
  s.last_progress = s.started + 4600 * kMs;
  CHECK(decide(s) == Verdict::running);
  s.last_progress = s.started + 4400 * kMs;
  CHECK(decide(s) == Verdict::stalled);
  CHECK(status_of(Verdict::stalled) == BALLAST_ETIMEDOUT);
  const std::string m = describe(Verdict::stalled, "allgather seq 2", s, "");
  CHECK(contains(m, "no progress for 0.600 s (limit 0.500 s)"));
  CHECK(contains(m, "running for 5.000 s"));
  s.stall_ns = 0;  // off
  CHECK(decide(s) == Verdict::running);
  s.stall_ns = 500 * kMs;
  s.event = EventState::done;  // done wins over stalled
  CHECK(decide(s) == Verdict::done);
}

TEST_CASE("the watchdog's period and stall limit come from the environment, positive integers only") {
  unsetenv("BALLAST_NCCL_WATCHDOG_MS");
  unsetenv("BALLAST_NCCL_STALL_MS");
  CHECK(watchdog_period_ns() == 5 * kMs);
  CHECK(stall_ns() == 0);
  setenv("BALLAST_NCCL_WATCHDOG_MS", "20", 1);
  setenv("BALLAST_NCCL_STALL_MS", "60000", 1);
  CHECK(watchdog_period_ns() == 20 * kMs);
  CHECK(stall_ns() == 60000 * kMs);
  for (const char* bad : {"0", "-3", "10ms", ""}) {
    setenv("BALLAST_NCCL_WATCHDOG_MS", bad, 1);
    CHECK(watchdog_period_ns() == 5 * kMs);
  }
  unsetenv("BALLAST_NCCL_WATCHDOG_MS");
  unsetenv("BALLAST_NCCL_STALL_MS");
}
