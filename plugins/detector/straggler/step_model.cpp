#include "step_model.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <string>
#include <unordered_map>

namespace ballast::straggler {
namespace {

// Clock slack when telling a send/receive that belongs to a compute op from
// one recorded outside the compute phase (seconds).
constexpr double kMatchEps = 5e-5;
constexpr uint32_t kNoRow = std::numeric_limits<uint32_t>::max();

std::string op_label(OpType type, int32_t seq, int32_t stage) {
  return std::string(optype_name(type)) + " " + std::to_string(seq) + " of stage " + std::to_string(stage);
}

class Builder {
 public:
  Builder(const Trace& trace, const Meta& meta, const ModelOptions& options, Model& model)
      : t_(trace), meta_(meta), opt_(options), m_(model) {}

  void build() {
    for (const TraceRow& r : t_.rows) has_separate_ |= r.optype == OpType::separate_grads_all_reduce;
    sizes();
    pick_ranks();
    collect_steps();
    reference_ops();
    fill_rows();
    for (int s = 0; s < m_.pp; ++s) stage_dependencies(s);
    groups();
  }

 private:
  [[noreturn]] void fail_row(size_t r, const std::string& column, const std::string& what) const {
    throw TraceError(t_.where(r) + ": " + (column.empty() ? "" : "column " + column + ": ") + what);
  }

  void sizes() {
    int max_dp = 0, max_stage = 0;
    for (const TraceRow& r : t_.rows) {
      max_dp = std::max(max_dp, r.dp_rank);
      max_stage = std::max(max_stage, r.stage);
    }
    m_.dp = meta_.dp > 0 ? meta_.dp : max_dp + 1;
    m_.pp = meta_.pp > 0 ? meta_.pp : max_stage + 1;
    for (size_t i = 0; i < t_.rows.size(); ++i) {
      if (t_.rows[i].dp_rank >= m_.dp)
        fail_row(i, "dp_rank", std::to_string(t_.rows[i].dp_rank) + " >= dp_size " + std::to_string(m_.dp));
      if (t_.rows[i].stage >= m_.pp)
        fail_row(i, "stage", std::to_string(t_.rows[i].stage) + " >= pp_size " + std::to_string(m_.pp));
    }
    m_.use_dp = m_.dp * std::max(1, meta_.dsp) > 1;
  }

  // One rank per (dp_rank, stage) is analysed; further ones (tensor-parallel
  // peers, which run the same schedule) are ignored.
  void pick_ranks() {
    m_.cell_rank.assign(static_cast<size_t>(m_.dp) * m_.pp, -1);
    keep_.assign(t_.rows.size(), 1);
    for (size_t i = 0; i < t_.rows.size(); ++i) {
      const TraceRow& r = t_.rows[i];
      int32_t& cell = m_.cell_rank[static_cast<size_t>(r.stage) * m_.dp + r.dp_rank];
      if (cell < 0 || r.rank < cell) cell = r.rank;
    }
    for (size_t i = 0; i < t_.rows.size(); ++i) {
      const TraceRow& r = t_.rows[i];
      if (m_.cell_rank[static_cast<size_t>(r.stage) * m_.dp + r.dp_rank] != r.rank) {
        keep_[i] = 0;
        ++m_.ignored_rows;
      }
    }
  }

  void collect_steps() {
    std::map<int64_t, size_t> count;
    int32_t max_seq = 0;
    for (size_t i = 0; i < t_.rows.size(); ++i) {
      if (!keep_[i]) continue;
      ++count[t_.rows[i].step];
      max_seq = std::max(max_seq, t_.rows[i].seq_id);
    }
    for (auto& [step, n] : count) m_.steps.push_back(step);
    // The schedule is read from the first step, as the reference tool does;
    // online, from the most complete one.
    ref_step_ = m_.steps.front();
    if (opt_.drop_bad_steps) {
      size_t best = 0;
      for (auto& [step, n] : count) {
        if (n > best) best = n, ref_step_ = step;
      }
    }
    nseq_ = static_cast<size_t>(max_seq) + 1;
    if (nseq_ * kOpTypeCount * static_cast<size_t>(m_.pp) > (size_t{1} << 26)) {
      for (size_t i = 0; i < t_.rows.size(); ++i) {
        if (t_.rows[i].seq_id == max_seq) fail_row(i, "seq_id", std::to_string(max_seq) + " is implausibly large");
      }
    }
    key_to_op_.assign(nseq_ * kOpTypeCount * static_cast<size_t>(m_.pp), -1);
  }

