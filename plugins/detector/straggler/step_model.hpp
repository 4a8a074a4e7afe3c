// The dependency model of a training step, built from one step of one
// model-parallel group and shared by every step and DP rank (they run the
// same schedule): which ops of a rank wait for which, and which ops finish
// together because they are one collective or one send/recv pair.
#pragma once

#include <cstdint>
#include <vector>

#include "trace.hpp"

namespace ballast::straggler {

struct ModelOp {
  OpType type;
  int32_t seq;  // seq_id: n-th op of its type on its rank in one step
  int32_t stage;
  int32_t mc;
  int32_t gmc;
  std::vector<int32_t> deps;  // ops of the same rank that must end before it starts
  int32_t group = -1;         // its communication group, -1 for a local op
};

struct CommGroup {
  std::vector<int32_t> members;  // ops (of different stages) that finish together
  bool dp_sync = false;          // also synchronised across DP ranks (DP collectives)
};

struct ModelOptions {
  // Online use: a step whose ops do not match the schedule (missing, extra,
  // duplicated, out of order) is dropped instead of failing the analysis.
  bool drop_bad_steps = false;
};

// A lane is one (step, dp_rank): lane = step_index * dp + dp_rank. Every op
// of the model has one row per lane.
struct Model {
  int dp = 0, pp = 0;
  bool use_dp = false;         // DP collectives present (dp * dsp > 1)
  std::vector<int64_t> steps;  // analysed steps, ascending
  std::vector<int64_t> dropped_steps;
  std::vector<ModelOp> ops;
  std::vector<CommGroup> groups;
  std::vector<int32_t> cell_rank;  // [stage * dp + dp_rank]: the rank recorded there
  std::vector<uint32_t> row;       // [op * lanes() + lane]: the trace row
  size_t ignored_rows = 0;         // rows of further ranks of one (dp_rank, stage): TP peers

  size_t lanes() const { return steps.size() * static_cast<size_t>(dp); }
  int ranks() const;
};

// Builds the model; throws TraceError naming the offending row.
Model build_model(const Trace& trace, const Meta& meta, const ModelOptions& options = {});

}  // namespace ballast::straggler
