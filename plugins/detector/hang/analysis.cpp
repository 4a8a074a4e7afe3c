#include "analysis.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <ctime>
#include <iterator>
#include <map>
#include <set>
#include <tuple>

namespace ballast::hang {

namespace {

int64_t wall_now() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

std::string hex(uint64_t v) {
  char b[32];
  std::snprintf(b, sizeof b, "%016" PRIx64, v);
  return b;
}

bool unfinished(const ballast_trace_slot& s) {
  return s.state == BALLAST_TRACE_STARTED || s.state == BALLAST_TRACE_ISSUED;
}

std::string call(const ballast_trace_slot& s) {
  std::string t =
      std::string(ballast_op_name(s.op)) + "(" + std::to_string(s.count) + " x " + ballast_dtype_name(s.dtype);
  if (s.op == BALLAST_OP_ALLREDUCE || s.op == BALLAST_OP_REDUCE || s.op == BALLAST_OP_REDUCE_SCATTER)
    t += std::string(", ") + ballast_redop_name(s.redop);
  if (s.peer >= 0) t += ", root " + std::to_string(s.peer);
  return t + ")";
}

// What a rank called, as compared across ranks at one seq.
struct CallKey {
  uint32_t op, dtype, redop;
  uint64_t count;
  int32_t peer;
  auto operator<=>(const CallKey&) const = default;
  std::string words() const {
    ballast_trace_slot s{};
    s.op = op;
    s.dtype = dtype;
    s.redop = redop;
    s.count = count;
    s.peer = peer;
    return call(s);
  }
};

CallKey key_of(const ballast_trace_slot& s) {
  const bool reduces = s.op == BALLAST_OP_ALLREDUCE || s.op == BALLAST_OP_REDUCE || s.op == BALLAST_OP_REDUCE_SCATTER;
  return {s.op, s.dtype, reduces ? s.redop : 0, s.count, s.peer};  // a redop only counts where it is used
}

std::string ranks_list(const std::vector<int>& v) {
  std::string s;
  for (int r : v) s += (s.empty() ? "" : ",") + std::to_string(r);
  return s;
}

std::string seconds(int64_t ns) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f s", double(ns) / 1e9);
  return b;
}

struct Member {
  const RankRing* ring;
  const ballast_trace_slot* last;  // the collective record it is in on the communicator (see analyze)
  int64_t progress_ns;             // wall time of its last progress in it
};

int64_t last_progress(const RankRing& r, const ballast_trace_slot& s) {
  uint64_t t = std::max(s.start_tick, s.progress_tick);
  if (s.end_tick) t = std::max(t, s.end_tick);
  return r.wall_ns(t);
}

std::string progress_words(const ballast_trace_slot& s) {
  std::string w = "step " + std::to_string(s.step) + " of " + std::to_string(s.steps) + ", chunks sent " +
                  std::to_string(s.chunks_sent) + " received " + std::to_string(s.chunks_received) + " of " +
                  std::to_string(s.chunks_total);
  if (s.wait_peer >= 0) w += ", waiting for data from comm rank " + std::to_string(s.wait_peer);
  return w;
}

// doing: what live processes do (activity()), by pid.
Cause lagging_cause(const Member& m, uint64_t seq, const std::string& op, int64_t now,
                    const std::map<int32_t, std::string>& doing) {
  Cause c;
  c.rank = m.ring->header.rank;
  const ProcState st = m.ring->state;
  const std::string where = m.last ? "its last collective here is seq " + std::to_string(m.last->seq) + " (" +
                                         ballast_op_name(m.last->op) + ")"
                                   : "it never entered a collective of this communicator";
  const std::string pid = "pid " + std::to_string(m.ring->header.pid);
  if (st == ProcState::gone && !m.ring->header.closed) {
    c.kind = "crashed";
    c.evidence = "process " + pid + " is gone without shutting down; " + where + ", the others wait in seq " +
                 std::to_string(seq) + " (" + op + ")";
  } else if (st == ProcState::stopped) {
    c.kind = "stuck";
    c.evidence = "process " + pid + " is stopped (SIGSTOP or a debugger); " + where + ", the others wait in seq " +
                 std::to_string(seq) + " (" + op + ") for " + seconds(now - m.progress_ns);
  } else {
    c.kind = "not_joined";
    const auto d = doing.find(m.ring->header.pid);
    c.evidence = "process " + pid + " is " + (d != doing.end() ? d->second : proc_state_name(st)) +
                 (m.ring->header.closed ? " (shut down)" : "") + " but did not join seq " + std::to_string(seq) + " (" +
                 op + "): " + where;
  }
  return c;
}

// A rank that enters the collectives of a communicator late, again and again.
bool find_slow(const std::vector<RankRing>& rings, const Options& opt, Verdict* v) {
  // comm -> seq -> (world rank -> start wall ns)
  std::map<uint64_t, std::map<uint64_t, std::map<int, int64_t>>> starts;
  std::map<uint64_t, int> nranks;
  for (const auto& r : rings)
    for (const auto& s : r.records) {
      if ((s.flags & BALLAST_TRACE_P2P) || s.state != BALLAST_TRACE_DONE) continue;
      starts[s.comm_id][s.seq][r.header.rank] = r.wall_ns(s.start_tick);
      nranks[s.comm_id] = s.nranks;
    }
  for (const auto& [comm, seqs] : starts) {
    std::map<int, int> late;  // rank -> times it was last by more than slow_ms
    std::map<int, double> lag;
    int complete = 0;
    for (const auto& [seq, by_rank] : seqs) {
      if (int(by_rank.size()) != nranks[comm] || by_rank.size() < 2) continue;
      ++complete;
      std::vector<int64_t> t;
      for (const auto& [rank, ns] : by_rank) t.push_back(ns);
      std::sort(t.begin(), t.end());
      const int64_t median = t[t.size() / 2];
      for (const auto& [rank, ns] : by_rank)
        if (double(ns - median) / 1e6 > opt.slow_ms) {
          ++late[rank];
          lag[rank] += double(ns - median) / 1e6;
        }
    }
    for (const auto& [rank, times] : late)
      if (complete >= 3 && times * 2 > complete) {
        v->verdict = "slow";
        v->comm_id = comm;
        v->causes.push_back({rank, "slow",
                             "entered " + std::to_string(times) + " of the last " + std::to_string(complete) +
                                 " collectives on average " + std::to_string(int64_t(lag[rank] / times)) +
                                 " ms after the median rank"});
      }
    if (!v->causes.empty()) return true;
  }
  return false;
}

}  // namespace