  size_t key(OpType type, int32_t seq, int32_t stage) const {
    return (static_cast<size_t>(stage) * kOpTypeCount + static_cast<size_t>(type)) * nseq_ + static_cast<size_t>(seq);
  }

  int32_t find(OpType type, int32_t seq, int32_t stage) const {
    if (seq < 0 || static_cast<size_t>(seq) >= nseq_ || stage < 0 || stage >= m_.pp) return -1;
    return key_to_op_[key(type, seq, stage)];
  }

  // The ops of (reference step, dp_rank 0) define the model.
  void reference_ops() {
    std::vector<uint32_t> ref_row;
    for (size_t i = 0; i < t_.rows.size(); ++i) {
      const TraceRow& r = t_.rows[i];
      if (!keep_[i] || r.step != ref_step_ || r.dp_rank != 0) continue;
      int32_t& slot = key_to_op_[key(r.optype, r.seq_id, r.stage)];
      if (slot >= 0)
        fail_row(i, "seq_id",
                 op_label(r.optype, r.seq_id, r.stage) + " appears twice in step " + std::to_string(r.step) +
                     " (also " + t_.where(ref_row[slot]) + ")");
      slot = static_cast<int32_t>(m_.ops.size());
      m_.ops.push_back({r.optype, r.seq_id, r.stage, r.mc, r.gmc, {}, -1});
      ref_row.push_back(static_cast<uint32_t>(i));
      start0_.push_back(r.start);
      end0_.push_back(r.start + r.duration);
    }
    by_stage_.assign(m_.pp, {});
    for (size_t op = 0; op < m_.ops.size(); ++op) by_stage_[m_.ops[op].stage].push_back(static_cast<int32_t>(op));
    for (auto& ops : by_stage_) {
      std::sort(ops.begin(), ops.end(), [&](int32_t a, int32_t b) {
        if (start0_[a] != start0_[b]) return start0_[a] < start0_[b];
        if (m_.ops[a].seq != m_.ops[b].seq) return m_.ops[a].seq < m_.ops[b].seq;
        return optype_name(m_.ops[a].type) < optype_name(m_.ops[b].type);
      });
    }
  }

