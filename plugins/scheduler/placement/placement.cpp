#include "placement.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>

namespace ballast::sched {

Cluster make_cluster(const Topology& topo, const std::vector<NodeState>& state) {
  Cluster c;
  size_t k = topo.minipods.size();
  c.free_nodes.assign(k, {});
  c.free_count.assign(k, 0);
  std::vector<std::vector<int>> leaf_free(topo.leaves.size());
  for (size_t n = 0; n < topo.nodes.size(); ++n)
    if (state.empty() || state[n] == kFree) leaf_free[topo.node_leaf[n]].push_back(static_cast<int>(n));
  std::vector<int> leaves(topo.leaves.size());
  std::iota(leaves.begin(), leaves.end(), 0);
  // Leaves with the most free nodes first: a job takes as few leaves as it can.
  std::stable_sort(leaves.begin(), leaves.end(),
                   [&](int a, int b) { return leaf_free[a].size() > leaf_free[b].size(); });
  for (int l : leaves) {
    auto& dst = c.free_nodes[topo.leaf_minipod[l]];
    dst.insert(dst.end(), leaf_free[l].begin(), leaf_free[l].end());
  }
  for (size_t m = 0; m < k; ++m) {
    c.free_count[m] = static_cast<int>(c.free_nodes[m].size());
    c.total_free += c.free_count[m];
  }
  return c;
}

Shape shape_of(const Job& job) { return Shape{job.rows(), job.cols(), job.alpha}; }

namespace {

// Reusable scratch for evaluate(): one stamp per minipod.
struct Evaluator {
  std::vector<int> stamp;
  Score operator()(const Shape& s, const std::vector<int>& color, int k) {
    stamp.assign(static_cast<size_t>(k), -1);
    int maxc = 0, maxr = 0;
    for (int j = 0; j < s.P; ++j) {
      int t = 0;
      for (int i = 0; i < s.R; ++i) {
        int c = color[static_cast<size_t>(j) * s.R + i];
        if (stamp[c] != j) {
          stamp[c] = j;
          ++t;
        }
      }
      maxc = std::max(maxc, t);
    }
    stamp.assign(static_cast<size_t>(k), -1);
    for (int i = 0; i < s.R; ++i) {
      int t = 0;
      for (int j = 0; j < s.P; ++j) {
        int c = color[static_cast<size_t>(j) * s.R + i];
        if (stamp[c] != i) {
          stamp[c] = i;
          ++t;
        }
      }
      maxr = std::max(maxr, t);
    }
    Score sc{spread(maxc), spread(maxr), 0};
    sc.objective = weigh(s, sc.dp, sc.pp);
    return sc;
  }
  // Whether every minipod's cells of each DP group (column) are consecutive rows.
  bool contiguous(const Shape& s, const std::vector<int>& color, int k) {
    stamp.assign(static_cast<size_t>(k), -1);
    for (int j = 0; j < s.P; ++j) {
      int prev = -1;
      for (int i = 0; i < s.R; ++i) {
        int c = color[static_cast<size_t>(j) * s.R + i];
        if (c == prev) continue;
        if (stamp[c] == j) return false;
        stamp[c] = j;
        prev = c;
      }
    }
    return true;
  }
};

// Fewest chunks of at most L cells, each inside one minipod, covering n.
long min_chunks(const std::vector<int>& f, int L, long n) {
  long full = 0;
  std::vector<int> part;
  for (int x : f) {
    full += x / L;
    if (x % L) part.push_back(x % L);
  }
  if (full * L >= n) return (n + L - 1) / L;
  long rem = n - full * L, cnt = full;
  std::sort(part.rbegin(), part.rend());
  for (int p : part) {
    if (rem <= 0) break;
    rem -= p;
    ++cnt;
  }
  return cnt;
}

// Fewest minipods whose sizes (each counted as units = f / unit) reach need.
int min_minipods(const std::vector<int>& f, int unit, long need) {
  std::vector<long> u;
  for (int x : f) u.push_back(x / unit);
  std::sort(u.rbegin(), u.rend());
  long acc = 0;
  for (size_t i = 0; i < u.size(); ++i) {
    acc += u[i];
    if (acc >= need) return static_cast<int>(i + 1);
  }
  return std::numeric_limits<int>::max();
}

}  // namespace

Score evaluate(const Shape& s, const std::vector<int>& color, int k) {
  Evaluator e;
  return e(s, color, k);
}

bool contiguous(const Shape& s, const std::vector<int>& color, int k) {
  Evaluator e;
  return e.contiguous(s, color, k);
}

double lower_bound(const Shape& s, const std::vector<int>& f) {
  long n = s.cells();
  int k = static_cast<int>(f.size());
  // A column of R cells touches at least as many minipods as the largest
  // capacities need to reach R; all columns together hold min_chunks(R)
  // pieces. Same for rows.
  long cl = std::max<long>(min_minipods(f, 1, s.R), (min_chunks(f, s.R, n) + s.P - 1) / s.P);
  long rl = std::max<long>(min_minipods(f, 1, s.P), (min_chunks(f, s.P, n) + s.R - 1) / s.R);
  // Every column whole in one minipod: rows touch every minipod that holds
  // a column. Every row whole: columns touch every minipod holding a row.
  int rows_if_cols_whole = min_minipods(f, s.R, s.P);
  int cols_if_rows_whole = min_minipods(f, s.P, s.R);
  // Joint: minipod m holding n_m cells touches c_m columns and r_m rows with
  // c_m * r_m >= n_m; sum c_m <= P * C and sum r_m <= R * T, so by
  // Cauchy-Schwarz C * T >= (sum sqrt n_m)^2 / N, whose smallest value comes
  // from filling the largest minipods first.
  std::vector<int> sorted = f;
  std::sort(sorted.rbegin(), sorted.rend());
  double root_sum = 0;
  long left = n;
  for (int x : sorted) {
    if (left <= 0) break;
    long take = std::min<long>(x, left);
    root_sum += std::sqrt(static_cast<double>(take));
    left -= take;
  }
  double product = root_sum * root_sum / static_cast<double>(n) - 1e-9;
  double best = std::numeric_limits<double>::infinity();
  // A column touches at most R minipods, a row at most P.
  for (long c = cl; c <= std::min<long>(k, s.R); ++c)
    for (long r = rl; r <= std::min<long>(k, s.P); ++r) {
      if (c == 1 && r < rows_if_cols_whole) continue;
      if (r == 1 && c < cols_if_rows_whole) continue;
      if (static_cast<double>(c) * static_cast<double>(r) < product) continue;
      best = std::min(best, weigh(s, spread(static_cast<int>(c)), spread(static_cast<int>(r))));
    }
  return std::isfinite(best) ? best : 0.0;
}

namespace {

using Sequence = std::vector<std::pair<int, int>>;  // (minipod, cells) in fill order

// Minipod orders for a layout whose pieces are L cells long.
std::vector<Sequence> sequences(const std::vector<int>& f, int L, int n) {
  int k = static_cast<int>(f.size());
  std::vector<int> ids(k);
  std::iota(ids.begin(), ids.end(), 0);
  auto whole = [&](int m) { return f[m] / L * L; };
  std::vector<Sequence> out;

  // Largest whole-piece capacity first, then leftovers largest first.
  {
    auto order = ids;
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return whole(a) != whole(b) ? whole(a) > whole(b) : f[a] > f[b]; });
    Sequence seq;
    std::vector<int> taken(k, 0);
    int rem = n;
    for (int m : order) {
      int t = std::min(whole(m), rem);
      if (t > 0) {
        seq.push_back({m, t});
        taken[m] = t;
        rem -= t;
      }
    }
    if (rem > 0) {
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return f[a] - taken[a] > f[b] - taken[b]; });
      for (int m : order) {
        int t = std::min(f[m] - taken[m], rem);
        if (t > 0) {
          seq.push_back({m, t});
          rem -= t;
        }
      }
    }
    out.push_back(std::move(seq));
  }
  // Largest whole first, but the tail goes to the tightest minipod it fits in.
  {
    Sequence seq;
    std::vector<char> used(k, 0);
    int rem = n;
    while (rem > 0) {
      int tight = -1, big = -1;
      for (int m : ids) {
        if (used[m]) continue;
        if (whole(m) >= rem && (tight < 0 || whole(m) < whole(tight))) tight = m;
        if (whole(m) > 0 && (big < 0 || whole(m) > whole(big))) big = m;
      }
      if (tight >= 0) {
        seq.push_back({tight, rem});
        rem = 0;
        break;
      }
      if (big < 0) break;
      seq.push_back({big, whole(big)});
      used[big] = 1;
      rem -= whole(big);
    }
    if (rem > 0) {  // pieces no longer fit whole: fill with the largest rests
      std::vector<int> taken(k, 0);
      for (auto [m, t] : seq) taken[m] = t;
      auto order = ids;
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return f[a] - taken[a] > f[b] - taken[b]; });
      for (int m : order) {
        int t = std::min(f[m] - taken[m], rem);
        if (t > 0) {
          seq.push_back({m, t});
          rem -= t;
        }
      }
    }
    out.push_back(std::move(seq));
  }
  // Fewest minipods, pieces split where they must be.
  {
    auto order = ids;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return f[a] > f[b]; });
    Sequence seq;
    int rem = n;
    for (int m : order) {
      int t = std::min(f[m], rem);
      if (t > 0) {
        seq.push_back({m, t});
        rem -= t;
      }
    }
    out.push_back(std::move(seq));
  }
  return out;
}