bool in_flight(const std::vector<RankRing>& rings) {
  for (const auto& r : rings)
    for (const auto& s : r.records)
      if (unfinished(s)) return true;
  return false;
}

bool any_failed(const std::vector<RankRing>& rings) {
  for (const auto& r : rings)
    for (const auto& s : r.records)
      if (s.state == BALLAST_TRACE_FAILED) return true;
  return false;
}

uint64_t progress_signature(const std::vector<RankRing>& rings) {
  uint64_t h = 1469598103934665603ULL;
  auto add = [&h](uint64_t x) { h = (h ^ x) * 1099511628211ULL; };
  for (const auto& r : rings) {
    add(r.header.head);
    for (const auto& s : r.records)
      if (unfinished(s)) {
        add(s.chunks_sent);
        add(s.chunks_received);
        add(s.step);
      }
  }
  return h;
}

int64_t last_progress_ns(const std::vector<RankRing>& rings) {
  int64_t last = 0;
  for (const auto& r : rings)
    for (const auto& s : r.records) {
      const uint64_t tick = std::max({s.issue_tick, s.start_tick, s.progress_tick, s.end_tick});
      if (tick) last = std::max(last, r.wall_ns(tick));
    }
  return last;
}

namespace {

using Members = std::map<int, Member>;  // by rank

void ring_warnings(const std::vector<RankRing>& rings, Verdict* v) {
  for (const auto& r : rings) {
    if (r.overflow)
      v->warnings.push_back(r.path + ": " + std::to_string(r.overflow) + " older records were overwritten");
    if (r.dropped)
      v->warnings.push_back(r.path + ": " + std::to_string(r.dropped) +
                            " operations went unrecorded, every slot holding one in flight");
  }
}

// Where every rank is on every communicator: its last collective record,
// except collectives queued behind the one it runs or failed in (issued, or
// failed with it, never started): the rank is in that one.
std::map<uint64_t, Members> where_ranks_are(const std::vector<RankRing>& rings) {
  std::map<uint64_t, Members> comms;
  for (const auto& r : rings)
    for (const auto& s : r.records) {
      if (s.flags & BALLAST_TRACE_P2P) continue;
      auto [at, fresh] = comms[s.comm_id].try_emplace(r.header.rank);
      const bool never_ran = s.state == BALLAST_TRACE_ISSUED || (s.state == BALLAST_TRACE_FAILED && s.start_tick == 0);
      const ballast_trace_slot* in = at->second.last;
      if (!fresh && never_ran && (unfinished(*in) || in->state == BALLAST_TRACE_FAILED)) continue;
      at->second = Member{&r, &s, last_progress(r, s)};
    }
  return comms;
}

// The communicator in trouble: the one whose oldest unfinished or failed
// operation started first; 0 when none.
uint64_t troubled_comm(const std::map<uint64_t, Members>& comms) {
  uint64_t bad = 0;
  int64_t oldest = INT64_MAX;
  for (const auto& [id, members] : comms)
    for (const auto& [rank, m] : members)
      if (unfinished(*m.last) || m.last->state == BALLAST_TRACE_FAILED) {
        const int64_t t = m.ring->wall_ns(m.last->start_tick ? m.last->start_tick : m.last->issue_tick);
        if (t < oldest) {
          oldest = t;
          bad = id;
        }
      }
  return bad;
}

// No communicator in trouble: a process gone outside any collective, else
// the slow ranks.
void outside_collectives(const std::vector<RankRing>& rings, const Options& opt, Verdict* v) {
  for (const auto& r : rings)
    if (r.state == ProcState::gone && !r.header.closed) {
      v->verdict = "hang";
      v->causes.push_back({r.header.rank, "crashed",
                           "process pid " + std::to_string(r.header.pid) +
                               " is gone without shutting down its communicators (outside any collective)"});
    }
  if (v->causes.empty()) find_slow(rings, opt, v);
}

// 1. Ranks in different operations at the same sequence number: the
// earliest such seq still in the rings. Not only the last records: a rank
// may have passed the mismatched one (the root of a broadcast is done once
// its sends are out) and now waits in the next, which alone would look like
// the others lagging. Returns whether it found one.
bool find_mismatch(const std::vector<RankRing>& rings, uint64_t bad, int nranks, Verdict* v) {
  std::map<uint64_t, std::map<CallKey, std::vector<int>>> by_seq;  // seq -> call -> ranks
  for (const auto& r : rings)
    for (const auto& s : r.records)
      if (s.comm_id == bad && !(s.flags & BALLAST_TRACE_P2P)) by_seq[s.seq][key_of(s)].push_back(r.header.rank);
  // A rank told of the failure before it entered that seq has no record of
  // it, so the groups there may tie (rank 0 alone against rank 2 alone), or
  // the culprits outnumber the ranks left (two broadcasts against one
  // allreduce of 4 ranks): unless a group holds most of the communicator's
  // ranks, the call the most ranks made at the seq before is the job's, as a
  // training loop repeats its collectives; then the larger group, then the
  // group with the lowest rank.
  auto most_called = [](const std::map<CallKey, std::vector<int>>& calls) {
    auto best = calls.begin();
    for (auto it = calls.begin(); it != calls.end(); ++it)
      if (it->second.size() > best->second.size()) best = it;
    return best->first;
  };
  for (auto at = by_seq.begin(); at != by_seq.end(); ++at) {
    const auto& [seq, calls] = *at;
    if (calls.size() < 2) continue;
    v->verdict = "mismatch";
    v->seq = seq;
    const bool after_one = at != by_seq.begin() && std::prev(at)->first == seq - 1;
    const CallKey job_call = after_one ? most_called(std::prev(at)->second) : CallKey{};
    auto usual = [&](const CallKey& k) { return after_one && k == job_call; };
    // The culprits are the ranks outside the job's group.
    auto standing = [&](const std::pair<const CallKey, std::vector<int>>& group) {
      const int size = int(group.second.size());
      return std::make_tuple(2 * size > nranks, usual(group.first), size, -group.second.front());
    };
    auto majority = calls.begin();
    for (auto it = calls.begin(); it != calls.end(); ++it)
      if (standing(*it) > standing(*majority)) majority = it;
    v->op = ballast_op_name(majority->first.op);
    for (const auto& [k, ranks] : calls) {
      if (k == majority->first) continue;
      for (int r : ranks)
        v->causes.push_back({r, "mismatch",
                             "called " + k.words() + " at seq " + std::to_string(seq) + " where rank(s) " +
                                 ranks_list(majority->second) + " called " + majority->first.words()});
    }
    return true;
  }
  return false;
}

// 2. Ranks that never entered the operation the others wait in. A live rank
// still in an earlier operation, or failed in it, was held up by the fault
// (told of it, its link to the faulty rank broken, or still waiting for data
// that rank sent before it died): it is named only when no other rank lags
// for a reason of its own. Returns whether it named one.
bool find_laggards(const std::vector<RankRing>& rings, const Members& members, uint64_t max_seq, int nranks,
                   const std::string& op, int64_t now, Verdict* v) {
  std::vector<Member> lagging;
  for (const auto& r : rings) {
    auto it = members.find(r.header.rank);
    const bool member_world = int(rings.size()) == nranks;  // rings without a record count only for the world
    if (it == members.end()) {
      if (member_world) lagging.push_back(Member{&r, nullptr, 0});
    } else if (it->second.last->seq < max_seq) {
      lagging.push_back(it->second);
    }
  }
  // A live laggard may be busy outside the collective (an endless loop) or
  // sleeping (waiting on something else): its CPU time over a short window
  // tells which, for the evidence.
  std::vector<const RankRing*> alive;
  for (const Member& m : lagging)
    if (m.ring->state == ProcState::alive) alive.push_back(m.ring);
  const auto doing = activity(alive, std::chrono::milliseconds(100));
  std::vector<Cause> held_up;
  for (const Member& m : lagging) {
    Cause c = lagging_cause(m, max_seq, op, now, doing);
    if (c.kind == "not_joined" && m.last && (m.last->state == BALLAST_TRACE_FAILED || unfinished(*m.last)))
      held_up.push_back(c);
    else
      v->causes.push_back(c);
  }
  if (v->causes.empty()) v->causes = std::move(held_up);
  if (v->causes.empty()) return false;
  v->last_progress_ns = 0;
  for (const auto& [rank, m] : members)
    if (m.last->seq == max_seq)
      v->last_progress_ns = std::max(v->last_progress_ns, m.ring->wall_ns(m.last->start_tick));
  return true;
}

// 3. Everyone entered: a process that died or stopped in it, else the rank
// whose progress stopped first.
void find_stalled(const Members& members, uint64_t max_seq, const std::string& op, int64_t now, Verdict* v) {
  for (const auto& [rank, m] : members) {
    const std::string pid = "pid " + std::to_string(m.ring->header.pid);
    if (m.ring->state == ProcState::gone && !m.ring->header.closed)
      v->causes.push_back({rank, "crashed",
                           "process " + pid + " is gone in the middle of seq " + std::to_string(max_seq) + " (" + op +
                               "): " + progress_words(*m.last)});
    else if (m.ring->state == ProcState::stopped)
      v->causes.push_back({rank, "stuck",
                           "process " + pid + " is stopped in the middle of seq " + std::to_string(max_seq) + " (" +
                               op + "): " + progress_words(*m.last)});
  }
  if (!v->causes.empty()) return;
  const Member* first = nullptr;
  for (const auto& [rank, m] : members)
    if (!first || m.progress_ns < first->progress_ns) first = &m;
  Cause c{first->ring->header.rank, "slow",
          "its progress in seq " + std::to_string(max_seq) + " (" + op + ") stopped first, " +
              seconds(now - first->progress_ns) + " ago, while its process is " + proc_state_name(first->ring->state) +
              ": " + progress_words(*first->last)};
  // The link, when the rank it waits for is itself still sending to it: the
  // data is on its way between two live ranks in the same operation.
  const ballast_trace_slot& waiting = *first->last;
  for (const auto& [rank, m] : members)
    if (waiting.wait_peer >= 0 && m.last->rank == waiting.wait_peer && m.last->seq == max_seq && unfinished(*m.last) &&
        m.last->send_peer == waiting.rank) {
      c.peer = rank;
      c.evidence = "the link from rank " + std::to_string(rank) + " to rank " + std::to_string(c.rank) +
                   " stalled first: rank " + std::to_string(rank) +
                   " still sends to it and it still waits for that data; " + c.evidence;
    }
  v->causes.push_back(c);
}

}  // namespace

