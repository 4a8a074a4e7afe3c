// A training job as the scheduler sees it: its parallelism and the weight
// alpha of DP spread against PP spread (beta = 1 - alpha).
#pragma once
#include <string>

#include "hostlist.hpp"

namespace ballast::sched {

struct Job {
  std::string name = "job";
  int gpus_per_node = 8;
  int tp = 1, pp = 1, dp = 1;
  double alpha = 0.5;
  std::string alpha_source = "default";  // "given", "model" or "default"
  // The node matrix: rows() PP groups (dp_row), cols() = pp DP groups (pp_stage).
  int rows() const { return dp * tp / gpus_per_node; }
  int cols() const { return pp; }
  int nodes() const { return rows() * cols(); }
};

// DP and PP traffic per GPU in elements, Arnold's analytic model (App. C):
// DP = h(V+s) + (l/pp)(12h^2+9h) per step; PP = 2*mb*s*h per micro-batch.
struct ModelShape {
  double hidden = 0, layers = 0, seq_len = 0, micro_batch = 1, vocab = 0, micro_batches = 0;
};
double dp_volume(const ModelShape& m, int pp);
double pp_volume(const ModelShape& m);
// alpha = DP cost / (DP cost + PP cost), each cost = volume per step times
// the measured bandwidth loss when a group spans minipods (17% for
// collectives, 70% for send/recv, Arnold §4); PP volume counts every
// micro-batch of the step (micro_batches, default 4*pp).
double derive_alpha(const ModelShape& m, int pp);

// Parse a job JSON ({"gpus_per_node", "tp", "pp", "dp", "alpha"?, "name"?,
// "model"?: {"hidden", "layers", "seq_len", "micro_batch", "vocab",
// "micro_batches"?}}). Throws InputError naming `source` and the field for
// malformed JSON, missing or non-integer fields, tp not dividing
// gpus_per_node, dp*tp not a multiple of gpus_per_node, alpha outside [0,1].
Job parse_job(const std::string& json_text, const std::string& source);
Job load_job(const std::string& path);

}  // namespace ballast::sched