// Bin covering: the layout is a list of bins (a column group needing R row
// pieces of `width` cells, or a row band needing P column pieces), each
// covered greedily by as few minipods as it can: a minipod whose whole
// pieces cover the rest of the bin (the tightest such) or else the largest.
// `largest_first` takes the largest piece first even when one would fit.
Sequence cover(const std::vector<int>& f, const std::vector<std::pair<int, int>>& bins, bool largest_first) {
  int k = static_cast<int>(f.size());
  std::vector<int> rem = f;
  Sequence seq;
  for (auto [unit, need] : bins) {
    bool first = true;
    while (need > 0) {
      int tight = -1, big = -1;
      for (int m = 0; m < k; ++m) {
        int u = rem[m] / unit;
        if (u <= 0) continue;
        if (u >= need && (tight < 0 || u < rem[tight] / unit)) tight = m;
        if (big < 0 || u > rem[big] / unit) big = m;
      }
      if (big < 0) return {};
      int m = (tight >= 0 && !(largest_first && first)) ? tight : big;
      int take = std::min(need, rem[m] / unit);
      seq.push_back({m, take * unit});
      rem[m] -= take * unit;
      need -= take;
      first = false;
    }
  }
  return seq;
}

// Cell orders: column groups of the given widths walked row by row (each
// minipod holds pieces of PP groups), or row bands of the given heights
// walked column by column (pieces of DP groups).
std::vector<int> order_by_column_groups(const Shape& s, const std::vector<int>& widths) {
  std::vector<int> o;
  o.reserve(s.cells());
  int g = 0;
  for (int w : widths) {
    for (int i = 0; i < s.R; ++i)
      for (int j = g; j < g + w; ++j) o.push_back(j * s.R + i);
    g += w;
  }
  return o;
}
std::vector<int> order_by_row_bands(const Shape& s, const std::vector<int>& heights) {
  std::vector<int> o;
  o.reserve(s.cells());
  int b = 0;
  for (int h : heights) {
    for (int j = 0; j < s.P; ++j)
      for (int i = b; i < b + h; ++i) o.push_back(j * s.R + i);
    b += h;
  }
  return o;
}