  // Places every row at (op, lane); checks that each step and DP rank ran
  // exactly the reference schedule, in seq_id order.
  void fill_rows() {
    std::unordered_map<int64_t, size_t> step_index;
    for (size_t i = 0; i < m_.steps.size(); ++i) step_index[m_.steps[i]] = i;
    const size_t lanes = m_.lanes();
    m_.row.assign(m_.ops.size() * lanes, kNoRow);
    std::vector<char> bad(m_.steps.size(), 0);
    auto reject = [&](size_t step_idx, size_t r, const std::string& column, const std::string& what) {
      if (!opt_.drop_bad_steps) fail_row(r, column, what);
      bad[step_idx] = 1;
    };

    for (size_t i = 0; i < t_.rows.size(); ++i) {
      if (!keep_[i]) continue;
      const TraceRow& r = t_.rows[i];
      size_t si = step_index[r.step];
      int32_t op = find(r.optype, r.seq_id, r.stage);
      if (op < 0) {
        reject(si, i, "optype",
               op_label(r.optype, r.seq_id, r.stage) + " does not occur in step " + std::to_string(ref_step_) +
                   " of dp_rank 0: every step and DP rank must run the same schedule");
        continue;
      }
      uint32_t& slot = m_.row[static_cast<size_t>(op) * lanes + si * m_.dp + r.dp_rank];
      if (slot != kNoRow) {
        reject(si, i, "seq_id",
               op_label(r.optype, r.seq_id, r.stage) + " appears twice in step " + std::to_string(r.step) + " (also " +
                   t_.where(slot) + ")");
        continue;
      }
      slot = static_cast<uint32_t>(i);
    }
    for (size_t op = 0; op < m_.ops.size(); ++op) {
      const ModelOp& o = m_.ops[op];
      int32_t prev = find(o.type, o.seq - 1, o.stage);
      for (size_t lane = 0; lane < lanes; ++lane) {
        size_t si = lane / m_.dp;
        if (bad[si]) continue;
        uint32_t r = m_.row[op * lanes + lane];
        if (r == kNoRow) {
          int dp_rank = static_cast<int>(lane % m_.dp);
          std::string what = op_label(o.type, o.seq, o.stage) + " is missing in step " + std::to_string(m_.steps[si]) +
                             ", dp_rank " + std::to_string(dp_rank);
          if (!opt_.drop_bad_steps) throw TraceError(t_.source + ": " + what);
          bad[si] = 1;
          continue;
        }
        uint32_t pr = prev >= 0 ? m_.row[static_cast<size_t>(prev) * lanes + lane] : kNoRow;
        if (pr != kNoRow && t_.rows[r].start < t_.rows[pr].start) {
          reject(si, r, "start_ts",
                 op_label(o.type, o.seq, o.stage) + " starts at " + std::to_string(t_.rows[r].start) +
                     ", before seq_id " + std::to_string(o.seq - 1) + " (" + t_.where(pr) + ", at " +
                     std::to_string(t_.rows[pr].start) + "): seq_id must follow start order");
        }
      }
    }
    if (std::find(bad.begin(), bad.end(), 1) == bad.end()) return;

    std::vector<int64_t> steps;
    std::vector<size_t> old_index;
    for (size_t si = 0; si < m_.steps.size(); ++si) {
      if (bad[si])
        m_.dropped_steps.push_back(m_.steps[si]);
      else
        steps.push_back(m_.steps[si]), old_index.push_back(si);
    }
    if (steps.empty())
      throw TraceError(t_.source + ": no step follows the schedule of step " + std::to_string(ref_step_));
    std::vector<uint32_t> rows(m_.ops.size() * steps.size() * m_.dp);
    const size_t new_lanes = steps.size() * m_.dp;
    for (size_t op = 0; op < m_.ops.size(); ++op) {
      for (size_t si = 0; si < steps.size(); ++si) {
        for (int d = 0; d < m_.dp; ++d)
          rows[op * new_lanes + si * m_.dp + d] = m_.row[op * lanes + old_index[si] * m_.dp + d];
      }
    }
    m_.steps = std::move(steps);
    m_.row = std::move(rows);
  }

  void add_dep(int32_t op, int32_t dep) {
    if (op < 0 || dep < 0 || op == dep) return;
    auto& deps = m_.ops[op].deps;
    if (std::find(deps.begin(), deps.end(), dep) == deps.end()) deps.push_back(dep);
  }

  // Each op waits for the one before it (ops that do not exist are skipped).
  void chain(const std::vector<int32_t>& ops, std::vector<int32_t> last = {}) {
    std::erase(last, -1);
    for (int32_t op : ops) {
      if (op < 0) continue;
      for (int32_t l : last) add_dep(op, l);
      last = {op};
    }
  }

  template <class Pred>
  std::vector<int32_t> select(int stage, Pred pred) const {
    std::vector<int32_t> out;
    for (int32_t op : by_stage_[stage]) {
      if (pred(m_.ops[op])) out.push_back(op);
    }
    return out;
  }

  std::vector<int32_t> of_type(int stage, OpType type) const {
    return select(stage, [type](const ModelOp& o) { return o.type == type; });
  }

