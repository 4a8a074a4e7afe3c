#include "whatif.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include "replay.hpp"

namespace ballast::straggler {
namespace {

// Below this (seconds), a negative launch delay or transfer time is clock
// noise and kept; beyond it, it is a recording artefact and set to 0.
constexpr double kClockNoise = 1e-2;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  double hi = v[mid];
  if (v.size() % 2) return hi;
  return 0.5 * (hi + *std::max_element(v.begin(), v.begin() + mid));
}

class Analysis {
 public:
  Analysis(const Trace& trace, const Meta& meta, const WhatIfOptions& opt)
      : t_(trace),
        opt_(opt),
        m_(build_model(trace, meta, {opt.drop_bad_steps})),
        replay_(m_),
        L_(m_.lanes()),
        N_(replay_.size()),
        start_(N_),
        end_(N_),
        all_lanes_(L_, 1) {
    dp_lanes_.assign(m_.dp, std::vector<char>(L_, 0));
    for (size_t l = 0; l < L_; ++l) dp_lanes_[dp_of(l)][l] = 1;
  }

  WhatIfResult run(Timeline* timeline) {
    WhatIfResult r;
    r.source = t_.source;
    r.dp = m_.dp;
    r.pp = m_.pp;
    r.ranks = m_.ranks();
    r.rows = m_.ops.size() * L_;
    r.ops_per_step = m_.ops.size();
    r.ignored_rows = m_.ignored_rows;
    r.steps = m_.steps;
    r.dropped_steps = m_.dropped_steps;

    recorded(r);
    launch_delays();
    transfer_times();
    r.t_replay = replay(cost_, delay_.data());
    r.t_nodelay = replay(cost_, nullptr);
    ideal_costs();
    r.t_ideal = replay(ideal_, nullptr);
    if (timeline) timelines(*timeline, r);

    t_nodelay_ = mean(r.t_nodelay);
    t_ideal_ = mean(r.t_ideal);
    r.slowdown = t_nodelay_ / t_ideal_;
    r.launch_slowdown = mean(r.t_base) / t_nodelay_;
    for (size_t i = 0; i < r.steps.size(); ++i)
      r.replay_error += std::fabs(r.t_replay[i] - r.t_base[i]) / r.t_base[i] / static_cast<double>(r.steps.size());

    attribute(r);
    explain(r);
    classify(r);
    return r;
  }

 private:
  const TraceRow& row(size_t op, size_t lane) const { return t_.rows[m_.row[op * L_ + lane]]; }
  size_t at(size_t op, size_t lane) const { return replay_.index(op, lane); }
  size_t step_of(size_t lane) const { return lane / static_cast<size_t>(m_.dp); }
  int dp_of(size_t lane) const { return static_cast<int>(lane % static_cast<size_t>(m_.dp)); }

  // Recorded start and end of every op, relative to its step's first start.
  void recorded(WhatIfResult& r) {
    step_start_.assign(m_.steps.size(), 1e300);
    for (size_t op = 0; op < m_.ops.size(); ++op) {
      for (size_t l = 0; l < L_; ++l) step_start_[step_of(l)] = std::min(step_start_[step_of(l)], row(op, l).start);
    }
    rec_start_.resize(N_);
    rec_end_.resize(N_);
    r.t_base.assign(m_.steps.size(), 0);
    for (size_t op = 0; op < m_.ops.size(); ++op) {
      for (size_t l = 0; l < L_; ++l) {
        const TraceRow& x = row(op, l);
        size_t i = at(op, l);
        rec_start_[i] = x.start - step_start_[step_of(l)];
        rec_end_[i] = rec_start_[i] + x.duration;
        r.t_base[step_of(l)] = std::max(r.t_base[step_of(l)], rec_end_[i]);
      }
    }
  }

  // Time between an op's dependencies ending and its start: CPU work the
  // trace does not show.
  void launch_delays() {
    delay_.resize(N_);
    for (size_t op = 0; op < m_.ops.size(); ++op) {
      const auto& deps = m_.ops[op].deps;
      for (size_t l = 0; l < L_; ++l) {
        double ready = 0;
        for (size_t k = 0; k < deps.size(); ++k) {
          double e = rec_end_[at(static_cast<size_t>(deps[k]), l)];
          ready = k == 0 ? e : std::max(ready, e);
        }
        double d = rec_start_[at(op, l)] - ready;
        delay_[at(op, l)] = d <= -kClockNoise ? 0 : d;
      }
    }
  }