Verdict analyze(const std::vector<RankRing>& rings, const Options& opt) {
  Verdict v;
  v.ranks = int(rings.size());
  const int64_t now = wall_now();
  ring_warnings(rings, &v);
  std::map<uint64_t, Members> comms = where_ranks_are(rings);
  const uint64_t bad = troubled_comm(comms);
  if (!bad) {
    outside_collectives(rings, opt, &v);
    return v;
  }

  const Members& members = comms[bad];
  uint64_t max_seq = 0;
  int nranks = 0;
  for (const auto& [rank, m] : members) {
    max_seq = std::max(max_seq, m.last->seq);
    nranks = std::max(nranks, int(m.last->nranks));
  }
  const Member* ref = nullptr;
  for (const auto& [rank, m] : members)
    if (m.last->seq == max_seq && (!ref || unfinished(*m.last))) ref = &m;
  v.comm_id = bad;
  v.seq = max_seq;
  v.op = ballast_op_name(ref->last->op);
  for (const auto& [rank, m] : members) v.last_progress_ns = std::max(v.last_progress_ns, m.progress_ns);

  if (find_mismatch(rings, bad, nranks, &v)) return v;
  v.verdict = "hang";
  const std::string op = ref ? call(*ref->last) : "?";
  if (find_laggards(rings, members, max_seq, nranks, op, now, &v)) return v;
  find_stalled(members, max_seq, op, now, &v);
  return v;
}