  // Pipeline sends/receives: which compute op each belongs to (a send
  // follows its compute, a compute follows its receive, which may start
  // once the previous compute of its direction ended), and which are no-ops
  // (recorded outside the compute phase, or towards no peer).
  void match_p2p(int s) {
    const int vpp = vpp_;
    for (int backward = 0; backward < 2; ++backward) {
      const OpType comp_type = backward ? OpType::backward_compute : OpType::forward_compute;
      const std::vector<int32_t> comps = of_type(s, comp_type);
      double last_start = -std::numeric_limits<double>::infinity();
      double first_end = std::numeric_limits<double>::infinity();
      for (int32_t c : comps) {
        last_start = std::max(last_start, start0_[c]);
        first_end = std::min(first_end, end0_[c]);
      }
      for (int recv = 0; recv < 2; ++recv) {
        const OpType type = backward ? (recv ? OpType::backward_recv : OpType::backward_send)
                                     : (recv ? OpType::forward_recv : OpType::forward_send);
        // Direction of the peer's model chunk: forward sends go up, backward ones down.
        const int delta = (backward != 0) == (recv != 0) ? 1 : -1;
        const std::vector<int32_t> comms = of_type(s, type);
        auto outside = [&](int32_t op) {
          return recv ? start0_[op] > last_start + kMatchEps : end0_[op] < first_end - kMatchEps;
        };
        size_t inside = 0;
        for (int32_t op : comms) inside += !outside(op);
        int32_t compute_id = 0;
        if (inside != comps.size()) {
          bool edge = s == 0 || s == m_.pp - 1;
          if (!edge || !(inside == 0 || inside + 1 == comps.size()))
            throw TraceError(t_.source + ": stage " + std::to_string(s) + " has " + std::to_string(inside) + " " +
                             std::string(optype_name(type)) + " ops in its compute phase for " +
                             std::to_string(comps.size()) + " " + std::string(optype_name(comp_type)) + " ops (step " +
                             std::to_string(ref_step_) + ", dp_rank 0)");
          // A first forward receive that was not recorded: skip its compute op.
          if (recv && inside + 1 == comps.size()) compute_id = 1;
        }
        for (int32_t op : comms) {
          if (outside(op)) continue;
          int32_t match = find(comp_type, compute_id, s);
          if (match < 0)
            throw TraceError(t_.source + ": " + op_label(m_.ops[op].type, m_.ops[op].seq, s) + " has no " +
                             std::string(optype_name(comp_type)) + " " + std::to_string(compute_id) + " to match");
          int peer_gmc = m_.ops[match].gmc + delta;
          no_op_[op] = peer_gmc < 0 || peer_gmc >= vpp * m_.pp;
          if (!recv) {
            add_dep(op, match);
          } else {
            add_dep(match, op);
            add_dep(op, find(comp_type, compute_id - 1, s));
          }
          ++compute_id;
        }
      }
    }
  }

