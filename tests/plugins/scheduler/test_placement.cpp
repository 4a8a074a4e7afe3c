// Placement: every algorithm against brute force on small instances, the
// lower bound, determinism, contiguity, and jobs that do not fit.
#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <set>

#include "placement.hpp"

using namespace ballast::sched;

namespace {

// A tree with one spine (minipod) per capacity entry, `busy` extra busy
// nodes per minipod, leaves of 4 nodes.
struct Fixture {
  Topology topo;
  std::vector<NodeState> state;
  Cluster cluster;
};

Fixture make(const std::vector<int>& free_per_minipod, int busy = 1) {
  std::string conf = "SwitchName=core Switches=";
  std::string body;
  int node = 0, leaf = 0;
  std::vector<std::string> busy_nodes;
  for (size_t m = 0; m < free_per_minipod.size(); ++m) {
    conf += (m ? "," : "") + std::string("sp") + std::to_string(m);
    int total = free_per_minipod[m] + busy;
    std::string leaves;
    for (int x = 0; x < total; x += 4) {
      int hi = std::min(total, x + 4);
      body += "SwitchName=lf" + std::to_string(leaf) + " Nodes=n[" + std::to_string(1000 + node + x) + "-" +
              std::to_string(1000 + node + hi - 1) + "]\n";
      leaves += (leaves.empty() ? "" : ",") + std::string("lf") + std::to_string(leaf++);
    }
    for (int b = 0; b < busy; ++b) busy_nodes.push_back("n" + std::to_string(1000 + node + b));
    body += "SwitchName=sp" + std::to_string(m) + " Switches=" + leaves + "\n";
    node += total;
  }
  Fixture f;
  f.topo = parse_topology_conf(conf + "\n" + body, "gen.conf");
  std::string state = "{\"busy\": [";
  for (size_t i = 0; i < busy_nodes.size(); ++i) state += (i ? ",\"" : "\"") + busy_nodes[i] + "\"";
  f.state = parse_state(f.topo, state + "]}", "gen.json");
  f.cluster = make_cluster(f.topo, f.state);
  return f;
}

// Independent spread computation from the plan's node list.
Score spreads(const Fixture& f, const Plan& p) {
  int R = p.shape.R, P = p.shape.P, dp = 0, pp = 0;
  for (int j = 0; j < P; ++j) {
    std::set<int> s;
    for (int i = 0; i < R; ++i) s.insert(f.topo.node_minipod[p.nodes[j * R + i]]);
    dp = std::max(dp, s.size() > 1 ? static_cast<int>(s.size()) : 0);
  }
  for (int i = 0; i < R; ++i) {
    std::set<int> s;
    for (int j = 0; j < P; ++j) s.insert(f.topo.node_minipod[p.nodes[j * R + i]]);
    pp = std::max(pp, s.size() > 1 ? static_cast<int>(s.size()) : 0);
  }
  return {dp, pp, p.shape.alpha * dp + (1 - p.shape.alpha) * pp};
}

// The optimum by enumerating every assignment of cells to minipods.
double brute_force(const Shape& s, const std::vector<int>& cap) {
  int n = s.cells(), k = static_cast<int>(cap.size());
  std::vector<int> color(n, 0), used(k, 0);
  double best = 1e300;
  std::function<void(int)> rec = [&](int c) {
    if (c == n) {
      best = std::min(best, evaluate(s, color, k).objective);
      return;
    }
    for (int m = 0; m < k; ++m) {
      if (used[m] == cap[m]) continue;
      ++used[m];
      color[c] = m;
      rec(c + 1);
      --used[m];
    }
  };
  rec(0);
  return best;
}

Job job_of(int R, int P, double alpha) {
  Job j;
  j.gpus_per_node = 8;
  j.tp = 8;
  j.dp = R;
  j.pp = P;
  j.alpha = alpha;
  return j;
}

}  // namespace

TEST_CASE("evaluate counts minipods per group, 0 when a group sits in one") {
  Shape s{2, 3, 0.5};
  // cells in rank order: column 0 = {0, 0}, column 1 = {0, 1}, column 2 = {2, 2}
  Score sc = evaluate(s, {0, 0, 0, 1, 2, 2}, 3);
  CHECK(sc.dp == 2);  // column 1 touches two minipods
  CHECK(sc.pp == 3);  // row 1 touches 0, 1, 2
  CHECK(sc.objective == doctest::Approx(2.5));
  CHECK(evaluate(s, {1, 1, 1, 1, 1, 1}, 3).objective == 0);
}

