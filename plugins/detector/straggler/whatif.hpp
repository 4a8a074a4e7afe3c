// What-if analysis of a job trace (after arXiv 2505.05713): how much faster
// would the job run with no stragglers, and who is to blame.
//
// The trace is replayed on its dependency graph three ways: as recorded
// (with the launch delays between an op's dependencies ending and its start),
// without launch delays (T_nodelay), and ideal (T_ideal: no launch delays,
// every computation takes its type's mean duration, every communication its
// type's median transfer time). S = mean(T_nodelay) / mean(T_ideal).
// Attribution: put back the recorded durations of one group of ops (an op
// type, a stage, a DP rank) into the ideal run and replay: mean step time
// over mean(T_ideal). M_W and M_S: the share of T_nodelay - T_ideal that
// goes away when the slowest 3% of ranks, or the last stage, are idealised.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "step_model.hpp"
#include "trace.hpp"

namespace ballast::straggler {

struct WhatIfOptions {
  bool drop_bad_steps = false;  // online: skip steps that break the schedule
  double worker_share = 0.03;   // M_W idealises this share of the ranks (rounded up)
  double straggling = 1.03;     // S below this is no straggler (kind "none")
  double kind_share = 0.5;      // M_W or M_S at least this names the kind
};

// Share of the slowdown a group of ops explains (the reference's
// explain_slowdown): removed = (t_original - t_removed) / (t_original - t_ideal),
// added = (t_added - t_ideal) / (t_original - t_ideal).
struct Explained {
  double t_original = 0, t_ideal = 0, t_removed = 0, t_added = 0;
  double removed = 0, added = 0;
};

struct Attribution {
  std::string name;  // op type, stage, DP rank or rank
  double slowdown;   // replay with only this group as recorded, over the ideal
};

struct WhatIfResult {
  std::string source;
  int dp = 0, pp = 0, ranks = 0;
  size_t rows = 0, ops_per_step = 0, ignored_rows = 0;
  std::vector<int64_t> steps, dropped_steps;
  std::vector<double> t_base;     // recorded step times
  std::vector<double> t_replay;   // replayed with launch delays (simulation check)
  std::vector<double> t_nodelay;  // replayed without launch delays
  std::vector<double> t_ideal;    // ideal replay
  double slowdown = 1, launch_slowdown = 1;
  double replay_error = 0;  // mean |t_replay - t_base| / t_base
  // Worst first.
  std::vector<Attribution> by_optype, by_stage, by_dp_rank, by_rank;
  Explained mw, ms;
  std::vector<int32_t> mw_ranks;  // the ranks M_W idealises
  std::string kind;               // "worker", "stage", "random" or "none"
};

// Chrome/Perfetto trace of the recorded and the ideal run.
struct Timeline {
  struct Event {
    int32_t rank;
    int64_t step;
    OpType type;
    int32_t seq;
    double start, duration;  // seconds; steps laid end to end, a step at the same place in both runs
  };
  std::vector<Event> original, ideal;
};

// The kind of straggler: "none" when S < straggling; "worker" when fixing the
// slowest ranks removes at least kind_share of the slowdown (M_W); "stage"
// when fixing the last stage does (M_S, with more than one stage); else "random" (e.g. sequence-length
// imbalance: the slowdown moves between workers from step to step).
std::string classify_kind(double slowdown, double mw, double ms, const WhatIfOptions& options);

// Runs the whole analysis. Throws TraceError on a trace that cannot be analysed.
WhatIfResult analyze(const Trace& trace, const Meta& meta, const WhatIfOptions& options = {},
                     Timeline* timeline = nullptr);

}  // namespace ballast::straggler