  // A local op costs its duration; a communication op its transfer time:
  // its end minus the latest start of its group (waiting for late peers
  // is not its cost).
  void transfer_times() {
    cost_.resize(N_);
    for (size_t i = 0; i < N_; ++i) cost_[i] = rec_end_[i] - rec_start_[i];
    std::vector<double> latest(L_);
    const size_t dp = static_cast<size_t>(m_.dp);
    for (const CommGroup& g : m_.groups) {
      std::fill(latest.begin(), latest.end(), -1e300);
      for (int32_t op : g.members) {
        for (size_t l = 0; l < L_; ++l) latest[l] = std::max(latest[l], rec_start_[at(op, l)]);
      }
      if (g.dp_sync) {
        for (size_t b = 0; b < L_; b += dp)
          std::fill(latest.begin() + b, latest.begin() + b + dp,
                    *std::max_element(latest.begin() + b, latest.begin() + b + dp));
      }
      for (int32_t op : g.members) {
        for (size_t l = 0; l < L_; ++l) {
          double x = rec_end_[at(op, l)] - latest[l];
          cost_[at(op, l)] = x <= -kClockNoise ? 0 : x;
        }
      }
    }
  }

  // Every computation takes its type's mean duration, every communication
  // its type's median transfer time (over all steps, stages and DP ranks).
  void ideal_costs() {
    std::map<std::pair<int, bool>, std::vector<double>> samples;
    for (size_t op = 0; op < m_.ops.size(); ++op) {
      auto& v = samples[{static_cast<int>(m_.ops[op].type), m_.ops[op].group >= 0}];
      for (size_t l = 0; l < L_; ++l) v.push_back(cost_[at(op, l)]);
    }
    std::map<std::pair<int, bool>, double> value;
    for (auto& [k, v] : samples) {
      value[k] = is_communication(static_cast<OpType>(k.first)) ? median(std::move(v)) : mean(v);
    }
    ideal_.resize(N_);
    for (size_t op = 0; op < m_.ops.size(); ++op) {
      double c = value[{static_cast<int>(m_.ops[op].type), m_.ops[op].group >= 0}];
      for (size_t l = 0; l < L_; ++l) ideal_[at(op, l)] = c;
    }
  }

  std::vector<double> replay(const std::vector<double>& cost, const double* delay) {
    return replay_.run(cost.data(), delay, start_.data(), end_.data());
  }

  // Mean step time of `base` with some ops taken from `other`: lanes(op)
  // gives the lanes (a mask) where op is taken, or null for none. The picked
  // values are swapped between the two, replayed, and swapped back: no copy
  // of the whole arrays, and both are left as they were.
  template <class Lanes>
  double mixed(std::vector<double>& base, std::vector<double>& other, Lanes lanes) {
    auto swap_picked = [&] {
      for (size_t op = 0; op < m_.ops.size(); ++op) {
        const char* pick = lanes(op);
        if (!pick) continue;
        for (size_t l = 0; l < L_; ++l) {
          if (pick[l]) std::swap(base[at(op, l)], other[at(op, l)]);
        }
      }
    };
    swap_picked();
    double t = mean(replay(base, nullptr));
    swap_picked();
    return t;
  }

  template <class Lanes>
  double attributed(Lanes lanes) {
    return mixed(ideal_, cost_, lanes) / t_ideal_;
  }

  static void worst_first(std::vector<Attribution>& v) {
    std::stable_sort(v.begin(), v.end(),
                     [](const Attribution& a, const Attribution& b) { return a.slowdown > b.slowdown; });
  }

  void attribute(WhatIfResult& r) {
    std::vector<std::string> names;
    for (const ModelOp& o : m_.ops) {
      std::string n(report_name(o.type));
      if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
    }
    const char* all = all_lanes_.data();
    for (const std::string& n : names) {
      std::vector<char> pick(m_.ops.size());
      for (size_t op = 0; op < m_.ops.size(); ++op) pick[op] = report_name(m_.ops[op].type) == n;
      r.by_optype.push_back({n, attributed([&](size_t op) { return pick[op] ? all : nullptr; })});
    }
    for (int s = 0; s < m_.pp; ++s)
      r.by_stage.push_back(
          {std::to_string(s), attributed([&](size_t op) { return m_.ops[op].stage == s ? all : nullptr; })});
    for (int d = 0; d < m_.dp; ++d) {
      const char* lanes = dp_lanes_[d].data();
      r.by_dp_rank.push_back({std::to_string(d), attributed([&](size_t) { return lanes; })});
    }
    // A rank is as slow as the lesser of its DP rank's and its stage's slowdown.
    for (int s = 0; s < m_.pp; ++s) {
      for (int d = 0; d < m_.dp; ++d) {
        int32_t rank = m_.cell_rank[static_cast<size_t>(s) * m_.dp + d];
        if (rank < 0) continue;
        r.by_rank.push_back({std::to_string(rank), std::min(r.by_stage[s].slowdown, r.by_dp_rank[d].slowdown)});
      }
    }
    std::stable_sort(r.by_rank.begin(), r.by_rank.end(), [](const Attribution& a, const Attribution& b) {
      if (a.slowdown != b.slowdown) return a.slowdown > b.slowdown;
      return std::stoi(a.name) < std::stoi(b.name);
    });
    worst_first(r.by_optype);
    worst_first(r.by_stage);
    worst_first(r.by_dp_rank);
  }

