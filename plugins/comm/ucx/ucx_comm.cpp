// The engine's API and its running half: operations posted, progressed and
// completed under a deadline, failures noticed and told to the peers, trace
// records written; communicators created, split, aborted and destroyed.
#include "engine.hpp"
#include "host_error.hpp"

#include "proc_stat.hpp"
#include "reduce.hpp"

#include <poll.h>
#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <csignal>
#include <cstdio>

namespace ballast::comm {

namespace {

thread_local std::string t_error;

std::string low_name(uint32_t low) {
  const uint32_t op = (low >> 8) & 0xF, dt = (low >> 4) & 0xF, red = low & 0xF;
  std::string s = std::string(ballast_op_name(op)) + "(" + ballast_dtype_name(dt);
  if (op == BALLAST_OP_ALLREDUCE || op == BALLAST_OP_REDUCE || op == BALLAST_OP_REDUCE_SCATTER)
    s += std::string(", ") + ballast_redop_name(red);
  return s + ")";
}

std::string hex(uint64_t v) {
  char b[32];
  std::snprintf(b, sizeof b, "%016" PRIx64, v);
  return b;
}

// The scheduler state of a local process: 'R', 'S', 'T' (stopped), 'Z', ... or 0 when gone.
char proc_state(int pid) {
  util::ProcStat s;
  return util::read_proc_stat(pid, &s) ? s.state : 0;
}

std::string state_words(char st) {
  switch (st) {
    case 0:
      return "gone";
    case 'T':
    case 't':
      return "stopped";
    case 'Z':
    case 'X':
      return "exited (zombie)";
    case 'R':
      return "running";
    case 'D':
      return "in uninterruptible I/O";
    default:
      return "alive, sleeping";
  }
}

}  // namespace

const char* last_error() { return t_error.c_str(); }
int set_last_error(int status, const std::string& msg) {
  t_error = msg;
  if (status != BALLAST_OK) report_error(msg);
  return status;
}

namespace {

uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  return x ^ (x >> 33);
}

// The control receive's completion, run inside ucp_worker_progress (or
// ucp_tag_recv_nbx itself): start and the rounds of progress then test a
// flag rather than call into UCX (an 8-byte allreduce 2,259 -> 2,215
// instructions, callgrind). A cancelled one (its communicator being
// destroyed) touches nothing.
void control_done(void*, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user) {
  if (status == UCS_ERR_CANCELED) return;
  Comm* c = static_cast<Comm*>(user);
  c->ctrl_status = status;
  if (status == UCS_OK) c->ctrl_info = *info;
  c->ctrl_arrived = true;
}

void post_control_recv(Comm* c) {
  ucp_request_param_t prm{};
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  prm.cb.recv = control_done;
  prm.user_data = c;
  void* r = ucp_tag_recv_nbx(c->w->worker, c->ctrl_in, sizeof c->ctrl_in - 1, make_tag(kSeqControl, 0, c->ctx, 0),
                             kControlMask, &prm);
  c->ctrl_req = UCS_PTR_IS_ERR(r) ? nullptr : r;
}

// A failure notice from a peer, if one arrived: fills *msg.
bool control_arrived(Comm* c, std::string* msg) {
  if (!c->ctrl_arrived) return false;
  c->ctrl_arrived = false;
  ucp_request_free(c->ctrl_req);
  c->ctrl_req = nullptr;
  if (c->ctrl_status != UCS_OK) return false;
  const size_t len = std::min(c->ctrl_info.length, sizeof c->ctrl_in - 1);
  c->ctrl_in[len] = '\0';
  const int from = int((c->ctrl_info.sender_tag >> 24) & 0xFFFF);
  *msg = "rank " + std::to_string(from) + " reported a failure: " + c->ctrl_in;
  return true;
}

void send_notices(Comm* c, const std::string& msg) {
  const size_t len = std::min(msg.size(), sizeof c->notice - 1);
  std::memcpy(c->notice, msg.data(), len);
  std::vector<void*> pending;
  for (int r = 0; r < c->n; ++r) {
    if (r == c->rank || c->peer(r).ep_status != UCS_OK) continue;
    ucp_request_param_t prm{};
    void* q =
        ucp_tag_send_nbx(c->peer(r).ep, c->notice, len, make_tag(kSeqControl, uint32_t(c->rank), c->ctx, 0), &prm);
    if (q && !UCS_PTR_IS_ERR(q)) pending.push_back(q);
  }
  // Push the notices out before returning: the caller often exits right
  // after a failure, and an endpoint never used before still needs wiring.
  const int64_t until = monotonic_ns() + 200000000;
  for (void* q : pending) {
    while (ucp_request_check_status(q) == UCS_INPROGRESS && monotonic_ns() < until) ucp_worker_progress(c->w->worker);
    ucp_request_free(q);
  }
  c->w->notices_sent_ns = monotonic_ns();
}

template <class T>
inline void put(T* p, T v) {
  __atomic_store_n(p, v, __ATOMIC_RELAXED);
}

// The counters that move while an operation runs, into its trace slot.
[[gnu::always_inline]] inline void put_counters(ballast_trace_slot* s, const Op& op) {
  put(&s->chunks_posted, op.chunks_posted);
  put(&s->chunks_sent, op.chunks_sent);
  put(&s->chunks_received, op.chunks_received);
  put(&s->chunks_reduced, op.chunks_reduced);
  put(&s->bytes_sent, op.bytes_sent);
  put(&s->bytes_received, op.bytes_received);
}

// Copy the operation's progress into its trace slot.
void flush_progress(Op& op) {
  ballast_trace_slot* s = op.slot;
  put(&s->chunks_total, op.chunks_total);
  put_counters(s, op);
  put(&s->steps, uint32_t(op.steps.size()));
  put(&s->step, uint32_t(std::min(op.cur + 1, op.steps.size())));
  int wp = -1, sp = -1;
  if (op.cur < op.steps.size())
    for (uint32_t i = op.steps[op.cur].first; i < op.steps[op.cur].last; ++i) {
      const Xfer& x = op.xfers[i];
      if (x.completed == x.nchunks) continue;
      if (x.send && sp < 0) sp = x.peer;
      if (!x.send && wp < 0) wp = x.peer;
    }
  put(&s->wait_peer, int32_t(wp));
  put(&s->send_peer, int32_t(sp));
}

// Every 100 us of a running operation (looked at every 64 rounds of
// progress): the counters into the record, and its progress time moved to
// now if chunks moved since the last refresh. Hang analysis reads that time
// in milliseconds; a refresh per chunk cost 16 ns each (12 chunks in a
// 4-rank 64 KiB ring) for no better verdict, and one every 64 rounds cost a
// 2-rank 8-byte allreduce 10-25 ns (it spins some 100 rounds for its peer).
constexpr int64_t kRefreshNs = 100000;
void refresh_progress(Op& op, int64_t now) {
  op.next_refresh = now + kRefreshNs;
  flush_progress(op);
  const uint64_t moved = op.chunks_sent + op.chunks_received;
  if (moved == op.chunks_at_refresh) return;
  op.chunks_at_refresh = moved;
  put(&op.slot->progress_tick, std::max(uint64_t(now), op.start_tick));
}

// Cancel the receives still waiting, then let what UCX already started run
// out (up to 200 ms) before the requests are released: a receive already
// matched to a rendezvous cannot be cancelled, and a worker destroyed while
// its read is queued on the cma transport aborts the process in UCX 1.13
// (seen in the mismatch tests, which fail with receives of later ring steps
// posted).
void cancel_pending(Op& op) {
  ucp_worker_h worker = op.comm->w->worker;
  std::vector<void*> reqs;
  for (auto& x : op.xfers)
    for (size_t k = x.completed; k < x.posted; ++k) {
      Pending& p = x.win[k % kWindow];
      if (!p.req) continue;
      if (!x.send) ucp_request_cancel(worker, p.req);
      reqs.push_back(p.req);
      p.req = nullptr;
    }
  const int64_t until = monotonic_ns() + 200000000;
  for (void* r : reqs) {
    while (ucp_request_check_status(r) == UCS_INPROGRESS && monotonic_ns() < until) ucp_worker_progress(worker);
    ucp_request_free(r);
  }
  op.xfers.clear();
  op.planned = false;
}

// The record's end: its status, end time and final state.
[[gnu::always_inline]] inline void end_record(Op& op, int status) {
  op.slot->status = status;
  // Neither the coarse clock (a step behind) nor the TSC one (re-anchored
  // now and then) may put the end before the start.
  const uint64_t end = std::max(op.exact_ticks ? op.comm->clock.now() : trace_tick_coarse(), op.start_tick);
  __atomic_store_n(&op.slot->end_tick, end, __ATOMIC_RELAXED);
  __atomic_store_n(&op.slot->state, status == BALLAST_OK ? BALLAST_TRACE_DONE : BALLAST_TRACE_FAILED, __ATOMIC_RELEASE);
  op.slot = nullptr;
}

int finish(Op& op, int status, const std::string& msg, bool notify) {
  Comm* c = op.comm;
  // Before the transfers are dropped; an operation that posted nothing (one
  // rank, or empty) has nothing to add to what comm_start wrote.
  if (op.slot && op.chunks_posted) flush_progress(op);
  if (status != BALLAST_OK) {
    cancel_pending(op);
    if (c->failed == BALLAST_OK) {
      c->failed = status;
      c->failed_msg = msg;
      if (notify && c->n > 1) send_notices(c, msg);
    }
  }
  if (op.slot) end_record(op, status);
  op.status = status;
  op.msg = msg;
  op.done = true;
  return status;
}

}  // namespace

