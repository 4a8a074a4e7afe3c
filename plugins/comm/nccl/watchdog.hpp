// What the watchdog decides about an NCCL operation in flight, apart from
// CUDA and NCCL: the caller looks (cudaEventQuery, ncclCommGetAsyncError,
// the clock, the trace record's progress time) and acts (ncclCommAbort),
// this part only judges, so that it is tested without a GPU.
#pragma once

#include <cstdint>
#include <string>

namespace ballast::comm_nccl {

// ncclCommGetAsyncError's answer, and cudaEventQuery's on the event
// recorded after the operation.
enum class NcclState { ok, in_progress, error };
enum class EventState { pending, done, error };

// One look at an operation. Times are CLOCK_MONOTONIC ns.
struct OpState {
  int64_t now = 0;
  int64_t started = 0;
  int64_t deadline = 0;
  // The last sign of life NCCL's profiler gave after the start (a chunk
  // moved, a kernel channel started or stopped), 0 when none yet: an
  // operation queued behind the caller's kernels on its stream shows none,
  // and only its deadline applies to it.
  int64_t last_progress = 0;
  int64_t stall_ns = 0;  // fail after this long without a sign of life; 0: never
  bool abort_requested = false;
  NcclState nccl = NcclState::ok;
  EventState event = EventState::pending;
};

enum class Verdict { running, done, aborted, nccl_error, cuda_error, timed_out, stalled };

// The first that holds: abort() was called; NCCL reported an error; CUDA
// did; the event passed and NCCL has nothing in progress (done, even past
// the deadline); the deadline passed; the operation stalled; else running.
Verdict decide(const OpState& s);

// The status an operation that ended so returns (BALLAST_*).
int status_of(Verdict v);

// The failure's message: `what` (the operation and its communicator), the
// verdict, how long the operation ran, `detail` (NCCL's or CUDA's error
// string, abort()'s reason), and that the communicator was aborted. "" for
// running and done.
std::string describe(Verdict v, const std::string& what, const OpState& s, const std::string& detail);

// The watchdog's period (BALLAST_NCCL_WATCHDOG_MS, default 5) and the
// stall limit (BALLAST_NCCL_STALL_MS, default 0: off), in ns. A value that
// is not a positive integer takes the default.
int64_t watchdog_period_ns();
int64_t stall_ns();

}  // namespace ballast::comm_nccl