// Equal parts of `size` (the last one shorter).
std::vector<int> uniform_parts(int size, int part) {
  std::vector<int> v;
  for (int x = 0; x < size; x += part) v.push_back(std::min(part, size - x));
  return v;
}

// Every partition of `size` into non-increasing parts (size is small).
void partitions(int size, int max_part, std::vector<int>& cur, std::vector<std::vector<int>>& out) {
  if (size == 0) {
    out.push_back(cur);
    return;
  }
  for (int p = std::min(size, max_part); p >= 1; --p) {
    cur.push_back(p);
    partitions(size - p, p, cur, out);
    cur.pop_back();
  }
}

// Matrices up to this many columns (or rows) also try uneven groups (or bands).
constexpr int kPartitionLimit = 16;

}  // namespace

std::vector<int> solve_heuristic(const Shape& s, const std::vector<int>& f) {
  int k = static_cast<int>(f.size()), n = s.cells();
  Evaluator eval;
  std::vector<int> best, color(n);
  double best_obj = std::numeric_limits<double>::infinity();
  size_t best_parts = 0;
  auto try_sequences = [&](const std::vector<int>& order, const std::vector<Sequence>& seqs) {
    for (const auto& seq : seqs) {
      size_t pos = 0;
      for (auto [m, t] : seq)
        for (int x = 0; x < t; ++x) color[order[pos++]] = m;
      if (pos != static_cast<size_t>(n)) continue;  // cannot happen when enough is free
      if (!eval.contiguous(s, color, k)) continue;  // a minipod would come back within a DP group
      double obj = eval(s, color, k).objective;
      if (obj < best_obj - 1e-12 || (obj < best_obj + 1e-12 && seq.size() < best_parts)) {
        best_obj = obj;
        best_parts = seq.size();
        best = color;
      }
    }
  };
  // parts: group widths (columns) or band heights (rows); `other` is the
  // length of the other side, which each bin needs that many pieces of.
  auto try_layout = [&](bool columns, const std::vector<int>& parts, int uniform) {
    std::vector<std::pair<int, int>> bins;
    for (int p : parts) bins.push_back({p, columns ? s.R : s.P});
    std::vector<Sequence> seqs;
    if (uniform > 0) seqs = sequences(f, uniform, n);
    for (bool largest_first : {false, true})
      if (auto c = cover(f, bins, largest_first); !c.empty()) seqs.push_back(std::move(c));
    try_sequences(columns ? order_by_column_groups(s, parts) : order_by_row_bands(s, parts), seqs);
  };
  for (int w = 1; w <= s.P; ++w) try_layout(true, uniform_parts(s.P, w), w);
  for (int h = 1; h <= s.R; ++h) try_layout(false, uniform_parts(s.R, h), h);
  std::vector<int> cur;
  for (auto [columns, size] : {std::pair{true, s.P}, std::pair{false, s.R}}) {
    if (size > kPartitionLimit) continue;
    std::vector<std::vector<int>> all;
    partitions(size, size, cur, all);
    for (const auto& parts : all) try_layout(columns, parts, 0);
  }
  return best;
}