std::string op_words(const Op& op) {
  const Comm* c = op.comm;
  return std::string(ballast_op_name(op.args.op)) + " seq " + std::to_string(op.seq) + " (comm " + hex(c->id) +
         ", rank " + std::to_string(c->rank) + " of " + std::to_string(c->n) + ", " + std::to_string(op.args.count) +
         " x " + ballast_dtype_name(op.args.dtype) + ")";
}

namespace {

// ---- running the steps ----------------------------------------------------

// A peer that failed first usually said why before its end broke our
// transfer: report that root cause rather than the transport's symptom.
int fail_peer(Op& op, const std::string& msg) {
  std::string notice;
  const int64_t until = monotonic_ns() + 50000000;
  while (monotonic_ns() < until) {
    ucp_worker_progress(op.comm->w->worker);
    if (control_arrived(op.comm, &notice)) return finish(op, BALLAST_EPEER, op_words(op) + " failed: " + notice, false);
  }
  return finish(op, BALLAST_EPEER, msg, true);
}

// Why the transport failed with a peer: for a peer on this host whose
// process is gone, that (the cause), with UCX's status after it; otherwise
// `what` and UCX's status ("Endpoint timeout" is what UCX 1.13 says over tcp
// when the peer's process was killed).
std::string peer_failure(const Op& op, int peer, const std::string& what, ucs_status_t st) {
  const PeerState& ps = op.comm->peer(peer);
  const char state = ps.local ? proc_state(ps.pid) : 'S';
  if (state == 0 || state == 'Z' || state == 'X')
    return op_words(op) + ": rank " + std::to_string(peer) + " (pid " + std::to_string(ps.pid) +
           ") is gone: the process exited or was killed (UCX: " + ucs_status_string(st) + ")";
  return op_words(op) + ": " + what + ": " + ucs_status_string(st);
}

int post_chunk(Op& op, Xfer& x) {
  Comm* c = op.comm;
  const size_t k = x.posted;
  Pending& p = x.win[k % kWindow];
  p.off = k * op.chunk;
  p.len = x.len == 0 ? 0 : std::min(op.chunk, x.len - p.off);
  if (!x.staged)
    p.at = x.buf + p.off;
  else if (op.ring)
    p.at = x.buf + (op.recvs_posted % kWindow) * op.slot_bytes;
  else
    p.at = x.buf + (k % kWindow) * op.chunk;
  p.req = nullptr;
  p.done_now = false;
  ucp_request_param_t prm{};
  void* r;
  if (x.send) {
    r = ucp_tag_send_nbx(c->peer(x.peer).ep, p.at, p.len, make_tag(op.seq, uint32_t(c->rank), op.tag_ctx, op.low),
                         &prm);
  } else {
    // Always a request: UCX 1.13 leaves recv_info unset on immediate completion.
    prm.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    r = ucp_tag_recv_nbx(c->w->worker, p.at, p.len, make_tag(op.seq, uint32_t(x.peer), op.tag_ctx, 0), kMatchMask,
                         &prm);
  }
  if (UCS_PTR_IS_ERR(r))  // a peer that failed first has likely said why: fail_peer looks
    return fail_peer(op, peer_failure(op, x.peer,
                                      std::string("cannot ") + (x.send ? "send to" : "receive from") + " rank " +
                                          std::to_string(x.peer),
                                      UCS_PTR_STATUS(r)));
  if (r)
    p.req = r;
  else
    p.done_now = true;
  ++x.posted;
  ++op.chunks_posted;
  if (x.send)
    ++op.sends_in_flight;
  else
    ++op.recvs_in_flight, ++op.recvs_posted;
  return BALLAST_OK;
}

// 1 when the oldest chunk of x completed, 0 while it runs, < 0 on failure.
int complete_chunk(Op& op, Xfer& x) {
  Pending& p = x.win[x.completed % kWindow];
  ucs_status_t st = UCS_OK;
  if (!p.done_now) {
    st = x.send ? ucp_request_check_status(p.req) : ucp_tag_recv_request_test(p.req, &p.info);
    if (st == UCS_INPROGRESS) return 0;
    ucp_request_free(p.req);
    p.req = nullptr;
  }
  auto who = [&] { return "rank " + std::to_string(x.peer); };  // for the messages only: not built per chunk
  if (!x.send && (st == UCS_ERR_MESSAGE_TRUNCATED ||
                  (st == UCS_OK && ((p.info.sender_tag & 0xFFF) != op.low || p.info.length != p.len)))) {
    const uint32_t theirs = st == UCS_OK ? uint32_t(p.info.sender_tag & 0xFFF) : op.low;
    std::string m = "mismatched collectives at " + op_words(op) + ": " + who() + " called " + low_name(theirs) +
                    " while rank " + std::to_string(op.comm->rank) + " called " + low_name(op.low);
    if (theirs == op.low)
      m = "mismatched sizes at " + op_words(op) + ": " + who() + " sent " +
          (st == UCS_OK ? std::to_string(p.info.length) : std::string("more than ")) + " bytes where " +
          std::to_string(p.len) + " were expected (different counts on different ranks)";
    return finish(op, BALLAST_EINVAL, m, true);
  }
  if (st != UCS_OK) return fail_peer(op, peer_failure(op, x.peer, "transfer with " + who() + " failed", st));
  if (x.reduce_dst)
    reduce_to(x.reduce_dst + p.off, (x.reduce_in ? x.reduce_in : x.reduce_dst) + p.off, p.at, p.len / op.esize,
              op.args.dtype, op.args.redop);
  if (x.send) {
    ++op.chunks_sent;
    op.bytes_sent += p.len;
  } else {
    ++op.chunks_received;
    op.bytes_received += p.len;
    if (x.reduce_dst) ++op.chunks_reduced;
  }
  ++x.completed;
  if (x.send)
    --op.sends_in_flight;
  else
    --op.recvs_in_flight;
  return 1;
}

int fail_timeout(Op& op) {
  Comm* c = op.comm;
  std::string waits;
  if (op.cur < op.steps.size()) {
    const Step& s = op.steps[op.cur];
    for (uint32_t i = s.first; i < s.last; ++i) {
      const Xfer& x = op.xfers[i];
      if (x.completed == x.nchunks) continue;
      const PeerState& ps = c->peer(x.peer);
      waits += std::string(waits.empty() ? "" : "; ") + (x.send ? "sending to" : "waiting for data from") + " rank " +
               std::to_string(x.peer) + " (pid " + std::to_string(ps.pid) +
               (ps.local ? ", " + state_words(proc_state(ps.pid)) : ", on " + ps.host) + ", " +
               std::to_string(x.completed) + " of " + std::to_string(x.nchunks) + " chunks done)";
    }
  }
  // A stopped process anywhere in the communicator is the likely root cause.
  for (int r = 0; r < c->n; ++r) {
    const PeerState& ps = c->peer(r);
    if (r == c->rank || !ps.local) continue;
    const char st = proc_state(ps.pid);
    if (st == 'T' || st == 't' || st == 0)
      waits += "; rank " + std::to_string(r) + " (pid " + std::to_string(ps.pid) + ") is " + state_words(st);
  }
  const int64_t ms = (op.args.timeout_ns ? op.args.timeout_ns : c->w->timeout_ns) / 1000000;
  return finish(op, BALLAST_ETIMEDOUT,
                op_words(op) + " timed out after " + std::to_string(ms) + " ms at step " + std::to_string(op.cur + 1) +
                    " of " + std::to_string(op.steps.size()) + ": " + waits,
                true);
}

// Peers that died, or whose endpoint failed, end the operation. A local peer
// whose process is gone fails the operation only when a transfer with it is
// still unfinished 200 ms later: a peer that finished and exited may have
// left its last messages in shared memory, still to be delivered.
int check_peers(Op& op, int64_t now) {
  Comm* c = op.comm;
  if (op.cur >= op.steps.size()) return BALLAST_OK;
  const Step& s = op.steps[op.cur];
  for (uint32_t i = s.first; i < s.last; ++i) {
    const Xfer& x = op.xfers[i];
    if (x.completed == x.nchunks) continue;
    PeerState& ps = c->peer(x.peer);
    if (ps.ep_status != UCS_OK)
      return fail_peer(op, peer_failure(op, x.peer,
                                        "the connection to rank " + std::to_string(x.peer) + " (pid " +
                                            std::to_string(ps.pid) + ") failed",
                                        ps.ep_status));
    if (!ps.local) continue;
    const char st = proc_state(ps.pid);
    if (st != 0 && st != 'Z' && st != 'X') continue;
    if (ps.gone_since == 0) ps.gone_since = now;
    if (now - ps.gone_since < 200000000) continue;
    return fail_peer(op, op_words(op) + ": rank " + std::to_string(x.peer) + " (pid " + std::to_string(ps.pid) +
                             ") is gone: the process exited or was killed");
  }
  return BALLAST_OK;
}

// Complete the finished chunks of x, oldest first. < 0: the op failed.
int complete_ready(Op& op, Xfer& x) {
  while (x.completed < x.posted) {
    const int rc = complete_chunk(op, x);
    if (rc <= 0) return rc;
  }
  return 0;
}

// Post the first chunks of the current step: a window of each transfer.
int post_step(Op& op) {
  op.step_posted = true;
  const Step& s = op.steps[op.cur];
  for (uint32_t i = s.first; i < s.last; ++i) {
    Xfer& x = op.xfers[i];
    while (x.posted < x.nchunks && x.posted - x.completed < kWindow)
      if (int rc = post_chunk(op, x); rc != BALLAST_OK) return rc;
  }
  return BALLAST_OK;
}

// A ring step is [send to rank + 1, receive from rank - 1].
Xfer& ring_send(Op& op, size_t step) { return op.xfers[op.steps[step].first]; }
Xfer& ring_recv(Op& op, size_t step) { return op.xfers[op.steps[step].first + 1]; }

// Post what a ring may post now: receives as far as the window allows,
// sends of chunks whose block is in (see progress_ring).
int post_ring(Op& op) {
  const size_t n = op.steps.size();
  // Receives first: posted before the neighbour's data arrives, it lands in
  // place instead of in UCX's unexpected queue.
  for (; op.recv_next < n; ++op.recv_next) {
    Xfer& x = ring_recv(op, op.recv_next);
    while (x.posted < x.nchunks && op.recvs_in_flight < kWindow)
      if (int rc = post_chunk(op, x); rc != BALLAST_OK) return rc;
    if (x.posted < x.nchunks) break;
  }
  for (; op.send_next < n; ++op.send_next) {
    Xfer& x = ring_send(op, op.send_next);
    const Xfer* feed = op.send_next > 0 ? &ring_recv(op, op.send_next - 1) : nullptr;
    while (x.posted < x.nchunks && op.sends_in_flight < kWindow && (!feed || feed->completed > x.posted))
      if (int rc = post_chunk(op, x); rc != BALLAST_OK) return rc;
    if (x.posted < x.nchunks) break;
  }
  return BALLAST_OK;
}

// Post the first chunks of an operation that runs now. false: posting
// failed, and the operation ended so.
bool post_first(Op& op) {
  if (op.cur >= op.steps.size()) return true;
  return (op.ring ? post_ring(op) : post_step(op)) == BALLAST_OK;
}

// The ring with its steps overlapped. The send of step s forwards the block
// that the receive of step s - 1 brought in (and reduced), so its chunk k
// may go as soon as chunk k of that receive is done, while the later chunks
// of step s - 1 are still on the wire: reduction and transfer of
// neighbouring steps overlap instead of taking turns. Sends and receives
// are each posted in (step, chunk) order, which is the order in which the
// neighbours post theirs, so UCX's in-order tag matching pairs them up.
// Returns 1 when every step is done, 0 while running, < 0 on failure.
int progress_ring(Op& op) {
  const size_t n = op.steps.size();
  for (; op.recv_done < n; ++op.recv_done) {
    Xfer& x = ring_recv(op, op.recv_done);
    if (complete_ready(op, x) < 0) return -1;
    if (x.completed < x.nchunks) break;
  }
  for (; op.send_done < n; ++op.send_done) {
    Xfer& x = ring_send(op, op.send_done);
    if (complete_ready(op, x) < 0) return -1;
    if (x.completed < x.nchunks) break;
  }
  op.cur = std::min(op.send_done, op.recv_done);
  if (op.cur == n) return 1;
  return post_ring(op) == BALLAST_OK ? 0 : -1;
}

// The end of an operation that succeeded, inlined into progress: every
// step is done, so its record needs only the counters that can have moved,
// its last step and no peer waited on, then its end. Through finish (calls
// to copy every counter, look for peers still waited on, then end the
// record) a 2-process 8-byte allreduce paid 43-48 ns for its record instead
// of 20-24 (bench_comm --trace-only, medians of 7 alternating runs).
[[gnu::always_inline]] inline void succeed(Op& op) {
  if (ballast_trace_slot* s = op.slot) {
    put_counters(s, op);
    put(&s->step, uint32_t(op.steps.size()));
    put(&s->wait_peer, int32_t(-1));
    put(&s->send_peer, int32_t(-1));
    end_record(op, BALLAST_OK);
  }
  op.status = BALLAST_OK;
  op.msg.clear();
  op.done = true;
}

// One round of progress of a running operation, after UCX's (advance()).
// 1: done (op.status says how), 0: running.
int progress(Op& op) {
  Comm* c = op.comm;
  if (op.ring) {
    const int rc = progress_ring(op);
    if (rc < 0) return 1;
    if (rc > 0)  // ring steps carry at most a final copy (reduce-scatter's result)
      for (const Step& s : op.steps)
        if (s.copy_dst) std::memcpy(s.copy_dst, s.copy_src, s.copy_len);
  }
  while (!op.ring && op.cur < op.steps.size()) {
    Step& s = op.steps[op.cur];
    if (!op.step_posted && post_step(op) != BALLAST_OK) return 1;
    bool all = true;
    for (uint32_t i = s.first; i < s.last; ++i) {
      Xfer& x = op.xfers[i];
      while (x.completed < x.posted) {
        const int rc = complete_chunk(op, x);
        if (rc < 0) return 1;
        if (rc == 0) break;
        if (x.posted < x.nchunks && post_chunk(op, x) != BALLAST_OK) return 1;
      }
      if (x.completed < x.nchunks) all = false;
    }
    if (!all) break;
    if (s.red_gathered) {
      const size_t stride = s.red_count * op.esize;
      reduce_to(s.red_dst, s.red_src, s.red_src + stride, s.red_count, op.args.dtype, op.args.redop);
      for (int i = 2; i < s.red_gathered; ++i)
        reduce_into(s.red_dst, s.red_src + size_t(i) * stride, s.red_count, op.args.dtype, op.args.redop);
    } else if (s.red_dst) {
      reduce_into(s.red_dst, s.red_src, s.red_count, op.args.dtype, op.args.redop);
    }
    if (s.red_dst)  // the step's received chunks are reduced now, not one by one as they came
      for (uint32_t i = s.first; i < s.last; ++i)
        if (!op.xfers[i].send && !op.xfers[i].reduce_dst) op.chunks_reduced += op.xfers[i].nchunks;
    if (s.copy_dst) std::memcpy(s.copy_dst, s.copy_src, s.copy_len);
    ++op.cur;
    op.step_posted = false;
  }
  if (op.cur == op.steps.size()) {
    succeed(op);
    return 1;
  }
  if ((++op.iter & 63) == 0) {
    const int64_t now = monotonic_ns();
    if (op.slot && now >= op.next_refresh) refresh_progress(op, now);
    if (now >= op.next_live_check) {
      op.next_live_check = now + 10000000;
      if (c->w->ring) c->w->ring->heartbeat();
      if (check_peers(op, now) != BALLAST_OK) return 1;
    }
    if (now >= op.deadline) {
      fail_timeout(op);
      return 1;
    }
  }
  return 0;
}

// Op's record as `state` with `start`, whole.
ballast_trace_slot full_record(const Op& op, uint32_t state, uint64_t start) {
  const Comm* c = op.comm;
  const ballast_comm_args& a = op.args;
  const bool p2p = a.op == BALLAST_OP_SEND || a.op == BALLAST_OP_RECV;
  // An issued operation has no plan yet (what op holds is its last one's).
  const bool planned = state != BALLAST_TRACE_ISSUED;
  return ballast_trace_slot{.gen = 0,
                            .comm_id = c->id,
                            .seq = op.seq,
                            .count = a.count,
                            .bytes = a.count * op.esize,
                            .op = a.op,
                            .dtype = a.dtype,
                            .redop = a.redop,
                            .algorithm = planned ? op.algorithm : uint32_t(BALLAST_ALGO_NONE),
                            .rank = c->rank,
                            .nranks = c->n,
                            .world_rank = c->w->rank,
                            .peer = (a.op == BALLAST_OP_BROADCAST || a.op == BALLAST_OP_REDUCE || p2p) ? a.root : -1,
                            .state = state,
                            .status = BALLAST_OK,
                            .flags = p2p ? uint32_t(BALLAST_TRACE_P2P) : 0u,
                            .wait_peer = -1,
                            .send_peer = -1,
                            .steps = planned ? uint32_t(op.steps.size()) : 0u,
                            .step = 0,
                            .reserved0 = 0,
                            .issue_tick = op.issue_tick,
                            .start_tick = start,
                            .end_tick = 0,
                            .progress_tick = std::max(start, op.issue_tick),
                            .chunks_total = planned ? op.chunks_total : 0,
                            .chunks_posted = op.chunks_posted,
                            .chunks_sent = 0,
                            .chunks_received = 0,
                            .chunks_reduced = 0,
                            .bytes_sent = 0,
                            .bytes_received = 0};
}

// Write op's record: issued (a collective queued behind another; start 0)
// or started, then publish it. A started operation whose plan was kept
// copies the record made for that plan and sets what changes from one
// operation to the next (its sequence number, times and first chunks):
// record cost in a world of one 23.0-23.5 -> 20.1-20.3 ns, on a 2-process
// 8-byte allreduce 32.0-32.8 -> 30.2-31.4 ns (bench_comm --trace-only,
// medians of 7 and 9 alternating runs). Inlined where it is called: as a
// call the whole record cost 3.5-4.5 ns more.
[[gnu::always_inline]] inline void write_record(Op& op, uint32_t state, uint64_t start) {
  ballast_trace_slot* s = op.claimed;
  if (!s) return;  // every slot held an operation in flight: this one goes unrecorded
  if (state == BALLAST_TRACE_STARTED && op.planned) {
    if (!op.record_made) {
      op.record = full_record(op, state, 0);
      op.record_made = true;
    }
    std::memcpy(s, &op.record, sizeof *s);
    s->seq = op.seq;
    s->issue_tick = op.issue_tick;
    s->start_tick = start;
    s->progress_tick = std::max(start, op.issue_tick);
    s->chunks_posted = op.chunks_posted;
  } else {
    *s = full_record(op, state, start);
  }
  TraceRing::publish(s, op.slot_index);
  op.slot = s;
}

// Make op's steps and set it running. The start is the clock read at
// start() for the deadline when it runs at once (the ring's timeline is
// CLOCK_MONOTONIC too: no second read), now when it waited in the queue.
// false: it could not be built and ended so (a local error: the
// communicator stays usable).
bool begin(Op& op) {
  Comm* c = op.comm;
  if (int rc = plan(op); rc != BALLAST_OK) {
    if (c->trace && !op.slot) write_record(op, BALLAST_TRACE_STARTED, op.issue_tick);  // the slot is claimed
    finish(op, rc, last_error(), false);
    c->failed = BALLAST_OK;
    return false;
  }
  if (!op.slot) return true;  // not queued: comm_start writes the record, once the first chunks are posted
  const uint64_t start = std::max(uint64_t(c->clock.now()), op.issue_tick);
  op.start_tick = start;
  ballast_trace_slot* s = op.slot;  // issued while queued: the rest of its record, then its state
  put(&s->algorithm, op.algorithm);
  put(&s->steps, uint32_t(op.steps.size()));
  put(&s->chunks_total, op.chunks_total);
  put(&s->start_tick, start);
  put(&s->progress_tick, start);
  __atomic_store_n(&s->state, uint32_t(BALLAST_TRACE_STARTED), __ATOMIC_RELEASE);
  return true;
}

// End every operation of c still in flight or queued: op_words + why.
void end_all(Comm* c, int status, const std::string& why, bool notify) {
  for (Op* op : c->p2p) finish(*op, status, op_words(*op) + why, notify);
  for (Op* op : c->queue) finish(*op, status, op_words(*op) + why, notify);
  c->p2p.clear();
  c->queue.clear();
}

// After a failed operation the communicator is unusable: what else was in
// flight or queued ends with the same status, naming the first failure.
void end_after_failure(Comm* c) { end_all(c, c->failed, " did not complete: " + c->failed_msg, false); }

// The running collective ended and others wait behind it: the next one
// starts, its first chunks posted now rather than at the caller's next test
// or wait. Not inlined into advance(): there it made the traced 2-process
// 8-byte allreduce ~8 ns slower (3 series of 5-9 alternating runs).
[[gnu::noinline]] void start_next(Comm* c) {
  while (!c->queue.empty() && !begin(*c->queue.front())) c->queue.pop_front();
  if (!c->queue.empty() && !post_first(*c->queue.front())) {
    c->queue.pop_front();
    end_after_failure(c);
  }
}

// One round of progress of c: UCX's, then each running operation's. When
// the running collective ends, the next one queued starts. Returns the UCX
// events handled.
unsigned advance(Comm* c) {
  const unsigned events = ucp_worker_progress(c->w->worker);
  if (c->abort_flag.load(std::memory_order_relaxed)) {
    std::string reason;
    {
      std::lock_guard<std::mutex> lock(c->abort_mu);
      reason = c->abort_reason;
    }
    end_all(c, BALLAST_EABORTED, " aborted: " + reason, true);
    return events;
  }
  std::string notice;
  if (control_arrived(c, &notice)) {
    end_all(c, BALLAST_EPEER, " failed: " + notice, false);
    return events;
  }
  for (size_t i = 0; i < c->p2p.size();) {
    Op* op = c->p2p[i];
    if (!progress(*op)) {
      ++i;
      continue;
    }
    c->p2p.erase(c->p2p.begin() + std::ptrdiff_t(i));
    if (op->status != BALLAST_OK) {
      end_after_failure(c);
      return events;
    }
  }
  if (c->queue.empty() || !progress(*c->queue.front())) return events;
  const Op* ended = c->queue.front();
  c->queue.pop_front();
  if (ended->status != BALLAST_OK) {
    end_after_failure(c);
    return events;
  }
  if (!c->queue.empty()) start_next(c);
  return events;
}

// Hand a finished op's result over and return it to the pool.
int collect(Op& op) {
  op.comm->idle.push_back(&op);
  return set_last_error(op.status, op.msg);
}

// Idle operations kept beyond those in flight, each with its plan: a
// trainer's step repeats a few collectives on a few buffers.
constexpr size_t kPlansKept = 16;

// An Op from the pool for an operation with arguments a: one whose last
// plan was made for them when there is one (the last one handed back is
// looked at first), else a new one while fewer than kPlansKept are idle,
// else the one idle longest.
Op& take_op(Comm* c, const ballast_comm_args& a) {
  auto& idle = c->idle;
  size_t i = idle.size();
  while (i > 0 && !same_args(idle[i - 1]->plan_key, a)) --i;
  if (i == 0 && idle.size() < kPlansKept) {
    c->ops.push_back(std::make_unique<Op>());
    return *c->ops.back();
  }
  const auto at = idle.begin() + std::ptrdiff_t(i == 0 ? 0 : i - 1);  // the match, or the oldest
  Op* op = *at;
  idle.erase(at);
  return *op;
}

int validate(Comm* c, const ballast_comm_args* a) {
  if (!a || a->size < BALLAST_COMM_ARGS_V1_SIZE) return set_last_error(BALLAST_EINVAL, "args is NULL or too short");
  if (a->op == BALLAST_OP_NONE || a->op > BALLAST_OP_BARRIER)
    return set_last_error(BALLAST_EINVAL, "unknown operation " + std::to_string(a->op));
  if (a->op == BALLAST_OP_BARRIER) return BALLAST_OK;
  if (a->dtype >= BALLAST_DT_COUNT) return set_last_error(BALLAST_EINVAL, "unknown dtype " + std::to_string(a->dtype));
  if (a->redop >= BALLAST_RED_COUNT) return set_last_error(BALLAST_EINVAL, "unknown redop " + std::to_string(a->redop));
  const bool rooted = a->op == BALLAST_OP_BROADCAST || a->op == BALLAST_OP_REDUCE || a->op == BALLAST_OP_SEND ||
                      a->op == BALLAST_OP_RECV;
  if (rooted && (a->root < 0 || a->root >= c->n))
    return set_last_error(BALLAST_EINVAL, std::string(ballast_op_name(a->op)) + ": root/peer " +
                                              std::to_string(a->root) + " is out of range for " + std::to_string(c->n) +
                                              " ranks");
  if ((a->op == BALLAST_OP_SEND || a->op == BALLAST_OP_RECV) && a->root == c->rank)
    return set_last_error(BALLAST_EINVAL,
                          std::string(ballast_op_name(a->op)) + " to itself (rank " + std::to_string(c->rank) + ")");
  if (a->count == 0) return BALLAST_OK;
  const bool needs_send = a->op == BALLAST_OP_SEND || a->op == BALLAST_OP_ALLTOALL;
  const bool needs_recv = !(a->op == BALLAST_OP_SEND || (a->op == BALLAST_OP_REDUCE && a->root != c->rank));
  if (needs_send && !a->sendbuf)
    return set_last_error(BALLAST_EINVAL, std::string(ballast_op_name(a->op)) + ": sendbuf is NULL");
  if (needs_recv && !a->recvbuf)
    return set_last_error(BALLAST_EINVAL, std::string(ballast_op_name(a->op)) + ": recvbuf is NULL");
  if (a->op == BALLAST_OP_REDUCE && a->root != c->rank && !a->sendbuf)
    return set_last_error(BALLAST_EINVAL, "reduce: sendbuf is NULL on a non-root rank");
  if (a->op == BALLAST_OP_ALLTOALL && a->sendbuf == a->recvbuf)
    return set_last_error(BALLAST_EINVAL, "alltoall cannot run in place (sendbuf == recvbuf)");
  return BALLAST_OK;
}

Comm* make_comm(std::shared_ptr<World> w, std::vector<int> members, int rank, uint32_t ctx) {
  auto* c = new Comm();
  c->w = std::move(w);
  c->members = std::move(members);
  c->n = int(c->members.size());
  c->rank = rank;
  c->ctx = ctx;
  c->id = mix(c->w->job_id ^ (uint64_t(ctx) * 0x9e3779b97f4a7c15ULL));
  c->p2p_sent.assign(size_t(c->n), 0);
  c->p2p_received.assign(size_t(c->n), 0);
  c->trace = c->w->ring != nullptr;
  post_control_recv(c);
  return c;
}

}  // namespace

