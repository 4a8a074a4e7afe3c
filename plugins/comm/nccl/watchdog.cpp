#include "watchdog.hpp"

#include <ballast/status.h>

#include <cstdio>
#include <cstdlib>

namespace ballast::comm_nccl {

namespace {

std::string seconds(int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f s", double(ns) / 1e9);
  return buf;
}

int64_t env_ms(const char* name, int64_t dflt_ms) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt_ms * 1000000;
  char* end = nullptr;
  const long long ms = std::strtoll(v, &end, 10);
  return *end == '\0' && ms > 0 ? int64_t(ms) * 1000000 : dflt_ms * 1000000;
}

}  // namespace

Verdict decide(const OpState& s) {
  if (s.abort_requested) return Verdict::aborted;
  if (s.nccl == NcclState::error) return Verdict::nccl_error;
  if (s.event == EventState::error) return Verdict::cuda_error;
  if (s.event == EventState::done && s.nccl == NcclState::ok) return Verdict::done;
  if (s.now > s.deadline) return Verdict::timed_out;
  if (s.stall_ns > 0 && s.last_progress > 0 && s.now - s.last_progress > s.stall_ns) return Verdict::stalled;
  return Verdict::running;
}

int status_of(Verdict v) {
  switch (v) {
    case Verdict::running:
    case Verdict::done:
      return BALLAST_OK;
    case Verdict::aborted:
      return BALLAST_EABORTED;
    case Verdict::nccl_error:
      return BALLAST_EPEER;
    case Verdict::cuda_error:
      return BALLAST_EIO;
    case Verdict::timed_out:
    case Verdict::stalled:
      return BALLAST_ETIMEDOUT;
  }
  return BALLAST_EINTERNAL;
}

std::string describe(Verdict v, const std::string& what, const OpState& s, const std::string& detail) {
  const std::string ran = seconds(s.now - s.started);
  std::string m;
  switch (v) {
    case Verdict::running:
    case Verdict::done:
      return "";
    case Verdict::aborted:
      m = what + " aborted after " + ran + ": " + detail;
      break;
    case Verdict::nccl_error:
      m = what + " failed in NCCL after " + ran + ": " + detail;
      break;
    case Verdict::cuda_error:
      m = what + " failed after " + ran + ": CUDA error " + detail;
      break;
    case Verdict::timed_out:
      m = what + " timed out: no completion after " + ran;
      break;
    case Verdict::stalled:
      m = what + " stalled: no progress for " + seconds(s.now - s.last_progress) + " (limit " + seconds(s.stall_ns) +
          "), running for " + ran;
      break;
  }
  return m + "; ncclCommAbort was called on the communicator";
}

int64_t watchdog_period_ns() { return env_ms("BALLAST_NCCL_WATCHDOG_MS", 5); }
int64_t stall_ns() { return env_ms("BALLAST_NCCL_STALL_MS", 0); }

}  // namespace ballast::comm_nccl