  void stage_dependencies(int s) {
    const std::vector<int32_t> comps = select(s, [](const ModelOp& o) { return is_compute_kernel(o.type); });
    chain(comps);  // one compute stream

    if (s == 0) {
      no_op_.assign(m_.ops.size(), 1);
      vpp_ = 1;
      for (const ModelOp& o : m_.ops) vpp_ = std::max(vpp_, o.mc + 1);
    }
    match_p2p(s);
    for (OpType t : {OpType::forward_send, OpType::forward_recv, OpType::backward_send, OpType::backward_recv})
      chain(of_type(s, t));  // one stream per direction and kind

    // The first backward send/receive waits for the forward compute two
    // before the first backward compute (1F1B warm-up).
    auto first_bwd = std::find_if(comps.begin(), comps.end(),
                                  [&](int32_t op) { return m_.ops[op].type == OpType::backward_compute; });
    if (first_bwd != comps.end() && first_bwd - comps.begin() >= 2) {
      int32_t before1 = *(first_bwd - 1), before2 = *(first_bwd - 2);
      if (m_.ops[before1].type != OpType::forward_compute || m_.ops[before2].type != OpType::forward_compute)
        throw TraceError(t_.source + ": stage " + std::to_string(s) +
                         ": the two compute ops before the first backward-compute are not forward-compute");
      add_dep(find(OpType::backward_recv, 0, s), before2);
      add_dep(find(OpType::backward_send, 0, s), before2);
    }

    const bool overlapped = has_separate_;
    if (m_.use_dp) {
      chain(select(s, [](const ModelOp& o) {
        return o.type == OpType::params_all_gather || o.type == OpType::grads_reduce_scatter;
      }));
      // The first forward of a model chunk waits for its parameters.
      std::vector<int32_t> done;
      std::vector<int32_t> gathers = of_type(s, OpType::params_all_gather);
      std::sort(gathers.begin(), gathers.end(), [&](int32_t a, int32_t b) { return m_.ops[a].seq > m_.ops[b].seq; });
      for (int32_t ag : gathers) {
        int32_t mc = m_.ops[ag].mc;
        if (std::find(done.begin(), done.end(), mc) != done.end()) continue;
        int32_t first = -1;
        for (int32_t c : comps) {
          if (m_.ops[c].type == OpType::forward_compute && m_.ops[c].mc == mc &&
              (first < 0 || start0_[c] < start0_[first]))
            first = c;
        }
        add_dep(first, ag);
        done.push_back(mc);
      }
      // Overlapped gradient reduction: a chunk's reduce-scatter waits for its last backward.
      if (overlapped) {
        done.clear();
        std::vector<int32_t> scatters = of_type(s, OpType::grads_reduce_scatter);
        std::sort(scatters.begin(), scatters.end(),
                  [&](int32_t a, int32_t b) { return m_.ops[a].seq < m_.ops[b].seq; });
        for (int32_t rs : scatters) {
          int32_t mc = m_.ops[rs].mc;
          if (std::find(done.begin(), done.end(), mc) != done.end()) continue;
          int32_t last = -1;
          for (int32_t c : comps) {
            if (m_.ops[c].type == OpType::backward_compute && m_.ops[c].mc == mc &&
                (last < 0 || end0_[c] > end0_[last]))
              last = c;
          }
          add_dep(rs, last);
          done.push_back(mc);
        }
      }
    }

    // After the last compute: gc, the layernorm and embedding all-reduces,
    // the gradient reduction, gradient clipping, the optimizer step.
    if (comps.empty()) return;
    int32_t last_compute = comps.front();
    for (int32_t c : comps) {
      if (end0_[c] > end0_[last_compute]) last_compute = c;
    }
    int32_t gc = find(OpType::gc, 0, s);
    add_dep(gc, last_compute);
    int32_t after = gc >= 0 ? gc : last_compute;
    int32_t embedding = (s == 0 || s == m_.pp - 1) ? find(OpType::embedding_grads_all_reduce, 0, s) : -1;
    int32_t layernorm = find(OpType::layernorm_grads_all_reduce, 0, s);
    int32_t clip = find(OpType::optimizer_clip_main_grad, 0, s);
    int32_t optimizer = find(OpType::optimizer, 0, s);
    int32_t n_scatter = 0;
    for (int32_t rs : of_type(s, OpType::grads_reduce_scatter)) n_scatter = std::max(n_scatter, m_.ops[rs].seq + 1);
    if (!m_.use_dp) {
      chain({layernorm, embedding, clip, optimizer}, {after});
    } else if (overlapped) {
      chain({layernorm, embedding, find(OpType::separate_grads_all_reduce, 0, s), clip, optimizer},
            {find(OpType::grads_reduce_scatter, n_scatter - 1, s), after});
    } else {
      std::vector<int32_t> ops = {layernorm, embedding};
      for (int32_t i = 0; i < n_scatter; ++i) ops.push_back(find(OpType::grads_reduce_scatter, i, s));
      ops.push_back(clip);
      ops.push_back(optimizer);
      chain(ops, {after});
    }
  }