// ---- the API ---------------------------------------------------------------

int comm_init(const ballast_comm_config* cfg, Comm** out) {
  if (!out) return set_last_error(BALLAST_EINVAL, "init: comm is NULL");
  *out = nullptr;
  if (cfg && cfg->size < BALLAST_COMM_CONFIG_V1_SIZE)
    return set_last_error(BALLAST_EINVAL, "init: ballast_comm_config.size is too small");
  std::string err;
  int status = BALLAST_OK;
  auto w = make_world(cfg, &err, &status);
  if (!w) return set_last_error(status, err);
  std::vector<int> members(size_t(w->nranks));
  for (int i = 0; i < w->nranks; ++i) members[size_t(i)] = i;
  const int rank = w->rank;
  *out = make_comm(std::move(w), std::move(members), rank, 0);
  return set_last_error(BALLAST_OK, "");
}

int comm_split(Comm* parent, int32_t colour, int32_t key, Comm** out) {
  if (!parent || !out) return set_last_error(BALLAST_EINVAL, "split: parent or out is NULL");
  *out = nullptr;
  struct Entry {
    int32_t colour, key;
    uint32_t next_ctx, pad;
  };
  std::vector<Entry> all(size_t(parent->n));
  Entry mine{colour < 0 ? BALLAST_COMM_UNDEFINED : colour, key, parent->w->next_ctx, 0};
  ballast_comm_args a{};
  a.size = sizeof a;
  a.op = BALLAST_OP_ALLGATHER;
  a.dtype = BALLAST_DT_U8;
  a.sendbuf = &mine;
  a.recvbuf = all.data();
  a.count = sizeof(Entry);
  const int rc = comm_run(parent, &a);
  if (rc != BALLAST_OK) return set_last_error(rc, std::string("split: ") + last_error());
  uint32_t ctx = 0;
  for (const Entry& e : all) ctx = std::max(ctx, e.next_ctx);
  if (ctx > kMaxContext)
    return set_last_error(BALLAST_EFULL, "split: more than 2047 communicators were split in this job");
  parent->w->next_ctx = ctx + 1;  // every member of parent moves past ctx
  if (mine.colour == BALLAST_COMM_UNDEFINED) return set_last_error(BALLAST_OK, "");
  std::vector<std::pair<int32_t, int>> order;  // (key, parent rank)
  for (int r = 0; r < parent->n; ++r)
    if (all[size_t(r)].colour == mine.colour) order.emplace_back(all[size_t(r)].key, r);
  std::sort(order.begin(), order.end());
  std::vector<int> members;
  int rank = 0;
  for (const auto& [k, r] : order) {
    if (r == parent->rank) rank = int(members.size());
    members.push_back(parent->members[size_t(r)]);
  }
  *out = make_comm(parent->w, std::move(members), rank, ctx);
  return set_last_error(BALLAST_OK, "");
}