  template <class Lanes>
  Explained explained(Lanes lanes) {
    Explained e;
    e.t_original = t_nodelay_;
    e.t_ideal = t_ideal_;
    e.t_removed = mixed(cost_, ideal_, lanes);
    e.t_added = mixed(ideal_, cost_, lanes);
    // With no slowdown there is nothing to explain: both shares are 0.
    double gap = e.t_original - e.t_ideal;
    if (std::fabs(gap) <= 1e-12 * e.t_ideal) return e;
    e.removed = (e.t_original - e.t_removed) / gap;
    e.added = (e.t_added - e.t_ideal) / gap;
    return e;
  }

  void explain(WhatIfResult& r) {
    size_t n = static_cast<size_t>(std::ceil(static_cast<double>(r.ranks) * opt_.worker_share - 1e-9));
    n = std::clamp<size_t>(n, 1, r.by_rank.size());
    // Lanes of the chosen ranks, per stage.
    std::vector<std::vector<char>> stage_lanes(m_.pp, std::vector<char>(L_, 0));
    for (size_t i = 0; i < n; ++i) {
      int32_t rank = std::stoi(r.by_rank[i].name);
      r.mw_ranks.push_back(rank);
      for (int s = 0; s < m_.pp; ++s) {
        for (size_t l = 0; l < L_; ++l)
          stage_lanes[s][l] |= m_.cell_rank[static_cast<size_t>(s) * m_.dp + dp_of(l)] == rank;
      }
    }
    r.mw = explained([&](size_t op) { return stage_lanes[m_.ops[op].stage].data(); });
    const int last = m_.pp - 1;
    const char* all = all_lanes_.data();
    r.ms = explained([&](size_t op) { return m_.ops[op].stage == last ? all : nullptr; });
  }

  // Without pipeline parallelism the last stage is the whole job: M_S says nothing.
  void classify(WhatIfResult& r) const {
    r.kind = classify_kind(r.slowdown, r.mw.removed, m_.pp > 1 ? r.ms.removed : 0.0, opt_);
  }

  // Steps are laid end to end (traces often restart the clock each step),
  // each as long as the longer of its recorded and ideal runs.
  void timelines(Timeline& tl, const WhatIfResult& r) {
    std::vector<double> offset(m_.steps.size(), 0);
    double longest = 0;
    for (size_t si = 0; si < offset.size(); ++si) longest = std::max(longest, std::max(r.t_base[si], r.t_ideal[si]));
    for (size_t si = 1; si < offset.size(); ++si)
      offset[si] = offset[si - 1] + std::max(r.t_base[si - 1], r.t_ideal[si - 1]) + 0.02 * longest;
    tl.original.clear();
    tl.ideal.clear();
    tl.original.reserve(N_);
    tl.ideal.reserve(N_);
    for (size_t op = 0; op < m_.ops.size(); ++op) {
      const ModelOp& o = m_.ops[op];
      for (size_t l = 0; l < L_; ++l) {
        const TraceRow& x = row(op, l);
        size_t i = at(op, l);
        double base = offset[step_of(l)];
        tl.original.push_back({x.rank, x.step, o.type, o.seq, base + rec_start_[i], x.duration});
        tl.ideal.push_back({x.rank, x.step, o.type, o.seq, base + start_[i], end_[i] - start_[i]});
      }
    }
  }

  const Trace& t_;
  const WhatIfOptions& opt_;
  Model m_;
  Replay replay_;
  size_t L_, N_;
  std::vector<double> start_, end_;
  std::vector<char> all_lanes_;              // every lane
  std::vector<std::vector<char>> dp_lanes_;  // the lanes of each DP rank
  std::vector<double> step_start_, rec_start_, rec_end_, delay_, cost_, ideal_;
  double t_nodelay_ = 0, t_ideal_ = 0;
};

}  // namespace

std::string classify_kind(double slowdown, double mw, double ms, const WhatIfOptions& options) {
  if (slowdown < options.straggling) return "none";
  if (mw >= options.kind_share) return "worker";
  if (ms >= options.kind_share) return "stage";
  return "random";
}

WhatIfResult analyze(const Trace& trace, const Meta& meta, const WhatIfOptions& options, Timeline* timeline) {
  return Analysis(trace, meta, options).run(timeline);
}

}  // namespace ballast::straggler