std::string Verdict::to_json() const {
  nlohmann::json j;
  j["verdict"] = verdict;
  j["communicator"] = comm_id ? nlohmann::json(hex(comm_id)) : nlohmann::json(nullptr);
  j["seq"] = seq;
  j["op"] = op.empty() ? nlohmann::json(nullptr) : nlohmann::json(op);
  j["ranks"] = ranks;
  j["root_cause"] = nlohmann::json::array();
  for (const auto& c : causes) {
    nlohmann::json one = {{"rank", c.rank}, {"kind", c.kind}, {"evidence", c.evidence}};
    if (c.peer >= 0) one["link"] = {c.peer, c.rank};  // from, to
    j["root_cause"].push_back(one);
  }
  if (last_progress_ns) j["stalled_for_s"] = double(wall_now() - last_progress_ns) / 1e9;
  j["warnings"] = warnings;
  return j.dump();
}

std::string Verdict::to_text() const {
  std::string t = "verdict: " + verdict;
  if (comm_id) t += " in communicator " + hex(comm_id) + " at seq " + std::to_string(seq) + " (" + op + ")";
  t += "\n";
  for (const auto& c : causes)
    t += "  rank " + std::to_string(c.rank) + (c.peer >= 0 ? " (link from rank " + std::to_string(c.peer) + ")" : "") +
         ": " + c.kind + ": " + c.evidence + "\n";
  for (const auto& w : warnings) t += "  warning: " + w + "\n";
  return t;
}

