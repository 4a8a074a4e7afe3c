// The hang analysis (plugins/detector/hang) on a generated lock-step job:
// each rank's trace ring as a comm plugin would have written it (the
// gradients' all-reduce of every step, one communicator), read as the hang
// plugin reads it every period_seconds; a stall (an all-reduce in flight and
// no progress in any ring for stall_seconds) is analysed, and each
// root-cause rank of a new (communicator, seq) published once, as the
// plugin does.
#pragma once

#include "analysis.hpp"
#include "lockstep_job.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace bench_lockstep {

struct HangReport {
  double t = 0;  // when published (absolute, the samples' clock)
  ballast::hang::Cause cause;
  int64_t since_ns = 0;  // the last progress
};

// period_s and stall_s: the hang plugin's defaults.
std::vector<HangReport> run_hang(const Scenario& sc, const std::vector<StepTimings>& steps, double period_s = 0.5,
                                 double stall_s = 10);

}  // namespace bench_lockstep