namespace {

// Branch and bound over the matrix, row by row. Rows are interchangeable and
// so are columns, so only matrices whose rows and columns are both in
// lexicographic order are searched (double-lex symmetry breaking).
struct BranchAndBound {
  const Shape& s;
  int k, R, P;
  std::vector<int> cap, g, rowcnt, colcnt, rowT, colT;
  std::vector<char> rowEq, colEq;
  double best;
  std::vector<int> best_g;
  uint64_t nodes = 0, limit;
  bool aborted = false;

  BranchAndBound(const Shape& sh, std::vector<int> capacity, uint64_t lim, double incumbent)
      : s(sh),
        k(static_cast<int>(capacity.size())),
        R(sh.R),
        P(sh.P),
        cap(std::move(capacity)),
        g(static_cast<size_t>(R) * P, -1),
        rowcnt(static_cast<size_t>(R) * k, 0),
        colcnt(static_cast<size_t>(P) * k, 0),
        rowT(R, 0),
        colT(P, 0),
        rowEq(R, 1),
        colEq(P, 1),
        best(incumbent),
        limit(lim) {}

  void run(int t, int maxc, int maxr) {
    if (aborted) return;
    if (++nodes > limit) {
      aborted = true;
      return;
    }
    if (t == R * P) {
      best = weigh(s, spread(maxc), spread(maxr));
      best_g = g;
      return;
    }
    int i = t / P, j = t % P;
    if (j == 0) rowEq[i] = 1;
    int lo = 0;
    if (i > 0 && rowEq[i]) lo = std::max(lo, g[(i - 1) * P + j]);
    if (j > 0 && colEq[j]) lo = std::max(lo, g[i * P + j - 1]);
    for (int c = lo; c < k; ++c) {
      if (cap[c] == 0) continue;
      int nr = rowT[i] + (rowcnt[i * k + c] == 0), nc = colT[j] + (colcnt[j * k + c] == 0);
      int mc = std::max(maxc, nc), mr = std::max(maxr, nr);
      if (weigh(s, spread(mc), spread(mr)) >= best - 1e-12) continue;
      char oldRow = rowEq[i], oldCol = colEq[j];
      if (i > 0) rowEq[i] = static_cast<char>(oldRow && c == g[(i - 1) * P + j]);
      if (j > 0) colEq[j] = static_cast<char>(oldCol && c == g[i * P + j - 1]);
      g[i * P + j] = c;
      --cap[c];
      ++rowcnt[i * k + c];
      ++colcnt[j * k + c];
      int oldRT = rowT[i], oldCT = colT[j];
      rowT[i] = nr;
      colT[j] = nc;
      run(t + 1, mc, mr);
      rowT[i] = oldRT;
      colT[j] = oldCT;
      --colcnt[j * k + c];
      --rowcnt[i * k + c];
      ++cap[c];
      g[i * P + j] = -1;
      rowEq[i] = oldRow;
      colEq[j] = oldCol;
      if (aborted) return;
    }
  }
};

// Sort rows lexicographically by their minipods (column by column): rows
// are interchangeable, and sorted rows keep each minipod's cells of a DP
// group on consecutive ranks.
void sort_rows(const Shape& s, std::vector<int>& color) {
  std::vector<int> rows(s.R);
  std::iota(rows.begin(), rows.end(), 0);
  std::stable_sort(rows.begin(), rows.end(), [&](int a, int b) {
    for (int j = 0; j < s.P; ++j) {
      int ca = color[j * s.R + a], cb = color[j * s.R + b];
      if (ca != cb) return ca < cb;
    }
    return false;
  });
  std::vector<int> out(color.size());
  for (int i = 0; i < s.R; ++i)
    for (int j = 0; j < s.P; ++j) out[j * s.R + i] = color[j * s.R + rows[i]];
  color.swap(out);
}

// Rows are interchangeable: when sorting left a minipod split within a DP
// group, try every row order of a small matrix for one that is contiguous
// in every group (not every matrix has one).
void make_contiguous(const Shape& s, std::vector<int>& color, int k) {
  constexpr int kMaxRows = 8;  // 8! orders
  if (s.R > kMaxRows || contiguous(s, color, k)) return;
  std::vector<int> rows(s.R), trial(color.size());
  std::iota(rows.begin(), rows.end(), 0);
  while (std::next_permutation(rows.begin(), rows.end())) {
    for (int i = 0; i < s.R; ++i)
      for (int j = 0; j < s.P; ++j) trial[j * s.R + i] = color[j * s.R + rows[i]];
    if (contiguous(s, trial, k)) {
      color.swap(trial);
      return;
    }
  }
}

}  // namespace