void comm_destroy(Comm* c) {
  if (!c) return;
  end_all(c, BALLAST_EABORTED, " cancelled: its communicator was destroyed", false);
  if (c->ctrl_req) {
    ucp_request_cancel(c->w->worker, c->ctrl_req);
    ucp_request_free(c->ctrl_req);
  }
  delete c;  // the world goes with its last communicator
}

int comm_abort(Comm* c, const char* reason) {
  if (!c) return set_last_error(BALLAST_EINVAL, "abort: comm is NULL");
  {
    std::lock_guard<std::mutex> lock(c->abort_mu);
    if (!c->abort_flag.load()) c->abort_reason = reason ? reason : "abort() was called";
  }
  c->abort_flag.store(true);
  return BALLAST_OK;
}

int comm_info(Comm* c, ballast_comm_info* info) {
  if (!c || !info || info->size < BALLAST_COMM_INFO_V1_SIZE)
    return set_last_error(BALLAST_EINVAL, "info: comm or info is NULL, or info->size too small");
  info->rank = c->rank;
  info->nranks = c->n;
  info->world_rank = c->w->rank;
  info->comm_id = c->id;
  info->seq = c->seq;
  // A caller built before max_in_flight existed passes a smaller size.
  if (info->size >= sizeof *info) info->max_in_flight = uint32_t(kMaxInFlight);
  return BALLAST_OK;
}

