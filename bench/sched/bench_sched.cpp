// Placement quality and speed against the baselines, on Arnold's three
// simulated settings and on 100,000-GPU clusters. One JSON object per line:
// {"bench","case","metric","value","unit"}.
//
// usage: bench_sched [--quick] [--patterns N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "command_line.hpp"
#include "hostlist.hpp"
#include "placement.hpp"

using namespace ballast::sched;

namespace {

// A tree: minipods of the given sizes, leaf switches of at most 32 nodes.
Topology make_topology(const std::vector<int>& sizes) {
  Topology t;
  t.kind = "tree";
  t.source = "generated";
  char buf[32];
  for (size_t m = 0; m < sizes.size(); ++m) {
    t.minipods.push_back("spine" + std::to_string(m));
    for (int x = 0; x < sizes[m]; ++x) {
      if (x % 32 == 0) {
        t.leaves.push_back("leaf" + std::to_string(t.leaves.size()));
        t.leaf_minipod.push_back(static_cast<int>(m));
      }
      std::snprintf(buf, sizeof buf, "n%05zu", t.nodes.size());
      t.node_id[buf] = static_cast<int>(t.nodes.size());
      t.nodes.push_back(buf);
      t.node_leaf.push_back(static_cast<int>(t.leaves.size()) - 1);
      t.node_minipod.push_back(static_cast<int>(m));
    }
  }
  return t;
}

// 20-70% of each minipod busy, nodes picked at random.
std::vector<NodeState> occupy(const Topology& t, std::mt19937_64& rng) {
  std::vector<NodeState> st(t.nodes.size(), kFree);
  std::vector<std::vector<int>> per(t.minipods.size());
  for (size_t n = 0; n < t.nodes.size(); ++n) per[t.node_minipod[n]].push_back(static_cast<int>(n));
  std::uniform_real_distribution<double> frac(0.2, 0.7);
  for (auto& nodes : per) {
    std::shuffle(nodes.begin(), nodes.end(), rng);
    auto busy = static_cast<size_t>(frac(rng) * static_cast<double>(nodes.size()) + 0.5);
    for (size_t i = 0; i < busy && i < nodes.size(); ++i) st[nodes[i]] = kBusy;
  }
  return st;
}

void emit(const std::string& c, const std::string& metric, double v, const char* unit) {
  std::printf("{\"bench\":\"sched\",\"case\":\"%s\",\"metric\":\"%s\",\"value\":%.6g,\"unit\":\"%s\"}\n", c.c_str(),
              metric.c_str(), v, unit);
  std::fflush(stdout);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

const char* kBaselines[] = {"best-fit", "random-fit", "slurm-tree"};

struct Tally {
  std::map<std::string, double> sum;  // algorithm -> sum of objectives
  std::vector<double> ratios;         // best baseline / ours, where ours > 0
  int instances = 0, worse = 0, ours_zero_base_pos = 0, both_zero = 0, optimal = 0;
  std::vector<double> seconds, gaps;
};

void report(const std::string& c, const Tally& t) {
  emit(c, "instances", t.instances, "count");
  for (auto& [a, s] : t.sum) emit(c, "mean_weighted_max_spread." + a, s / t.instances, "minipods");
  double best_mean = 1e300;
  for (const char* b : kBaselines) best_mean = std::min(best_mean, t.sum.at(b));
  double per_inst_best = t.sum.count("best-baseline") ? t.sum.at("best-baseline") : best_mean;
  double ours = t.sum.at("arnold");
  if (ours > 0) emit(c, "ratio_of_means.best_baseline_over_ours", per_inst_best / ours, "x");
  double mean = 0, mx = 0;
  for (double r : t.ratios) {
    mean += r;
    mx = std::max(mx, r);
  }
  if (!t.ratios.empty()) {
    emit(c, "ratio.mean", mean / t.ratios.size(), "x");
    emit(c, "ratio.max", mx, "x");
  }
  emit(c, "ratio.instances_with_ours_positive", static_cast<double>(t.ratios.size()), "count");
  emit(c, "ours_zero_baseline_positive", t.ours_zero_base_pos, "count");
  emit(c, "both_zero", t.both_zero, "count");
  emit(c, "worse_than_best_baseline", t.worse, "count");
  emit(c, "proved_optimal", t.optimal, "count");
  emit(c, "gap_to_lower_bound.median", median(t.gaps), "minipods");
  emit(c, "placement_time.median", median(t.seconds) * 1e3, "ms");
  emit(c, "placement_time.max", *std::max_element(t.seconds.begin(), t.seconds.end()) * 1e3, "ms");
}

void run_instance(const Topology& topo, const std::vector<NodeState>& st, Job job, Tally& t, uint64_t seed) {
  Cluster cl = make_cluster(topo, st);
  PlaceOptions po;
  po.seed = seed;
  po.algorithm = "arnold";
  Plan ours = place(topo, cl, job, po);
  double best = 1e300;
  for (const char* b : kBaselines) {
    po.algorithm = b;
    Plan p = place(topo, cl, job, po);
    t.sum[b] += p.score.objective;
    best = std::min(best, p.score.objective);
  }
  t.sum["arnold"] += ours.score.objective;
  t.sum["best-baseline"] += best;
  ++t.instances;
  if (ours.score.objective > best + 1e-9) ++t.worse;
  if (ours.score.objective > 1e-9)
    t.ratios.push_back(best / ours.score.objective);
  else if (best > 1e-9)
    ++t.ours_zero_base_pos;
  else
    ++t.both_zero;
  t.optimal += ours.optimal;
  t.seconds.push_back(ours.seconds);
  t.gaps.push_back(ours.score.objective - ours.lower_bound);
}

}  // namespace

int main(int argc, char** argv) {
  int patterns = 100;
  bool quick = false;
  CLI::App app(
      "Placement quality and speed against the baselines, on Arnold's three simulated settings and on "
      "100,000-GPU clusters; JSON lines on "
      "stdout (docs/benchmarks.md).",
      "bench_sched");
  app.add_flag("--quick", quick, "10 patterns");
  app.add_option("--patterns", patterns, "free-node patterns per setting (default 100)")->check(CLI::PositiveNumber);
  if (int rc = ballast::util::parse_command_line(app, argc, argv); rc >= 0) return rc;
  if (quick && app.count("--patterns") == 0) patterns = 10;
  struct Setting {
    const char* name;
    int minipods, nodes, dp, tp, pp;
  };
  const Setting settings[] = {{"arnold-i(3,18;12,4,2)", 3, 18, 12, 4, 2},
                              {"arnold-ii(5,438;24,4,8)", 5, 438, 24, 4, 8},
                              {"arnold-iii(11,1019;46,8,8)", 11, 1019, 46, 8, 8}};
  const double alphas[] = {0, 0.3, 0.5, 1};
  Tally all;
  for (const auto& s : settings) {
    std::vector<int> sizes;
    for (int m = 0; m < s.minipods; ++m) sizes.push_back(s.nodes / s.minipods + (m < s.nodes % s.minipods));
    Topology topo = make_topology(sizes);
    Job job;
    job.gpus_per_node = 8;
    job.dp = s.dp;
    job.tp = s.tp;
    job.pp = s.pp;
    std::mt19937_64 rng(12345);
    Tally per;
    std::map<double, Tally> per_alpha;
    for (int p = 0; p < patterns; ++p) {
      std::vector<NodeState> st;
      for (;;) {  // patterns where the job fits
        st = occupy(topo, rng);
        if (std::count(st.begin(), st.end(), kFree) >= job.nodes()) break;
      }
      for (double a : alphas) {
        job.alpha = a;
        run_instance(topo, st, job, per, static_cast<uint64_t>(p));
        run_instance(topo, st, job, per_alpha[a], static_cast<uint64_t>(p));
        run_instance(topo, st, job, all, static_cast<uint64_t>(p));
      }
    }
    report(s.name, per);
    for (auto& [a, t] : per_alpha) {
      char c[96];
      std::snprintf(c, sizeof c, "%s,alpha=%.1f", s.name, a);
      report(c, t);
    }
  }
  report("arnold-all-settings", all);

  // 100,000 GPUs: 12,500 nodes of 8 GPUs, minipods of 32-128 nodes.
  std::mt19937_64 rng(777);
  std::vector<int> sizes;
  int left = 12500;
  std::uniform_int_distribution<int> pick(32, 128);
  while (left > 0) {
    int s = std::min(left, pick(rng));
    if (left - s > 0 && left - s < 32) s = left;  // no minipod below 32
    sizes.push_back(s);
    left -= s;
  }
  Topology big = make_topology(sizes);
  struct BigJob {
    int gpus, tp, pp;
  };
  const BigJob jobs[] = {{1024, 8, 4}, {2048, 8, 8}, {4096, 8, 8}, {9600, 8, 8}, {16384, 8, 16}};
  int big_patterns = quick ? 3 : std::max(5, patterns / 5);
  for (const auto& bj : jobs) {
    Job job;
    job.gpus_per_node = 8;
    job.tp = bj.tp;
    job.pp = bj.pp;
    job.dp = bj.gpus / bj.tp / bj.pp;
    Tally t;
    for (int p = 0; p < big_patterns; ++p) {
      auto st = occupy(big, rng);
      for (double a : alphas) {
        job.alpha = a;
        run_instance(big, st, job, t, static_cast<uint64_t>(p));
      }
    }
    char c[96];
    std::snprintf(c, sizeof c, "100k-gpus(%zu minipods;%d gpus,tp%d,pp%d)", sizes.size(), bj.gpus, bj.tp, bj.pp);
    report(c, t);
  }

  // End to end, as `ballast plan` does it: read a topology.conf of the
  // 100,000-GPU cluster and a state file, build the free lists, place a
  // 9,600-GPU job (TP 8, PP 8, DP 150). One core, median of 5.
  auto dir = std::filesystem::temp_directory_path() / ("bench-sched-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string conf_path = (dir / "topology.conf").string(), state_path = (dir / "state.json").string();
  {
    std::ofstream conf(conf_path);
    std::vector<std::string> leaves_of(big.minipods.size());
    std::vector<std::vector<std::string>> leaf_nodes(big.leaves.size());
    for (size_t n = 0; n < big.nodes.size(); ++n) leaf_nodes[big.node_leaf[n]].push_back(big.nodes[n]);
    for (size_t l = 0; l < big.leaves.size(); ++l) {
      conf << "SwitchName=" << big.leaves[l] << " Nodes=" << compress_hostlist(leaf_nodes[l]) << "\n";
      auto& s = leaves_of[big.leaf_minipod[l]];
      s += (s.empty() ? "" : ",") + big.leaves[l];
    }
    std::string spines;
    for (size_t m = 0; m < big.minipods.size(); ++m) {
      conf << "SwitchName=" << big.minipods[m] << " Switches=" << leaves_of[m] << "\n";
      spines += (m ? "," : "") + big.minipods[m];
    }
    conf << "SwitchName=core Switches=" << spines << "\n";
    auto st = occupy(big, rng);
    std::vector<std::string> busy;
    for (size_t n = 0; n < st.size(); ++n)
      if (st[n] != kFree) busy.push_back(big.nodes[n]);
    std::ofstream(state_path) << "{\"busy\": [\"" << compress_hostlist(busy) << "\"]}";
  }
  Job job;
  job.gpus_per_node = 8;
  job.tp = 8;
  job.pp = 8;
  job.dp = 150;
  job.alpha = 0.5;
  std::vector<double> e2e, place_only;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    Topology topo = load_topology(conf_path);
    Cluster cl = make_cluster(topo, load_state(topo, state_path));
    Plan p = place(topo, cl, job, PlaceOptions{});
    e2e.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    place_only.push_back(p.seconds);
  }
  emit("100k-gpus,9600-gpu-job,files", "end_to_end_time.median", median(e2e) * 1e3, "ms");
  emit("100k-gpus,9600-gpu-job,files", "placement_time.median", median(place_only) * 1e3, "ms");
  std::filesystem::remove_all(dir);
  return 0;
}
