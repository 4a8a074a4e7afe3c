// The straggler detector online: per-op timings arrive from every rank (the
// step.timing events), a sliding window of completed steps is kept, and
// every `report_every` completed steps the window is analysed.
// Not thread-safe: the caller serialises add() and poll().
#pragma once

#include <ballast/events.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "whatif.hpp"

namespace ballast::straggler {

struct OnlineConfig {
  size_t window_steps = 20;    // completed steps analysed together
  size_t report_every = 10;    // analyse after this many newly completed steps
  double min_slowdown = 1.03;  // results below it are not reported
  Meta meta;                   // sizes; 0 = from the ops
};

struct OnlineCounters {
  uint64_t ops = 0;        // accepted
  uint64_t rejected = 0;   // unknown op type, NaN, negative duration or index
  uint64_t step_rows = 0;  // whole-step rows (optype "step"): no schedule, not analysed
  uint64_t restarts = 0;   // a rank reporting a step again (restarted from a checkpoint)
  uint64_t analyses = 0;
  uint64_t failures = 0;  // windows that could not be analysed
};

// The op type of a trainer's phase name: the trace's own names, and the
// usual words of step timers ("forward", "backward", "allreduce",
// "all-reduce", "grad-sync", "optimizer-step", "optim") for data-parallel
// training: forward and backward compute, the gradients' all-reduce across
// DP ranks (separate-grads-all-reduce), the optimizer. Nothing else.
std::optional<OpType> timer_optype(std::string_view name);

class OnlineDetector {
 public:
  explicit OnlineDetector(OnlineConfig config);

  // Copies the valid ops of a batch; garbage from one rank is counted and
  // skipped, never fatal. Besides the trace's op types, the phase names a
  // trainer's step timer uses are understood (timer_optype). Ops with optype
  // "step" (whole-step timings) carry no schedule: counted in step_rows and
  // ignored. A batch whose step a rank already reported (it restarted from a
  // checkpoint) replaces that rank's rows from that step on.
  void add(const ballast_op_timing* ops, size_t count);

  // When enough steps have completed: analyses the window. Returns the
  // result when S >= min_slowdown. On a window that cannot be analysed,
  // returns nothing and leaves the reason in last_error().
  std::optional<WhatIfResult> poll();

  const OnlineCounters& counters() const { return counters_; }
  const std::string& last_error() const { return last_error_; }

 private:
  // A step is complete when every rank still reporting has moved past it.
  std::vector<int64_t> completed_steps() const;

  OnlineConfig config_;
  OnlineCounters counters_;
  std::map<int64_t, std::vector<TraceRow>> steps_;  // rows by step
  std::map<int32_t, int64_t> latest_;               // latest step seen per rank
  int64_t last_analysed_ = INT64_MIN;               // newest completed step at the last analysis
  std::string last_error_;
};

}  // namespace ballast::straggler