bool solve_exact(const Shape& s, const std::vector<int>& f, uint64_t node_limit, std::vector<int>& color) {
  int k = static_cast<int>(f.size());
  // Colours are the usable minipods, largest first, so good matrices come early.
  std::vector<int> usable;
  for (int m = 0; m < k; ++m)
    if (f[m] > 0) usable.push_back(m);
  std::stable_sort(usable.begin(), usable.end(), [&](int a, int b) { return f[a] > f[b]; });
  std::vector<int> cap;
  for (int m : usable) cap.push_back(f[m]);
  double incumbent = color.empty() ? std::numeric_limits<double>::infinity() : evaluate(s, color, k).objective;
  BranchAndBound bb(s, cap, node_limit, incumbent);
  bb.run(0, 0, 0);
  if (!bb.best_g.empty()) {
    color.assign(static_cast<size_t>(s.cells()), 0);
    for (int i = 0; i < s.R; ++i)
      for (int j = 0; j < s.P; ++j) color[j * s.R + i] = usable[bb.best_g[i * s.P + j]];
    sort_rows(s, color);
    make_contiguous(s, color, k);
  }
  return !bb.aborted;
}

const std::vector<std::string>& algorithm_names() {
  static const std::vector<std::string> names{"arnold", "exact", "heuristic", "best-fit", "random-fit", "slurm-tree"};
  return names;
}

