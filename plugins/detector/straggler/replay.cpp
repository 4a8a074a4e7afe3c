#include "replay.hpp"

#include <algorithm>
#include <numeric>
#include <string>

namespace ballast::straggler {

Replay::Replay(const Model& model)
    : m_(model),
      lanes_(model.lanes()),
      nops_(model.ops.size()),
      block_(std::max<size_t>(1, 64 / static_cast<size_t>(model.dp)) * static_cast<size_t>(model.dp)),
      nblocks_((lanes_ + block_ - 1) / block_) {
  lane_base_.resize(lanes_);
  for (size_t l = 0; l < lanes_; ++l) lane_base_[l] = (l / block_) * nops_ * block_ + l % block_;
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
  std::vector<double> times(m_.steps.size());
  const size_t stride = nops_ * block_;
  for (size_t k = 0; k < nblocks_; ++k) {
    size_t o = k * stride;
    size_t n = std::min(block_, lanes_ - k * block_);
    run_block(cost + o, delay ? delay + o : nullptr, start + o, end + o, n);
    step_times(start + o, end + o, k * block_, n, times);
  }
  return times;
}

void Replay::run_block(const double* cost, const double* delay, double* start, double* end, size_t n) const {
  const size_t B = block_;
  const size_t dp = static_cast<size_t>(m_.dp);
  std::vector<double> group_start(n);
  double* gs = group_start.data();
  for (const Node& node : order_) {
    for (int32_t i = 0; i < node.count; ++i) {
      const size_t op = static_cast<size_t>(members_[node.first + i]);
      double* s = start + op * B;
      const int32_t* d = deps_.data() + dep_begin_[op];
      const int32_t nd = dep_begin_[op + 1] - dep_begin_[op];
      if (nd == 0) {
        std::fill(s, s + n, 0.0);
      } else {
        const double* e0 = end + static_cast<size_t>(d[0]) * B;
        std::copy(e0, e0 + n, s);
        for (int32_t k = 1; k < nd; ++k) {
          const double* e = end + static_cast<size_t>(d[k]) * B;
          for (size_t l = 0; l < n; ++l) s[l] = s[l] < e[l] ? e[l] : s[l];
        }
      }
      if (delay) {
        const double* dl = delay + op * B;
        for (size_t l = 0; l < n; ++l) s[l] += dl[l];
      }
      if (!node.comm) {
        const double* c = cost + op * B;
        double* e = end + op * B;
        for (size_t l = 0; l < n; ++l) e[l] = s[l] + c[l];
      }
    }
    if (!node.comm) continue;
    const double* s0 = start + static_cast<size_t>(members_[node.first]) * B;
    std::copy(s0, s0 + n, gs);
    for (int32_t i = 1; i < node.count; ++i) {
      const double* s = start + static_cast<size_t>(members_[node.first + i]) * B;
      for (size_t l = 0; l < n; ++l) gs[l] = gs[l] < s[l] ? s[l] : gs[l];
    }
    if (node.dp_sync) {
      for (size_t b = 0; b < n; b += dp) {
        double latest = *std::max_element(gs + b, gs + b + dp);
        std::fill(gs + b, gs + b + dp, latest);
      }
    }
    for (int32_t i = 0; i < node.count; ++i) {
      const size_t op = static_cast<size_t>(members_[node.first + i]);
      const double* c = cost + op * B;
      double* e = end + op * B;
      for (size_t l = 0; l < n; ++l) e[l] = gs[l] + c[l];
    }
  }
}

void Replay::step_times(const double* start, const double* end, size_t first_lane, size_t n,
                        std::vector<double>& times) const {
  const size_t B = block_;
  const size_t dp = static_cast<size_t>(m_.dp);
  std::vector<double> lo(n, 1e300), hi(n, -1e300);
  for (size_t op = 0; op < nops_; ++op) {
    const double* s = start + op * B;
    const double* e = end + op * B;
    for (size_t l = 0; l < n; ++l) {
      lo[l] = lo[l] < s[l] ? lo[l] : s[l];
      hi[l] = hi[l] < e[l] ? e[l] : hi[l];
    }
  }
  for (size_t b = 0; b < n; b += dp)
    times[(first_lane + b) / dp] =
        *std::max_element(hi.begin() + b, hi.begin() + b + dp) - *std::min_element(lo.begin() + b, lo.begin() + b + dp);
}

double mean(const std::vector<double>& v) {
  return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

}  // namespace ballast::straggler