std::string chrome_trace(const std::vector<RankRing>& rings) {
  // The trace event format wants integer pids and tids: a rank is a
  // process, a communicator a thread numbered 1, 2, ... in the order of its
  // id, the same in every rank; the metadata events give their names.
  std::map<uint64_t, int> tids;
  for (const auto& r : rings)
    for (const auto& s : r.records) tids.emplace(s.comm_id, 0);
  int next = 0;
  for (auto& [id, tid] : tids) tid = ++next;
  nlohmann::json events = nlohmann::json::array();
  const int64_t now = wall_now();
  for (const auto& r : rings) {
    const int rank = r.header.rank;
    events.push_back(
        {{"name", "process_name"},
         {"ph", "M"},
         {"pid", rank},
         {"args", {{"name", "rank " + std::to_string(rank) + " (pid " + std::to_string(r.header.pid) + ")"}}}});
    std::set<uint64_t> named;
    for (const auto& s : r.records) {
      const int tid = tids.at(s.comm_id);
      if (named.insert(s.comm_id).second)
        events.push_back({{"name", "thread_name"},
                          {"ph", "M"},
                          {"pid", rank},
                          {"tid", tid},
                          {"args",
                           {{"name", "communicator " + hex(s.comm_id) + " (rank " + std::to_string(s.rank) + " of " +
                                         std::to_string(s.nranks) + ")"}}}});
      nlohmann::json args = {{"seq", s.seq},
                             {"bytes", s.bytes},
                             {"count", s.count},
                             {"dtype", ballast_dtype_name(s.dtype)},
                             {"state", s.state == BALLAST_TRACE_DONE     ? "done"
                                       : s.state == BALLAST_TRACE_FAILED ? "failed"
                                       : s.state == BALLAST_TRACE_ISSUED ? "issued"
                                                                         : "in flight"},
                             {"status", s.status},
                             {"peer", s.peer},
                             {"chunks_sent", s.chunks_sent},
                             {"chunks_received", s.chunks_received},
                             {"chunks_total", s.chunks_total}};
      if (s.start_tick == 0) {
        // Queued behind another collective and never run (still waiting, or
        // ended by that one's failure): a mark where it was issued. A span
        // would overlap the running one on the same thread.
        events.push_back({{"name", std::string(ballast_op_name(s.op)) + " (not started)"},
                          {"ph", "i"},
                          {"s", "t"},
                          {"ts", double(r.wall_ns(s.issue_tick)) / 1e3},
                          {"pid", rank},
                          {"tid", tid},
                          {"args", args}});
        continue;
      }
      const int64_t start = r.wall_ns(s.start_tick);
      const int64_t end = s.end_tick ? r.wall_ns(s.end_tick) : std::max(start, now);
      if (s.issue_tick && s.issue_tick < s.start_tick)  // it waited in the queue for the collectives before it
        args["queued_us"] = double(start - r.wall_ns(s.issue_tick)) / 1e3;
      events.push_back({{"name", ballast_op_name(s.op)},
                        {"cat", ballast_algorithm_name(s.algorithm)},
                        {"ph", "X"},
                        {"ts", double(start) / 1e3},
                        {"dur", double(end - start) / 1e3},
                        {"pid", rank},
                        {"tid", tid},
                        {"args", args}});
    }
  }
  return nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ns"}}.dump();
}

}  // namespace ballast::hang