int comm_start(Comm* c, const ballast_comm_args* args, ballast_comm_request** req) {
  if (!c || !req) return set_last_error(BALLAST_EINVAL, "start: comm or req is NULL");
  *req = nullptr;
  if (c->ops.size() - c->idle.size() >= kMaxInFlight)
    return set_last_error(BALLAST_EFULL, "start: " + std::to_string(kMaxInFlight) +
                                             " operations of this communicator are started and not yet completed "
                                             "by test or wait, the most it takes");
  if (int rc = validate(c, args); rc != BALLAST_OK) return rc;
  if (c->abort_flag.load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> lock(c->abort_mu);
    return set_last_error(BALLAST_EABORTED, "communicator aborted: " + c->abort_reason);
  }
  if (c->failed == BALLAST_OK) {
    std::string notice;
    if (control_arrived(c, &notice)) {
      c->failed = BALLAST_EPEER;
      c->failed_msg = notice;
      end_after_failure(c);
    }
  }
  if (c->failed != BALLAST_OK) return set_last_error(BALLAST_ESTATE, "communicator failed earlier: " + c->failed_msg);
  Op& op = take_op(c, *args);
  // The record's slot first: claiming it is a locked instruction, which
  // waits for every store before it; here there are few.
  if (c->trace) op.claimed = c->w->ring->claim(&op.slot_index);
  op.comm = c;
  std::memcpy(&op.args, args, std::min<size_t>(args->size, sizeof op.args));
  op.args.size = sizeof op.args;
  if (args->size < sizeof op.args) op.args.stream = nullptr;
  const ballast_comm_args& a = op.args;
  op.esize = a.op == BALLAST_OP_BARRIER ? 1 : ballast_dtype_size(a.dtype);
  const bool p2p = a.op == BALLAST_OP_SEND || a.op == BALLAST_OP_RECV;
  if (p2p) {
    op.seq = a.op == BALLAST_OP_SEND ? ++c->p2p_sent[size_t(a.root)] : ++c->p2p_received[size_t(a.root)];
    op.tag_ctx = c->ctx | kP2PContext;
  } else {
    op.seq = ++c->seq;
    op.tag_ctx = c->ctx;
  }
  op.seq %= kSeqControl;
  if (op.seq == 0 && !p2p) op.seq = c->seq = 1;  // skip 0 after a wrap
  const uint32_t wire_op = a.op == BALLAST_OP_RECV ? uint32_t(BALLAST_OP_SEND) : a.op;
  const bool reducing = a.op == BALLAST_OP_ALLREDUCE || a.op == BALLAST_OP_REDUCE || a.op == BALLAST_OP_REDUCE_SCATTER;
  op.low = (wire_op << 8) | (a.op == BALLAST_OP_BARRIER ? 0 : a.dtype << 4) | (reducing ? a.redop : 0);
  op.cur = 0;
  op.step_posted = false;
  op.send_next = op.recv_next = op.send_done = op.recv_done = 0;
  op.sends_in_flight = op.recvs_in_flight = 0;
  op.recvs_posted = 0;
  op.iter = 0;
  op.done = false;
  op.status = BALLAST_OK;
  op.msg.clear();
  const int64_t now = int64_t(c->clock.now());
  op.issue_tick = op.start_tick = uint64_t(now);
  op.deadline = now + (a.timeout_ns > 0 ? a.timeout_ns : c->w->timeout_ns);
  op.next_live_check = now + 10000000;
  op.next_refresh = now + kRefreshNs;
  op.exact_ticks = a.count * op.esize >= (64u << 10) || c->clock.uses_tsc() || c->w->exact_ticks;
  op.slot = nullptr;
  op.chunks_posted = op.chunks_sent = op.chunks_received = op.chunks_reduced = 0;
  op.bytes_sent = op.bytes_received = 0;
  op.chunks_at_refresh = 0;
  if (!p2p && !c->queue.empty()) {
    // Behind the running collective: its steps are made when its turn comes
    // (they take the scratch buffers the running one uses).
    if (c->trace) write_record(op, BALLAST_TRACE_ISSUED, 0);
    c->queue.push_back(&op);
  } else {
    if (!begin(op)) return collect(op);  // failed to build: its result, and back to the pool
    if (p2p)
      c->p2p.push_back(&op);
    else
      c->queue.push_back(&op);
    // The first chunks go now, so that they travel while the caller works
    // until its test or wait; the record after them, so as not to hold
    // them up.
    const bool posted = post_first(op);
    if (c->trace) {
      write_record(op, BALLAST_TRACE_STARTED, op.issue_tick);
      if (op.done && op.slot) end_record(op, op.status);
    }
    if (!posted) {  // ended as a failure in advance() would: the caller collects it
      if (p2p)
        c->p2p.pop_back();
      else
        c->queue.pop_front();
      end_after_failure(c);
    }
  }
  *req = reinterpret_cast<ballast_comm_request*>(&op);
  return BALLAST_OK;
}

