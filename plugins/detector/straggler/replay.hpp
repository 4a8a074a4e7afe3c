// Replays a step's dependency graph with given op durations: every op
// starts when the ops it waits for have ended (plus its launch delay, if
// given); a local op then runs for its duration; the members of a
// communication group all end at the latest member's start plus their own
// transfer time (for DP collectives, the latest over the DP ranks too).
#pragma once

#include <vector>

#include "step_model.hpp"

namespace ballast::straggler {

class Replay {
 public:
  // Orders the graph; throws TraceError if it has a cycle.
  explicit Replay(const Model& model);

  // Values per op and lane are kept in blocks of whole steps (about 64
  // lanes), each block holding every op's lanes side by side, so that a
  // block's replay stays in cache: the value of (op, lane) is at
  // index(op, lane) of an array of size() values.
  size_t index(size_t op, size_t lane) const { return lane_base_[lane] + op * block_; }
  size_t size() const { return nblocks_ * nops_ * block_; }

  // cost: the duration of a local op or the transfer time of a
  // communication op. delay may be null (no launch delays). Writes start and
  // end (relative to the step's start) of every op and lane, and returns
  // each step's time: latest end minus earliest start over its ops and DP
  // ranks.
  std::vector<double> run(const double* cost, const double* delay, double* start, double* end) const;

 private:
  // Replays block k (its first n lanes are real), then takes its step times.
  void run_block(const double* cost, const double* delay, double* start, double* end, size_t n) const;
  void step_times(const double* start, const double* end, size_t first_lane, size_t n,
                  std::vector<double>& times) const;

  struct Node {
    int32_t first, count;  // members in members_
    bool comm, dp_sync;
  };
  const Model& m_;
  size_t lanes_, nops_, block_, nblocks_;
  std::vector<size_t> lane_base_;  // index(0, lane)
  std::vector<Node> order_;
  std::vector<int32_t> members_;
  std::vector<int32_t> dep_begin_, deps_;  // per op, CSR
};

double mean(const std::vector<double>& v);

}  // namespace ballast::straggler
