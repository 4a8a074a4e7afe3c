// Placement of a job's node matrix onto minipods (after Arnold, arXiv
// 2509.15940): minimise alpha * max DP-group spread + beta * max PP-group
// spread, where a group's spread is the number of minipods it touches, or 0
// when it sits in one.
//
// Cells of the matrix are numbered in Megatron's global-rank order (TP
// fastest, then DP, then PP): cell r holds pp_stage r / R and dp_row r % R,
// and its node's first GPU is global rank r * gpus_per_node.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "job.hpp"
#include "topology.hpp"

namespace ballast::sched {

// Free nodes per minipod, in the order placement takes them: leaves with
// the most free nodes first, then node order.
struct Cluster {
  std::vector<std::vector<int>> free_nodes;  // minipod -> node ids
  std::vector<int> free_count;               // minipod -> free nodes
  int total_free = 0;
};
Cluster make_cluster(const Topology& topo, const std::vector<NodeState>& state);

struct Shape {
  int R = 1, P = 1;    // rows (PP groups, dp_row) and columns (DP groups, pp_stage)
  double alpha = 0.5;  // weight of DP spread; PP spread weighs 1 - alpha
  int cells() const { return R * P; }
};
Shape shape_of(const Job& job);

struct Score {
  int dp = 0, pp = 0;  // max spread over DP groups (columns) and PP groups (rows)
  double objective = 0;
};
inline int spread(int touched) { return touched <= 1 ? 0 : touched; }
inline double weigh(const Shape& s, int dp, int pp) { return s.alpha * dp + (1 - s.alpha) * pp; }

// Spreads of a colouring: color[r] is the minipod of cell r; k minipods.
Score evaluate(const Shape& s, const std::vector<int>& color, int k);

// Whether, in every DP group (column), each minipod's cells are consecutive
// rows, i.e. hold consecutive ranks.
bool contiguous(const Shape& s, const std::vector<int>& color, int k);

// A lower bound on the objective over every placement on these free counts
// (per-dimension chunk counting, plus the one-minipod-per-group cases).
double lower_bound(const Shape& s, const std::vector<int>& free_count);

// Our heuristic: sequential fills of column-group and row-band layouts over
// several minipod orders, keeping the best colouring found among those that
// are contiguous(). Empty when none is (cannot happen with enough free nodes:
// the column-major fill of the largest minipods first always is).
std::vector<int> solve_heuristic(const Shape& s, const std::vector<int>& free_count);

// Exact branch and bound (double-lex symmetry breaking); `color` holds the
// incumbent on entry (may be empty) and the best found on return. Returns
// true when optimality was proved within node_limit search nodes.
bool solve_exact(const Shape& s, const std::vector<int>& free_count, uint64_t node_limit, std::vector<int>& color);

struct Plan {
  std::string job;
  std::string algorithm;
  Shape shape;
  int gpus_per_node = 8;
  std::vector<int> nodes;  // cell (global-rank order) -> node id
  Score score;
  double lower_bound = 0;
  bool optimal = false;  // objective proved minimal
  double seconds = 0;
};

struct PlaceOptions {
  std::string algorithm = "arnold";
  uint64_t seed = 0;
  uint64_t exact_node_limit = 3'000'000;           // "arnold": search nodes before settling for the heuristic
  uint64_t exact_forced_node_limit = 100'000'000;  // "exact": a bound, so a large job cannot hang it
  int exact_max_cells = 40;                        // "arnold" tries the exact solver up to this many nodes
};

// Algorithms: "arnold" (exact when small enough to prove, else the heuristic;
// never worse than the baselines, which it also evaluates), "exact" (branch
// and bound from the heuristic's plan; "optimal" is false in the plan when
// the node limit stopped it first),
// "heuristic", and the baselines "best-fit" (fullest minipod first),
// "random-fit" (minipods in seeded random order), "slurm-tree" (Slurm's
// greedy leaf-switch best fit), each followed by Megatron's rank order.
const std::vector<std::string>& algorithm_names();

// Place a job. Throws InputError when the job needs more nodes than are
// free, or the algorithm is unknown. Deterministic for given input and seed.
Plan place(const Topology& topo, const Cluster& cluster, const Job& job, const PlaceOptions& opt);

// The nodes a baseline picks, in Megatron rank order.
std::vector<int> baseline_nodes(const std::string& name, const Topology& topo, const Cluster& cluster, int n,
                                uint64_t seed);

}  // namespace ballast::sched