int comm_test(ballast_comm_request* req, int* done) {
  if (!req || !done) return set_last_error(BALLAST_EINVAL, "test: req or done is NULL");
  Op& op = *reinterpret_cast<Op*>(req);
  if (!op.done) advance(op.comm);
  *done = op.done;
  if (!op.done) return BALLAST_OK;
  return collect(op);
}

int comm_wait(ballast_comm_request* req) {
  if (!req) return set_last_error(BALLAST_EINVAL, "wait: req is NULL");
  Op& op = *reinterpret_cast<Op*>(req);
  // Busy polling, as MPI does. When this host runs more ranks than this
  // process may use CPUs, give the CPU away after each poll in which UCX had
  // nothing to do, as Open MPI's yield_when_idle does: the rank we wait for
  // may be queued behind us on our CPU. A poll that handled an event does
  // not yield, since more are then usually on their way from ranks running
  // on the other CPUs: yielding after every poll that did not finish the
  // operation gave the CPU away between the messages of one step.
  // sched_yield, not a timed sleep: a sleep costs its timer slack (50 us and
  // more) per step, while a yield with nobody queued returns at once.
  // Measured with 4 ranks on 2 CPUs, 8 B allreduce p50: 141 us with 20 us
  // sleeps, 11.3 us yielding after every poll that did not finish the
  // operation (2000 calls, median of 10 alternating runs), 7.05 us yielding
  // after 2 idle polls in a row, Open MPI 6.35 us; yielding after each idle
  // poll instead of 2 made no difference there, and at 256 KiB and 4 MiB was
  // faster in 2 of 3 and 5 of 6 alternating runs.
  //
  // But a yield does not always hand the CPU over: Linux's fair scheduler
  // (EEVDF here, 6.18) runs the yielder again while the other task on its
  // CPU has had more than its share, so a rank with nothing to do keeps its
  // CPU in turns of sched_yield while the rank that has a block to copy and
  // reduce waits (counted at 4 ranks, 1 MiB: in slow runs 5 to 10 yields per
  // context switch, in fast ones 1). And a rank that never sleeps is always
  // runnable, so the load balancer never sees an idle CPU to move work to.
  // So a wait that has seen no event for block_ns (20 us) sleeps on the
  // worker's event fd (ucp_worker_arm + poll), woken by the next message,
  // for 1 ms at most (abort, deadlines and dead peers are looked at after).
  // Short waits, as in small operations, never get there. 4 ranks on 2
  // CPUs, untraced p50, alternating runs (medians): sm 256 KiB 183 -> 138 us,
  // 1 MiB 470 -> 458 us, 4 MiB 2.94 -> 2.64 ms (Open MPI 174 us, 495 us,
  // 2.79 ms; 8 runs each), 64 KiB 45 -> 34 us; 8 B and tcp the same within
  // the noise (8 B sm 7.05 / 6.7 us, tcp 34.9 / 30.0 us, 1 and 4 MiB tcp).
  Comm* c = op.comm;
  World& w = *c->w;
  const bool yield = w.yield;
  int64_t idle_since = 0;
  while (!op.done) {
    const unsigned events = advance(c);
    if (!yield || op.done) continue;
    if (events) {
      idle_since = 0;
      continue;
    }
    if (w.efd >= 0) {
      const int64_t now = monotonic_ns();
      if (idle_since == 0) idle_since = now;
      if (now - idle_since >= w.block_ns) {
        idle_since = 0;
        if (ucp_worker_arm(w.worker) == UCS_OK) {
          pollfd pfd{w.efd, POLLIN, 0};
          poll(&pfd, 1, 1);
        }
        continue;
      }
    }
    sched_yield();
  }
  return collect(op);
}

int comm_run(Comm* c, const ballast_comm_args* args) {
  ballast_comm_request* req = nullptr;
  const int rc = comm_start(c, args, &req);
  if (rc != BALLAST_OK) return rc;
  return comm_wait(req);
}

}  // namespace ballast::comm