TEST_CASE("every algorithm against brute force on small instances") {
  std::mt19937 rng(7);
  int checked = 0;
  for (int trial = 0; trial < 60; ++trial) {
    int R = 1 + static_cast<int>(rng() % 4), P = 1 + static_cast<int>(rng() % 3);
    if (R * P > 9 || R * P < 2) continue;
    int k = 2 + static_cast<int>(rng() % 2);
    std::vector<int> cap(k);
    int total = 0;
    for (auto& c : cap) total += c = 1 + static_cast<int>(rng() % 6);
    if (total < R * P) continue;
    double alpha = std::vector<double>{0, 0.3, 0.5, 1}[rng() % 4];
    Fixture f = make(cap);
    Job job = job_of(R, P, alpha);
    double opt = brute_force(shape_of(job), f.cluster.free_count);
    CAPTURE(R);
    CAPTURE(P);
    CAPTURE(alpha);
    for (const auto& a : algorithm_names()) {
      CAPTURE(a);
      PlaceOptions po;
      po.algorithm = a;
      po.seed = static_cast<uint64_t>(trial);
      Plan p = place(f.topo, f.cluster, job, po);
      REQUIRE(p.nodes.size() == static_cast<size_t>(R * P));
      std::set<int> distinct(p.nodes.begin(), p.nodes.end());
      CHECK(distinct.size() == p.nodes.size());
      for (int id : p.nodes) CHECK(f.state[id] == kFree);
      Score sc = spreads(f, p);
      CHECK(sc.dp == p.score.dp);
      CHECK(sc.pp == p.score.pp);
      CHECK(p.score.objective >= opt - 1e-9);
      CHECK(p.lower_bound <= opt + 1e-9);
      if (a == "exact" || a == "arnold") {
        CHECK(p.score.objective == doctest::Approx(opt));
        CHECK(p.optimal);
      }
    }
    ++checked;
  }
  CHECK(checked >= 20);
}

TEST_CASE("arnold is never worse than the best baseline and beats Megatron order where PP matters") {
  // 12 rows x 2 stages, minipods of 10, 10, 6 free nodes: whole PP groups
  // fit (alpha = 0), while node-order filling splits them.
  Fixture f = make({10, 10, 6});
  Job job = job_of(12, 2, 0.0);
  PlaceOptions po;
  Plan ours = place(f.topo, f.cluster, job, po);
  CHECK(ours.score.pp == 0);
  for (const char* b : {"best-fit", "random-fit", "slurm-tree"}) {
    po.algorithm = b;
    CHECK(place(f.topo, f.cluster, job, po).score.objective >= ours.score.objective);
  }
  po.algorithm = "slurm-tree";
  CHECK(place(f.topo, f.cluster, job, po).score.pp >= 2);
}

TEST_CASE("the heuristic's lower bound holds and its gap is reported on larger instances") {
  Fixture f = make({40, 35, 30, 22, 50}, 3);
  for (double alpha : {0.0, 0.3, 0.5, 1.0}) {
    Job job = job_of(12, 8, alpha);
    PlaceOptions po;
    Plan p = place(f.topo, f.cluster, job, po);
    CHECK(p.lower_bound <= p.score.objective + 1e-9);
    CHECK(p.lower_bound >= 0);
    Score sc = spreads(f, p);
    CHECK(sc.objective == doctest::Approx(p.score.objective));
  }
}

TEST_CASE("placement is deterministic for a given input and seed") {
  Fixture f = make({9, 7, 12, 5}, 2);
  Job job = job_of(6, 4, 0.5);
  for (const auto& a : algorithm_names()) {
    PlaceOptions po;
    po.algorithm = a;
    po.seed = 42;
    CHECK(place(f.topo, f.cluster, job, po).nodes == place(f.topo, f.cluster, job, po).nodes);
  }
  PlaceOptions r1, r2;
  r1.algorithm = r2.algorithm = "random-fit";
  r1.seed = 1;
  r2.seed = 2;
  bool differs = false;
  for (uint64_t s = 3; s < 12 && !differs; ++s) {
    r2.seed = s;
    differs = place(f.topo, f.cluster, job, r1).nodes != place(f.topo, f.cluster, job, r2).nodes;
  }
  CHECK(differs);  // the seed matters where the algorithm is random
}