std::vector<int> baseline_nodes(const std::string& name, const Topology& topo, const Cluster& cl, int n,
                                uint64_t seed) {
  int k = static_cast<int>(cl.free_count.size());
  std::vector<int> picked;
  auto take_minipods = [&](const std::vector<int>& order) {
    for (int m : order)
      for (int node : cl.free_nodes[m]) {
        if (static_cast<int>(picked.size()) == n) return;
        picked.push_back(node);
      }
  };
  std::vector<int> ids(k);
  std::iota(ids.begin(), ids.end(), 0);
  if (name == "best-fit") {
    // Fullest minipod (fewest free nodes) first; a minipod that fits the
    // whole job alone is preferred, the tightest such.
    int single = -1;
    for (int m : ids)
      if (cl.free_count[m] >= n && (single < 0 || cl.free_count[m] < cl.free_count[single])) single = m;
    if (single >= 0) {
      take_minipods({single});
    } else {
      std::vector<int> order;
      for (int m : ids)
        if (cl.free_count[m] > 0) order.push_back(m);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return cl.free_count[a] < cl.free_count[b]; });
      take_minipods(order);
    }
  } else if (name == "random-fit") {
    std::mt19937_64 rng(seed);
    auto order = ids;
    for (int i = k - 1; i > 0; --i) std::swap(order[i], order[static_cast<int>(rng() % (i + 1))]);
    take_minipods(order);
  } else if (name == "slurm-tree") {
    // Lowest switch that fits: a minipod that holds the job (tightest), else
    // the whole tree. Then whole leaf switches, greedily: the tightest leaf
    // that fits the rest, else the leaf with the most free nodes.
    int scope = -1;
    for (int m : ids)
      if (cl.free_count[m] >= n && (scope < 0 || cl.free_count[m] < cl.free_count[scope])) scope = m;
    std::vector<std::vector<int>> leaf_free(topo.leaves.size());
    for (int m : ids)
      if (scope < 0 || m == scope)
        for (int node : cl.free_nodes[m]) leaf_free[topo.node_leaf[node]].push_back(node);
    for (auto& v : leaf_free) std::sort(v.begin(), v.end());
    std::vector<char> used(topo.leaves.size(), 0);
    int rem = n;
    while (rem > 0) {
      int fit = -1, big = -1;
      for (size_t l = 0; l < leaf_free.size(); ++l) {
        int sz = static_cast<int>(leaf_free[l].size());
        if (used[l] || sz == 0) continue;
        if (sz >= rem && (fit < 0 || sz < static_cast<int>(leaf_free[fit].size()))) fit = static_cast<int>(l);
        if (big < 0 || sz > static_cast<int>(leaf_free[big].size())) big = static_cast<int>(l);
      }
      int l = fit >= 0 ? fit : big;
      if (l < 0) break;
      used[l] = 1;
      for (int node : leaf_free[l]) {
        if (rem == 0) break;
        picked.push_back(node);
        --rem;
      }
    }
  } else {
    throw InputError("unknown baseline \"" + name + "\"");
  }
  // Slurm hands out nodes in node order; Megatron then numbers ranks
  // TP fastest, then DP, then PP, so node r of the list holds cell r.
  std::sort(picked.begin(), picked.end());
  return picked;
}

