#include "replay.hpp"

#include <algorithm>
#include <numeric>
#include <string>

namespace ballast::straggler {

Replay::Replay(const Model& model) : m_(model), lanes_(model.lanes()) {
  const size_t n = m_.ops.size();
  dep_begin_.assign(n + 1, 0);
  for (size_t op = 0; op < n; ++op) {
    dep_begin_[op + 1] = dep_begin_[op] + static_cast<int32_t>(m_.ops[op].deps.size());
    deps_.insert(deps_.end(), m_.ops[op].deps.begin(), m_.ops[op].deps.end());
  }

  // Nodes: a communication group is one node, a local op another.
  std::vector<int32_t> node_of(n);
  std::vector<Node> nodes;
  std::vector<std::vector<int32_t>> node_members;
  for (size_t g = 0; g < m_.groups.size(); ++g) {
    for (int32_t op : m_.groups[g].members) node_of[op] = static_cast<int32_t>(nodes.size());
    nodes.push_back({0, 0, true, m_.groups[g].dp_sync});
    node_members.push_back(m_.groups[g].members);
  }
  for (size_t op = 0; op < n; ++op) {
    if (m_.ops[op].group >= 0) continue;
    node_of[op] = static_cast<int32_t>(nodes.size());
    nodes.push_back({0, 0, false, false});
    node_members.push_back({static_cast<int32_t>(op)});
  }

  // Kahn's algorithm over nodes, in a deterministic order.
  std::vector<std::vector<int32_t>> next(nodes.size());
  std::vector<int32_t> indegree(nodes.size(), 0);
  for (size_t v = 0; v < nodes.size(); ++v) {
    std::vector<int32_t> preds;
    for (int32_t op : node_members[v]) {
      for (int32_t d : m_.ops[op].deps) {
        if (node_of[d] != static_cast<int32_t>(v)) preds.push_back(node_of[d]);
      }
    }
    std::sort(preds.begin(), preds.end());
    preds.erase(std::unique(preds.begin(), preds.end()), preds.end());
    for (int32_t u : preds) next[u].push_back(static_cast<int32_t>(v));
    indegree[v] = static_cast<int32_t>(preds.size());
  }
  std::vector<int32_t> queue;
  for (size_t v = 0; v < nodes.size(); ++v) {
    if (indegree[v] == 0) queue.push_back(static_cast<int32_t>(v));
  }
  for (size_t head = 0; head < queue.size(); ++head) {
    int32_t v = queue[head];
    Node node = nodes[v];
    node.first = static_cast<int32_t>(members_.size());
    node.count = static_cast<int32_t>(node_members[v].size());
    members_.insert(members_.end(), node_members[v].begin(), node_members[v].end());
    order_.push_back(node);
    for (int32_t w : next[v]) {
      if (--indegree[w] == 0) queue.push_back(w);
    }
  }
  if (order_.size() != nodes.size()) {
    for (size_t v = 0; v < nodes.size(); ++v) {
      if (indegree[v] > 0) {
        const ModelOp& o = m_.ops[node_members[v].front()];
        throw TraceError("the dependency graph has a cycle through " + std::string(optype_name(o.type)) + " " +
                         std::to_string(o.seq) + " of stage " + std::to_string(o.stage));
      }
    }
  }
}

std::vector<double> Replay::run(const double* cost, const double* delay, double* start, double* end) const {
  // Whole steps at a time, about 64 lanes: the rows of every op for a block
  // stay in cache while the graph is walked and the step times are taken.
  const size_t dp = static_cast<size_t>(m_.dp);
  const size_t block = std::max<size_t>(1, 64 / dp) * dp;
  std::vector<double> times(m_.steps.size());
  for (size_t l0 = 0; l0 < lanes_; l0 += block) {
    size_t l1 = std::min(lanes_, l0 + block);
    run_lanes(cost, delay, start, end, l0, l1);
    step_times(start, end, l0, l1, times);
  }
  return times;
}

void Replay::run_lanes(const double* cost, const double* delay, double* start, double* end, size_t l0,
                       size_t l1) const {
  const size_t L = lanes_;
  const size_t dp = static_cast<size_t>(m_.dp);
  double group_start[128];  // a block has at most 64 lanes, or dp when dp > 64
  std::vector<double> big;
  double* gs = group_start;
  if (l1 - l0 > std::size(group_start)) {
    big.resize(l1 - l0);
    gs = big.data();
  }
  for (const Node& node : order_) {
    for (int32_t i = 0; i < node.count; ++i) {
      const size_t op = static_cast<size_t>(members_[node.first + i]);
      double* s = start + op * L;
      const int32_t* d = deps_.data() + dep_begin_[op];
      const int32_t nd = dep_begin_[op + 1] - dep_begin_[op];
      if (nd == 0) {
        std::fill(s + l0, s + l1, 0.0);
      } else {
        const double* e0 = end + static_cast<size_t>(d[0]) * L;
        std::copy(e0 + l0, e0 + l1, s + l0);
        for (int32_t k = 1; k < nd; ++k) {
          const double* e = end + static_cast<size_t>(d[k]) * L;
          for (size_t l = l0; l < l1; ++l) s[l] = std::max(s[l], e[l]);
        }
      }
      if (delay) {
        const double* dl = delay + op * L;
        for (size_t l = l0; l < l1; ++l) s[l] += dl[l];
      }
      if (!node.comm) {
        const double* c = cost + op * L;
        double* e = end + op * L;
        for (size_t l = l0; l < l1; ++l) e[l] = s[l] + c[l];
      }
    }
    if (!node.comm) continue;
    const double* s0 = start + static_cast<size_t>(members_[node.first]) * L;
    std::copy(s0 + l0, s0 + l1, gs);
    for (int32_t i = 1; i < node.count; ++i) {
      const double* s = start + static_cast<size_t>(members_[node.first + i]) * L;
      for (size_t l = l0; l < l1; ++l) gs[l - l0] = std::max(gs[l - l0], s[l]);
    }
    if (node.dp_sync) {
      for (size_t b = 0; b < l1 - l0; b += dp) {
        double latest = *std::max_element(gs + b, gs + b + dp);
        std::fill(gs + b, gs + b + dp, latest);
      }
    }
    for (int32_t i = 0; i < node.count; ++i) {
      const size_t op = static_cast<size_t>(members_[node.first + i]);
      const double* c = cost + op * L;
      double* e = end + op * L;
      for (size_t l = l0; l < l1; ++l) e[l] = gs[l - l0] + c[l];
    }
  }
}

void Replay::step_times(const double* start, const double* end, size_t l0, size_t l1,
                        std::vector<double>& times) const {
  const size_t L = lanes_;
  const size_t dp = static_cast<size_t>(m_.dp);
  double first[128], last[128];  // a block's lanes, see run()
  std::vector<double> big;
  double* lo = first;
  double* hi = last;
  if (l1 - l0 > std::size(first)) {
    big.resize(2 * (l1 - l0));
    lo = big.data();
    hi = lo + (l1 - l0);
  }
  std::fill(lo, lo + (l1 - l0), 1e300);
  std::fill(hi, hi + (l1 - l0), -1e300);
  for (size_t op = 0; op < m_.ops.size(); ++op) {
    const double* s = start + op * L;
    const double* e = end + op * L;
    for (size_t l = l0; l < l1; ++l) {
      lo[l - l0] = std::min(lo[l - l0], s[l]);
      hi[l - l0] = std::max(hi[l - l0], e[l]);
    }
  }
  for (size_t b = 0; b < l1 - l0; b += dp) {
    times[(l0 + b) / dp] = *std::max_element(hi + b, hi + b + dp) - *std::min_element(lo + b, lo + b + dp);
  }
}

double mean(const std::vector<double>& v) {
  return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

}  // namespace ballast::straggler
