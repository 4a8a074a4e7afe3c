#include "lockstep_hang.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <set>

namespace bench_lockstep {

namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();
constexpr uint32_t kSlots = 16;
constexpr uint64_t kComm = 0x5eed;

int64_t ns(double s) { return std::llround(s * 1e9); }

// One rank's all-reduce of one step, and when its chunks move.
struct Entry {
  double enter = kNever;  // never entered
  double end = kNever;    // never ends
  double stop = kNever;   // its progress stops (a hung all-reduce)
};

struct Collective {
  std::vector<Entry> ranks;
  double all_in = kNever;  // the last rank's entry: the data starts moving
};

std::vector<Collective> collectives(const Scenario& sc, const std::vector<StepTimings>& steps) {
  const size_t n = static_cast<size_t>(sc.machines * kRanksPerMachine);
  std::mt19937_64 rng(sc.seed ^ 0x4a4e47ULL);
  std::uniform_real_distribution<double> after(0.002, 0.05);  // a peer blocks soon after the stopped rank
  std::vector<Collective> out;
  for (const StepTimings& st : steps) {
    Collective c;
    c.ranks.resize(n);
    for (const ballast_op_timing& op : st.ops) {
      if (std::strcmp(op.optype, "separate-grads-all-reduce") != 0 || op.rank < 0 || size_t(op.rank) >= n) continue;
      Entry& e = c.ranks[size_t(op.rank)];
      e.enter = op.start_s;
      e.end = std::isfinite(op.duration_s) ? op.start_s + op.duration_s : kNever;
    }
    double latest = 0;
    for (const Entry& e : c.ranks) latest = std::max(latest, e.enter);
    c.all_in = latest;
    if (st.hung)
      for (size_t r = 0; r < n; ++r) c.ranks[r].stop = int(r) == st.hung_rank ? st.stop_s : st.stop_s + after(rng);
    out.push_back(std::move(c));
  }
  return out;
}

// Rank r's ring at time t: its records of the last kSlots all-reduces it entered.
ballast::hang::RankRing ring_at(const Scenario& sc, const std::vector<Collective>& cs, size_t r, double t) {
  ballast::hang::RankRing ring;
  ballast_trace_header& h = ring.header;
  h.magic = BALLAST_TRACE_MAGIC;
  h.version = BALLAST_TRACE_VERSION;
  h.header_size = sizeof h;
  h.slot_size = sizeof(ballast_trace_slot);
  h.slot_count = kSlots;
  h.pid = 1000 + int32_t(r);
  h.rank = int32_t(r);
  h.nranks = sc.machines * kRanksPerMachine;
  h.ns_per_tick = 1;  // ticks are wall-clock ns
  std::snprintf(h.host, sizeof h.host, "%s", machine_name(int(r) / kRanksPerMachine).c_str());
  ring.path = "rank-" + std::to_string(r);
  std::vector<size_t> entered;
  for (size_t k = 0; k < cs.size(); ++k)
    if (cs[k].ranks[r].enter <= t) entered.push_back(k);
  h.head = entered.size();
  for (size_t i = entered.size() > kSlots ? entered.size() - kSlots : 0; i < entered.size(); ++i) {
    const Collective& c = cs[entered[i]];
    const Entry& e = c.ranks[r];
    ballast_trace_slot s{};
    s.gen = i + 1;
    s.comm_id = kComm;
    s.seq = entered[i] + 1;
    s.count = 1u << 24;
    s.bytes = 4u << 24;
    s.op = BALLAST_OP_ALLREDUCE;
    s.dtype = BALLAST_DT_F32;
    s.redop = BALLAST_RED_SUM;
    s.algorithm = BALLAST_ALGO_RING;
    s.rank = s.world_rank = int32_t(r);
    s.nranks = h.nranks;
    s.peer = s.wait_peer = s.send_peer = -1;
    s.issue_tick = s.start_tick = uint64_t(ns(e.enter));
    s.chunks_total = 2 * uint64_t(h.nranks - 1);
    s.steps = uint32_t(s.chunks_total);
    if (e.end <= t) {
      s.state = BALLAST_TRACE_DONE;
      s.end_tick = s.progress_tick = uint64_t(ns(e.end));
      s.chunks_sent = s.chunks_received = s.chunks_total / 2;
      s.step = s.steps;
    } else {
      s.state = BALLAST_TRACE_STARTED;
      // Chunks move once every rank is in, until it ends or stops.
      double moved = std::min({t, e.stop, e.end});
      if (moved > c.all_in) {
        double span = std::isfinite(e.end) ? e.end - c.all_in : 1.0;
        double done = std::min(1.0, (moved - c.all_in) / span);
        s.chunks_sent = s.chunks_received = uint64_t(done * double(s.chunks_total / 2));
        s.step = uint32_t(done * s.steps);
        s.progress_tick = uint64_t(ns(moved));
        // A hung all-reduce still moves a chunk a millisecond until it stops.
        if (!std::isfinite(e.end)) s.chunks_sent = s.chunks_received = uint64_t((moved - c.all_in) * 1000);
      } else {
        s.wait_peer = int32_t((r + size_t(h.nranks) - 1) % size_t(h.nranks));  // the ring's previous rank
      }
    }
    ring.records.push_back(s);
  }
  return ring;
}

}  // namespace

std::vector<HangReport> run_hang(const Scenario& sc, const std::vector<StepTimings>& steps, double period_s,
                                 double stall_s) {
  std::vector<Collective> cs = collectives(sc, steps);
  const size_t n = static_cast<size_t>(sc.machines * kRanksPerMachine);
  std::vector<HangReport> out;
  uint64_t signature = 0;
  double last_change = 0;
  std::set<std::pair<uint64_t, uint64_t>> reported;
  for (double t = kEpochS; t <= kEpochS + sc.seconds; t += period_s) {
    std::vector<ballast::hang::RankRing> rings;
    rings.reserve(n);
    for (size_t r = 0; r < n; ++r) rings.push_back(ring_at(sc, cs, r, t));
    uint64_t sig = ballast::hang::progress_signature(rings);
    if (sig != signature) {
      signature = sig;
      last_change = t;
      if (!ballast::hang::any_failed(rings)) continue;
    }
    bool stalled = ballast::hang::in_flight(rings) && t - last_change >= stall_s;
    if (!stalled && !ballast::hang::any_failed(rings)) continue;
    ballast::hang::Verdict v = ballast::hang::analyze(rings, ballast::hang::Options{});
    if (v.verdict == "healthy" || v.causes.empty() || !reported.insert({v.comm_id, v.seq}).second) continue;
    for (const auto& c : v.causes) out.push_back({t, c, v.last_progress_ns ? v.last_progress_ns : ns(last_change)});
  }
  return out;
}

}  // namespace bench_lockstep