TEST_CASE("contiguous() sees a minipod coming back within a DP group") {
  Shape s{3, 2, 0.5};
  CHECK(contiguous(s, {0, 0, 1, 2, 2, 2}, 3));
  CHECK_FALSE(contiguous(s, {0, 1, 0, 2, 2, 2}, 3));
  CHECK(contiguous(s, {0, 1, 1, 1, 0, 0}, 3));  // minipods may differ between groups
}

TEST_CASE("within each DP group, a minipod's nodes hold consecutive ranks") {
  Fixture f = make({20, 17, 13, 9}, 2);
  for (double alpha : {0.0, 0.3, 0.5, 1.0})
    for (auto [R, P] : {std::pair{10, 4}, {6, 8}, {14, 3}, {3, 2}, {19, 3}})
      for (const char* algorithm : {"arnold", "heuristic"}) {
        PlaceOptions po;
        po.algorithm = algorithm;
        Plan p = place(f.topo, f.cluster, job_of(R, P, alpha), po);
        for (int j = 0; j < P; ++j) {
          std::set<int> closed;
          int prev = -1;
          for (int i = 0; i < R; ++i) {
            int m = f.topo.node_minipod[p.nodes[j * R + i]];
            if (m != prev) {
              CHECK(closed.count(m) == 0);  // a minipod never comes back in a column
              if (prev >= 0) closed.insert(prev);
              prev = m;
            }
          }
        }
        // and its nodes are taken in rank order within each minipod
        std::map<int, int> last;
        for (size_t r = 0; r < p.nodes.size(); ++r) {
          int m = f.topo.node_minipod[p.nodes[r]];
          auto pos = std::find(f.cluster.free_nodes[m].begin(), f.cluster.free_nodes[m].end(), p.nodes[r]) -
                     f.cluster.free_nodes[m].begin();
          if (last.count(m)) CHECK(pos > last[m]);
          last[m] = static_cast<int>(pos);
        }
      }
}

TEST_CASE("Slurm's tree baseline takes the tightest leaf that fits the rest") {
  // Leaves of 4: minipod 0 has one leaf of 3; minipod 1 leaves of 4, 4, 1.
  // 4 nodes: the tightest minipod that fits is 1, its tightest leaf lf1.
  Fixture f = make({3, 9}, 0);
  auto nodes = baseline_nodes("slurm-tree", f.topo, f.cluster, 4, 0);
  std::set<int> leaves;
  for (int n : nodes) leaves.insert(f.topo.node_leaf[n]);
  CHECK(leaves.size() == 1);
  CHECK(f.topo.leaves[*leaves.begin()] == "lf1");
}

TEST_CASE("a job that does not fit, or an unknown algorithm, is a clear error") {
  Fixture f = make({3, 3});
  PlaceOptions po;
  CHECK_THROWS_WITH_AS(place(f.topo, f.cluster, job_of(4, 2, 0.5), po),
                       "job job needs 8 nodes (4 rows x 2 stages) but only 6 of 8 are free", InputError);
  po.algorithm = "first-fit";
  CHECK_THROWS_WITH_AS(place(f.topo, f.cluster, job_of(2, 2, 0.5), po),
                       "unknown algorithm \"first-fit\" (one of: arnold, exact, heuristic, best-fit, random-fit, "
                       "slurm-tree)",
                       InputError);
}

TEST_CASE("the branch and bound alone, from no incumbent, finds the brute-force optimum") {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 40; ++trial) {
    Shape s{1 + static_cast<int>(rng() % 4), 1 + static_cast<int>(rng() % 3),
            std::vector<double>{0, 0.3, 0.5, 1}[rng() % 4]};
    if (s.cells() > 9) continue;
    std::vector<int> cap(2 + rng() % 3);
    int total = 0;
    for (auto& c : cap) total += c = static_cast<int>(rng() % 6);
    if (total < s.cells()) continue;
    std::vector<int> color;
    CHECK(solve_exact(s, cap, std::numeric_limits<uint64_t>::max(), color));
    REQUIRE(color.size() == static_cast<size_t>(s.cells()));
    std::vector<int> used(cap.size(), 0);
    for (int c : color) ++used[c];
    for (size_t m = 0; m < cap.size(); ++m) CHECK(used[m] <= cap[m]);
    CHECK(evaluate(s, color, static_cast<int>(cap.size())).objective == doctest::Approx(brute_force(s, cap)));
    // Stopped early, it says so.
    std::vector<int> none;
    if (s.cells() > 2) CHECK_FALSE(solve_exact(s, cap, 2, none));
  }
}