  void add_group(std::vector<int32_t> members, bool dp_sync) {
    std::erase(members, -1);
    if (members.empty()) return;
    for (int32_t op : members) m_.ops[op].group = static_cast<int32_t>(m_.groups.size());
    m_.groups.push_back({std::move(members), dp_sync});
  }

  void groups() {
    // Send/receive pairs: the k-th real forward send of stage s with the k-th
    // real forward receive of stage s+1, backward ones the other way.
    auto real = [&](int s, OpType type) {
      std::vector<int32_t> ops = of_type(s, type);
      std::erase_if(ops, [&](int32_t op) { return no_op_[op]; });
      return ops;
    };
    for (int s = 0; s < m_.pp; ++s) {
      for (int backward = 0; backward < 2; ++backward) {
        OpType send = backward ? OpType::backward_send : OpType::forward_send;
        OpType recv = backward ? OpType::backward_recv : OpType::forward_recv;
        int peer = (s + (backward ? -1 : 1) + m_.pp) % m_.pp;
        std::vector<int32_t> sends = real(s, send), recvs = real(peer, recv);
        if (sends.size() != recvs.size())
          throw TraceError(t_.source + ": stage " + std::to_string(s) + " has " + std::to_string(sends.size()) + " " +
                           std::string(optype_name(send)) + " ops, stage " + std::to_string(peer) + " " +
                           std::to_string(recvs.size()) + " " + std::string(optype_name(recv)) + " ops (step " +
                           std::to_string(ref_step_) + ")");
        for (size_t k = 0; k < sends.size(); ++k) add_group({sends[k], recvs[k]}, false);
      }
    }
    for (size_t op = 0; op < m_.ops.size(); ++op) {
      if (is_p2p(m_.ops[op].type) && no_op_[op]) add_group({static_cast<int32_t>(op)}, false);
    }
    if (m_.use_dp) {
      for (size_t op = 0; op < m_.ops.size(); ++op) {
        OpType t = m_.ops[op].type;
        if (t == OpType::params_all_gather || t == OpType::grads_reduce_scatter ||
            t == OpType::separate_grads_all_reduce)
          add_group({static_cast<int32_t>(op)}, true);
      }
    }
    std::vector<int32_t> embedding = {find(OpType::embedding_grads_all_reduce, 0, 0)};
    if (m_.pp > 1) embedding.push_back(find(OpType::embedding_grads_all_reduce, 0, m_.pp - 1));
    add_group(embedding, false);
    std::vector<int32_t> clip;
    for (int s = 0; s < m_.pp; ++s) clip.push_back(find(OpType::optimizer_clip_main_grad, 0, s));
    add_group(clip, true);
  }

  const Trace& t_;
  const Meta& meta_;
  const ModelOptions& opt_;
  Model& m_;
  std::vector<char> keep_;
  int64_t ref_step_ = 0;
  size_t nseq_ = 0;
  std::vector<int32_t> key_to_op_;
  std::vector<double> start0_, end0_;           // of each op in the reference lane
  std::vector<std::vector<int32_t>> by_stage_;  // ops of each stage in start order
  std::vector<char> no_op_;
  int vpp_ = 1;
  bool has_separate_ = false;  // overlapped DP: gradients reduced per chunk during backward
};

}  // namespace

int Model::ranks() const {
  return static_cast<int>(std::count_if(cell_rank.begin(), cell_rank.end(), [](int32_t r) { return r >= 0; }));
}

Model build_model(const Trace& trace, const Meta& meta, const ModelOptions& options) {
  if (trace.rows.empty()) throw TraceError(trace.source + ": no operations");
  Model m;
  Builder(trace, meta, options, m).build();
  return m;
}

}  // namespace ballast::straggler