Plan place(const Topology& topo, const Cluster& cl, const Job& job, const PlaceOptions& opt) {
  auto t0 = std::chrono::steady_clock::now();
  const auto& names = algorithm_names();
  if (std::find(names.begin(), names.end(), opt.algorithm) == names.end()) {
    std::string all;
    for (const auto& a : names) all += (all.empty() ? "" : ", ") + a;
    throw InputError("unknown algorithm \"" + opt.algorithm + "\" (one of: " + all + ")");
  }
  Shape s = shape_of(job);
  int n = s.cells(), k = static_cast<int>(cl.free_count.size());
  if (n > cl.total_free)
    throw InputError("job " + job.name + " needs " + std::to_string(n) + " nodes (" + std::to_string(s.R) + " rows x " +
                     std::to_string(s.P) + " stages) but only " + std::to_string(cl.total_free) + " of " +
                     std::to_string(topo.nodes.size()) + " are free");
  Plan p;
  p.job = job.name;
  p.algorithm = opt.algorithm;
  p.shape = s;
  p.gpus_per_node = job.gpus_per_node;
  std::vector<int> color(n);
  bool baseline = opt.algorithm == "best-fit" || opt.algorithm == "random-fit" || opt.algorithm == "slurm-tree";
  if (baseline) {
    p.nodes = baseline_nodes(opt.algorithm, topo, cl, n, opt.seed);
    for (int r = 0; r < n; ++r) color[r] = topo.node_minipod[p.nodes[r]];
  } else {
    color = solve_heuristic(s, cl.free_count);
    if (color.empty()) throw std::logic_error("placement heuristic found no contiguous layout");
    if (opt.algorithm != "exact") {
      // The baselines' colourings are candidates too: never worse than them.
      double obj = evaluate(s, color, k).objective;
      for (const char* b : {"best-fit", "slurm-tree", "random-fit"}) {
        auto nodes = baseline_nodes(b, topo, cl, n, opt.seed);
        std::vector<int> c(n);
        for (int r = 0; r < n; ++r) c[r] = topo.node_minipod[nodes[r]];
        double o = evaluate(s, c, k).objective;
        if (o < obj - 1e-12 && contiguous(s, c, k)) {
          obj = o;
          color = c;
        }
      }
    }
    // The search is only needed while the bound leaves room for better.
    bool open = evaluate(s, color, k).objective > lower_bound(s, cl.free_count) + 1e-12;
    if (opt.algorithm == "exact" && open)
      p.optimal = solve_exact(s, cl.free_count, opt.exact_forced_node_limit, color);
    else if (opt.algorithm == "arnold" && n <= opt.exact_max_cells && open)
      p.optimal = solve_exact(s, cl.free_count, opt.exact_node_limit, color);
    // Nodes of each minipod in rank order, so a minipod's ranks are contiguous.
    std::vector<size_t> next(k, 0);
    p.nodes.resize(n);
    for (int r = 0; r < n; ++r) p.nodes[r] = cl.free_nodes[color[r]][next[color[r]]++];
  }
  p.score = evaluate(s, color, k);
  p.lower_bound = p.optimal ? p.score.objective : std::min(p.score.objective, lower_bound(s, cl.free_count));
  if (p.lower_bound >= p.score.objective - 1e-12) p.optimal = true;
  p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return p;
}

}  // namespace ballast::sched
