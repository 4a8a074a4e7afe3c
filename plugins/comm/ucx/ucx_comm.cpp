#include "ucx_comm.hpp"

#include "bootstrap.hpp"
#include "cpus.hpp"
#include "reduce.hpp"
#include "trace_ring.hpp"

#include <poll.h>
#include <sched.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ballast::comm {

namespace {

thread_local std::string t_error;

// ---- tags: seq 24 | source rank 16 | context 12 | op 4 | dtype 4 | redop 4 ----
// Receives match seq, source and context; the low 12 bits are compared after
// arrival, so that a peer in another operation is reported, not waited for.
constexpr uint64_t kSeqMask = 0xFFFFFF;
constexpr uint64_t kSeqControl = 0xFFFFFF;  // never a data seq: seqs wrap at 0xFFFFFF
constexpr uint64_t kMatchMask = ~uint64_t(0xFFF);
constexpr uint64_t kControlMask = (kSeqMask << 40) | (uint64_t(0xFFF) << 12);
constexpr uint32_t kP2PContext = 0x800;
constexpr uint32_t kMaxContext = 0x7FF;

uint64_t make_tag(uint64_t seq, uint32_t src, uint32_t ctx, uint32_t low) {
  return ((seq & kSeqMask) << 40) | (uint64_t(src & 0xFFFF) << 24) | (uint64_t(ctx & 0xFFF) << 12) | (low & 0xFFF);
}

std::string low_name(uint32_t low) {
  const uint32_t op = (low >> 8) & 0xF, dt = (low >> 4) & 0xF, red = low & 0xF;
  std::string s = std::string(ballast_op_name(op)) + "(" + ballast_dtype_name(dt);
  if (op == BALLAST_OP_ALLREDUCE || op == BALLAST_OP_REDUCE || op == BALLAST_OP_REDUCE_SCATTER)
    s += std::string(", ") + ballast_redop_name(red);
  return s + ")";
}

int64_t env_i64(const char* name, int64_t dflt) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  char* end = nullptr;
  const long long x = std::strtoll(v, &end, 10);
  return end && *end == '\0' ? int64_t(x) : dflt;
}

// Whether UCX_TLS lets UCX load its tcp transport: unset, "all", a list
// naming tcp, or an exclusion list ("^...") that does not name it.
bool may_use_tcp(const char* tls) {
  if (!tls || !*tls) return true;
  bool named = false;
  const bool exclude = tls[0] == '^';
  for (const char* p = exclude ? tls + 1 : tls; *p;) {
    const char* e = std::strchr(p, ',');
    const std::string t(p, e ? size_t(e - p) : std::strlen(p));
    if (t == "tcp" || (!exclude && t == "all")) named = true;
    p = e ? e + 1 : p + t.size();
  }
  return exclude ? !named : named;
}

// Whether UCX_TLS names tcp and no other transport but self.
bool tcp_only(const char* tls) {
  if (!tls || !*tls || tls[0] == '^') return false;
  bool tcp = false;
  for (const char* p = tls; *p;) {
    const char* e = std::strchr(p, ',');
    const std::string t(p, e ? size_t(e - p) : std::strlen(p));
    if (t == "tcp") tcp = true;
    else if (t != "self") return false;
    p = e ? e + 1 : p + t.size();
  }
  return tcp;
}

std::string hex(uint64_t v) {
  char b[32];
  std::snprintf(b, sizeof b, "%016" PRIx64, v);
  return b;
}

// The scheduler state of a local process: 'R', 'S', 'T' (stopped), 'Z', ... or 0 when gone.
char proc_state(int pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE* f = std::fopen(path, "r");
  if (!f) return 0;
  char buf[512];
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');
  return p && p[1] == ' ' ? p[2] : 0;
}

std::string state_words(char st) {
  switch (st) {
    case 0: return "gone";
    case 'T': case 't': return "stopped";
    case 'Z': case 'X': return "exited (zombie)";
    case 'R': return "running";
    case 'D': return "in uninterruptible I/O";
    default: return "alive, sleeping";
  }
}

// A buffer owned by a communicator, grown (never shrunk) when an operation needs more.
struct Scratch {
  char* p = nullptr;
  size_t cap = 0;
  ~Scratch() { std::free(p); }
  char* get(size_t n) {
    if (n > cap) {
      std::free(p);
      const size_t want = std::max<size_t>(n, 4096);
      if (posix_memalign(reinterpret_cast<void**>(&p), 4096, want) != 0) {
        p = nullptr;
        cap = 0;
        return nullptr;
      }
      std::memset(p, 0, want);  // fault the pages in now, not during a transfer
      cap = want;
    }
    return p;
  }
};

char g_zero_byte = 0;

}  // namespace

const char* last_error() { return t_error.c_str(); }
int set_last_error(int status, const std::string& msg) {
  t_error = msg;
  return status;
}

// ---------------------------------------------------------------------------

struct PeerState {
  int32_t pid = 0;
  std::string host;
  bool local = false;
  ucp_ep_h ep = nullptr;
  ucs_status_t ep_status = UCS_OK;  // set by UCX's error callback (owner thread, inside progress)
  int64_t gone_since = 0;           // when the process was first seen gone
};

struct World {
  ucp_context_h ctx = nullptr;
  ucp_worker_h worker = nullptr;
  int rank = 0, nranks = 1;
  uint64_t job_id = 0;
  std::vector<PeerState> peers;
  uint32_t next_ctx = 1;
  TraceRing* ring = nullptr;
  int64_t timeout_ns = 0;
  size_t chunk_bytes = 256 << 10;
  size_t small_bytes = 16 << 10;
  size_t pair_bytes = 0;  // 2 ranks: allreduce up to this size swaps whole buffers in one message (tcp alone)
  size_t direct_bytes = 1 << 10;
  size_t halving_bytes = 512 << 10;
  bool yield = false;  // more local ranks than CPUs: yield while waiting
  int efd = -1;             // the worker's event fd (UCP_FEATURE_WAKEUP) when yield: comm_wait may sleep on it
  int64_t block_ns = -1;    // ... after this long without UCX events (< 0: never sleep)
  size_t ring_direct_bytes = 4 << 20;  // from this size, out of place, a ring receives into the output (ring_reduce_scatter)
  bool exact_ticks = false;  // BALLAST_TRACE_EXACT=1: the exact clock for small operations too

  ~World() {
    std::vector<void*> closing;
    for (auto& p : peers) {
      if (!p.ep) continue;
      ucp_request_param_t prm{};
      prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
      void* r = ucp_ep_close_nbx(p.ep, &prm);
      if (r && !UCS_PTR_IS_ERR(r)) closing.push_back(r);
    }
    const int64_t until = monotonic_ns() + 500000000;
    for (void* r : closing) {
      while (ucp_request_check_status(r) == UCS_INPROGRESS && monotonic_ns() < until) ucp_worker_progress(worker);
      ucp_request_free(r);
    }
    if (worker) ucp_worker_destroy(worker);
    if (ctx) ucp_cleanup(ctx);
    if (ring) ring->set_closed(true);
  }
};

constexpr int kWindow = 8;  // chunks in flight per transfer

struct Pending {
  void* req = nullptr;
  bool done_now = false;
  size_t off = 0, len = 0;  // of the chunk within the transfer
  char* at = nullptr;       // where the chunk's bytes are sent from or received to
  ucp_tag_recv_info_t info{};
};

struct Xfer {
  bool send = false;
  int peer = 0;  // rank in the communicator
  char* buf = nullptr;
  size_t len = 0;
  char* reduce_dst = nullptr;  // receive: reduce each chunk into this
  const char* reduce_in = nullptr;  // ... combined with this (the local input), when not reduce_dst itself
  bool staged = false;         // chunk k lands in a slot of kWindow chunks at buf (kept in cache), not at its offset
  size_t nchunks = 0, posted = 0, completed = 0;
  Pending win[kWindow];
};

struct Step {
  uint32_t first = 0, last = 0;  // xfers
  char* red_dst = nullptr;        // after the step: red_dst op= red_src (red_count elements)
  const char* red_src = nullptr;
  size_t red_count = 0;
  int red_gathered = 0;           // or: red_dst = block 0 op block 1 op ... of red_src (this many blocks)
  char* copy_dst = nullptr;       // then: copy copy_len bytes
  const char* copy_src = nullptr;
  size_t copy_len = 0;
};

struct Op {
  Comm* comm = nullptr;
  ballast_comm_args args{};
  uint32_t esize = 1;
  uint64_t seq = 0;       // this op's seq (collective or p2p)
  uint32_t tag_ctx = 0;
  uint32_t low = 0;       // op | dtype | redop bits
  uint32_t algorithm = 0;
  size_t chunk = 0;
  std::vector<Xfer> xfers;
  std::vector<Step> steps;
  size_t cur = 0;
  bool step_posted = false;
  // A ring whose steps overlap (see progress_ring): every step is [send to
  // rank + 1, receive from rank - 1]. Posting and completion cursors, in
  // steps, and the chunks in flight over all steps.
  bool ring = false;
  size_t send_next = 0, recv_next = 0, send_done = 0, recv_done = 0;
  uint32_t sends_in_flight = 0, recvs_in_flight = 0;
  uint64_t recvs_posted = 0;  // over all steps: picks the staging slot
  size_t slot_bytes = 0;      // of a staging slot
  int64_t deadline = 0;
  int64_t next_live_check = 0;
  uint32_t iter = 0;
  unsigned events = 0;  // UCX events the last progress() call handled
  bool large = false;
  bool exact_ticks = false;  // trace with the exact clock (else the coarse one, see trace_ring.hpp)
  uint64_t start_tick = 0;   // the record's start (exact: the clock read for the deadline)
  ballast_trace_slot* slot = nullptr;
  uint64_t slot_index = 0;
  // Progress counted here, in the operation's own cache lines, and copied to
  // the trace slot per chunk for large operations, else every 64 rounds of
  // progress and at the end: a small operation costs the ring a few stores.
  uint64_t chunks_total = 0, chunks_posted = 0, chunks_sent = 0, chunks_received = 0, chunks_reduced = 0;
  uint64_t bytes_sent = 0, bytes_received = 0;
  int status = BALLAST_OK;
  std::string msg;
};

struct Comm {
  std::shared_ptr<World> w;
  std::vector<int> members;  // comm rank -> world rank
  int rank = 0, n = 1;
  uint32_t ctx = 0;
  uint64_t id = 0;
  uint64_t seq = 0;
  std::vector<uint64_t> p2p_sent, p2p_received;
  std::atomic<bool> abort_flag{false};
  std::mutex abort_mu;
  std::string abort_reason;
  int failed = BALLAST_OK;
  std::string failed_msg;
  char ctrl_in[512];
  void* ctrl_req = nullptr;
  ucp_tag_recv_info_t ctrl_info{};
  bool ctrl_done_now = false;
  char notice[512];
  Scratch scratch, accum;
  Op op;
  bool busy = false;
  bool trace = true;

  PeerState& peer(int r) { return w->peers[size_t(members[size_t(r)])]; }
};

namespace {

uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  return x ^ (x >> 33);
}

void ep_error(void* arg, ucp_ep_h, ucs_status_t status) { static_cast<PeerState*>(arg)->ep_status = status; }

void post_control_recv(Comm* c) {
  ucp_request_param_t prm{};
  prm.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  void* r = ucp_tag_recv_nbx(c->w->worker, c->ctrl_in, sizeof c->ctrl_in - 1, make_tag(kSeqControl, 0, c->ctx, 0),
                             kControlMask, &prm);
  c->ctrl_done_now = r == nullptr;
  c->ctrl_req = UCS_PTR_IS_ERR(r) ? nullptr : r;
}

// A failure notice from a peer, if one arrived: fills *msg.
bool control_arrived(Comm* c, std::string* msg) {
  if (!c->ctrl_req && !c->ctrl_done_now) return false;
  if (!c->ctrl_done_now) {
    const ucs_status_t st = ucp_tag_recv_request_test(c->ctrl_req, &c->ctrl_info);
    if (st == UCS_INPROGRESS) return false;
    ucp_request_free(c->ctrl_req);
    c->ctrl_req = nullptr;
    if (st != UCS_OK) return false;
  }
  c->ctrl_done_now = false;
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
    void* q = ucp_tag_send_nbx(c->peer(r).ep, c->notice, len, make_tag(kSeqControl, uint32_t(c->rank), c->ctx, 0),
                               &prm);
    if (q && !UCS_PTR_IS_ERR(q)) pending.push_back(q);
  }
  // Push the notices out before returning: the caller often exits right
  // after a failure, and an endpoint never used before still needs wiring.
  const int64_t until = monotonic_ns() + 200000000;
  for (void* q : pending) {
    while (ucp_request_check_status(q) == UCS_INPROGRESS && monotonic_ns() < until) ucp_worker_progress(c->w->worker);
    ucp_request_free(q);
  }
}

template <class T>
inline void put(T* p, T v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }

// Copy the operation's progress into its trace slot.
void flush_progress(Op& op) {
  ballast_trace_slot* s = op.slot;
  put(&s->chunks_total, op.chunks_total);
  put(&s->chunks_posted, op.chunks_posted);
  put(&s->chunks_sent, op.chunks_sent);
  put(&s->chunks_received, op.chunks_received);
  put(&s->chunks_reduced, op.chunks_reduced);
  put(&s->bytes_sent, op.bytes_sent);
  put(&s->bytes_received, op.bytes_received);
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
  if (op.slot) {
    op.slot->status = status;
    // The coarse clock lags the exact one by up to a step: never an end before the start.
    const uint64_t end = op.exact_ticks ? trace_tick() : std::max(trace_tick_coarse(), op.start_tick);
    __atomic_store_n(&op.slot->end_tick, end, __ATOMIC_RELAXED);
    __atomic_store_n(&op.slot->state, status == BALLAST_OK ? BALLAST_TRACE_DONE : BALLAST_TRACE_FAILED,
                     __ATOMIC_RELEASE);
    op.slot = nullptr;
  }
  op.status = status;
  op.msg = msg;
  c->busy = false;
  return status;
}

std::string op_words(const Op& op) {
  const Comm* c = op.comm;
  return std::string(ballast_op_name(op.args.op)) + " seq " + std::to_string(op.seq) + " (comm " + hex(c->id) +
         ", rank " + std::to_string(c->rank) + " of " + std::to_string(c->n) + ", " + std::to_string(op.args.count) +
         " x " + ballast_dtype_name(op.args.dtype) + ")";
}

// ---- building the steps of an operation ----------------------------------

void begin_step(Op& op) {
  Step s;
  s.first = s.last = uint32_t(op.xfers.size());
  op.steps.push_back(s);
}

void add_xfer(Op& op, bool send, int peer, char* buf, size_t len, char* reduce_dst = nullptr) {
  Xfer& x = op.xfers.emplace_back();  // in place: an Xfer is some 500 bytes
  x.send = send;
  x.peer = peer;
  x.buf = buf ? buf : &g_zero_byte;
  x.len = len;
  x.reduce_dst = reduce_dst;
  x.staged = !send && reduce_dst;
  x.nchunks = len == 0 ? 1 : (len + op.chunk - 1) / op.chunk;
  op.steps.back().last = uint32_t(op.xfers.size());
  op.chunks_total += x.nchunks;
}

struct Blocks {
  uint64_t count;
  int n;
  size_t es;
  size_t off(int i) const { return (uint64_t(i) * (count / uint64_t(n)) + std::min<uint64_t>(uint64_t(i), count % uint64_t(n))) * es; }
  size_t len(int i) const { return off(i + 1) - off(i); }
};

int mod(int a, int n) { return ((a % n) + n) % n; }

// The staging buffer of a ring's reducing receives: one slot per chunk in
// flight over all steps, each as large as the largest chunk (block: the
// largest block).
size_t ring_scratch(Op& op, size_t block) {
  op.slot_bytes = std::min(op.chunk, block);
  return kWindow * op.slot_bytes;
}

// Reduce-scatter around the ring over `blocks` of the input `in`, into
// `buf`: afterwards block `rank` of buf holds the reduction over all ranks.
// in may be buf; else buf needs no copy of it first: every block a rank
// receives is one it has not touched yet, so the reduction writes
// buf = in op received, and the first step sends straight from in. Out of
// place, the received chunks land in buf itself, not in a staging slot,
// and are reduced there (buf = in op buf, element by element): no staging
// buffer (8 slots of a chunk, 2 MiB with 256 KiB chunks) adds to the working
// set. From 4 MiB (BALLAST_COMM_RING_DIRECT_BYTES): below, the staging slots
// stay in cache and win. sm, untraced p50, medians of 6-8 alternating runs:
// 4 ranks on 2 CPUs, 4 MiB 3.59 -> 3.19 ms (Open MPI 3.71 ms), 1 MiB the
// same (499 us); 2 ranks, 4 MiB 658 -> 575 us (Open MPI 638 us), but 1 MiB
// 148 -> 158 us, so 1 MiB stays staged.
void ring_reduce_scatter(Op& op, char* buf, const char* in, const Blocks& b, char* scratch) {
  const int n = op.comm->n, r = op.comm->rank;
  op.ring = true;
  for (int s = 0; s < n - 1; ++s) {
    const int sb = mod(r - s - 1, n), rb = mod(r - s - 2, n);
    begin_step(op);
    add_xfer(op, true, mod(r + 1, n), const_cast<char*>(s == 0 ? in : buf) + b.off(sb), b.len(sb));
    if (in != buf && b.count * b.es >= op.comm->w->ring_direct_bytes) {
      add_xfer(op, false, mod(r - 1, n), buf + b.off(rb), b.len(rb), buf + b.off(rb));
      op.xfers.back().staged = false;
      op.xfers.back().reduce_in = in + b.off(rb);
      continue;
    }
    add_xfer(op, false, mod(r - 1, n), scratch, b.len(rb), buf + b.off(rb));
    if (in != buf) op.xfers.back().reduce_in = in + b.off(rb);
  }
}

// Whether [a, a+n) and [b, b+n) overlap without being the same buffer.
bool partly_overlap(const char* a, const char* b, size_t n) { return a != b && a < b + n && b < a + n; }

void ring_allgather(Op& op, char* buf, const Blocks& b) {
  const int n = op.comm->n, r = op.comm->rank;
  op.ring = true;
  for (int s = 0; s < n - 1; ++s) {
    const int sb = mod(r - s, n), rb = mod(r - s - 1, n);
    begin_step(op);
    add_xfer(op, true, mod(r + 1, n), buf + b.off(sb), b.len(sb));
    add_xfer(op, false, mod(r - 1, n), buf + b.off(rb), b.len(rb));
  }
}

// Reduce-scatter by recursive halving, then allgather by recursive doubling
// (n a power of two): 2 log2(n) steps instead of the ring's 2(n - 1), for the
// same bytes on the wire. Each step waits for one partner; when ranks
// outnumber CPUs every wait may cost a trip through the scheduler, so fewer
// steps win at mid sizes: 4 ranks on 2 CPUs, medians of 5-7 runs, sm 256 KiB
// 113 -> 105 us, tcp 64 KiB 140 -> 101 us, 256 KiB 268 -> 238 us (Open MPI:
// 160, 154, 311 us). From 1 MiB the ring is as fast over sm and faster over
// tcp, where the first step's half-size messages would take the rendezvous
// (BALLAST_COMM_HALVING_BYTES: up to 512 KiB). Step k of the halving keeps the half of the current
// blocks that rank's bit k picks, sends the other half to the partner
// (r ^ mask), and reduces what comes back into dst (first step: in + received,
// so dst needs no copy of in). Afterwards rank r owns block r; the doubling
// sends the blocks owned so far and receives the partner's as many.
// Every block is reduced by one rank only, so all ranks end with the same bits.
void halving_doubling(Op& op, char* dst, const char* in, const Blocks& b, char* scratch) {
  const int n = op.comm->n, r = op.comm->rank;
  int lo = 0, len = n;  // the blocks this rank still reduces: [lo, lo + len)
  for (int mask = n / 2; mask >= 1; mask /= 2) {
    len /= 2;
    const int keep = (r & mask) ? lo + len : lo, give = (r & mask) ? lo : lo + len;
    begin_step(op);
    const bool first = mask == n / 2;
    add_xfer(op, false, r ^ mask, scratch, b.off(keep + len) - b.off(keep), dst + b.off(keep));
    if (first && in != dst) op.xfers.back().reduce_in = in + b.off(keep);
    add_xfer(op, true, r ^ mask, const_cast<char*>(first ? in : dst) + b.off(give), b.off(give + len) - b.off(give));
    lo = keep;
  }
  for (int mask = 1; mask < n; mask *= 2) {
    const int theirs = lo ^ mask;  // the partner's blocks start where ours would with that bit flipped
    begin_step(op);
    add_xfer(op, false, r ^ mask, dst + b.off(theirs), b.off(theirs + len) - b.off(theirs));
    add_xfer(op, true, r ^ mask, dst + b.off(lo), b.off(lo + len) - b.off(lo));
    lo = std::min(lo, theirs);
    len *= 2;
  }
}

int build(Op& op) {
  Comm* c = op.comm;
  const ballast_comm_args& a = op.args;
  const int n = c->n, r = c->rank;
  const size_t es = op.esize;
  const size_t bytes = size_t(a.count) * es;
  char* dst = static_cast<char*>(a.recvbuf);
  const char* src = static_cast<const char*>(a.sendbuf);
  auto nomem = [&] { return set_last_error(BALLAST_ENOMEM, "cannot allocate scratch for " + op_words(op)); };
  switch (a.op) {
    case BALLAST_OP_ALLREDUCE: {
      const bool pair = n == 2 && bytes >= c->w->chunk_bytes && bytes <= c->w->pair_bytes;
      const bool ring = n > 1 && bytes > c->w->small_bytes && a.count >= uint64_t(n) && !pair;
      // The ring and the pair swap read a separate input in place; the others work in dst.
      if (bytes && src && src != dst && (!(ring || pair) || partly_overlap(src, dst, bytes))) {
        std::memmove(dst, src, bytes);
        src = dst;
      }
      if (n == 1 || a.count == 0) {
        op.algorithm = BALLAST_ALGO_LOCAL;
        return BALLAST_OK;
      }
      if (pair) {
        // Two ranks swap whole buffers, one message each way as one chunk
        // (over tcp every message, a rendezvous above all, costs a round
        // trip of system calls), and each reduces all of it. Out of place
        // the peer's buffer lands in dst and is reduced there (dst = in op
        // dst); in place through scratch.
        op.algorithm = BALLAST_ALGO_RECURSIVE_DOUBLING;
        op.chunk = std::max(op.chunk, bytes);
        const int peer = 1 - r;
        begin_step(op);
        if (src && src != dst) {
          add_xfer(op, true, peer, const_cast<char*>(src), bytes);
          add_xfer(op, false, peer, dst, bytes, dst);
          op.xfers.back().staged = false;
          op.xfers.back().reduce_in = src;
          return BALLAST_OK;
        }
        char* tmp = c->scratch.get(bytes);
        if (!tmp) return nomem();
        add_xfer(op, true, peer, dst, bytes);
        add_xfer(op, false, peer, tmp, bytes);
        Step& s = op.steps.back();
        s.red_dst = dst;
        s.red_src = tmp;
        s.red_count = a.count;
        return BALLAST_OK;
      }
      if (!ring && n > 2 && n <= 8 && bytes <= c->w->direct_bytes) {
        // Tiny messages in small worlds: every rank sends its input to every
        // other in one round, then reduces all inputs in rank order (the same
        // order on every rank, so every rank gets the same bits). One round
        // instead of log2(n): when ranks outnumber CPUs each round waits for
        // peers to be scheduled. 4 ranks on 2 CPUs, 8 B, median of 9 runs:
        // 6.7 -> 5.7 us (BALLAST_COMM_DIRECT_BYTES: up to 1 KiB).
        op.algorithm = BALLAST_ALGO_PAIRWISE;
        char* all = c->scratch.get(bytes * size_t(n));
        if (!all) return nomem();
        std::memcpy(all + size_t(r) * bytes, dst, bytes);
        begin_step(op);
        for (int k = 1; k < n; ++k) {
          const int from = mod(r - k, n);
          add_xfer(op, false, from, all + size_t(from) * bytes, bytes);
        }
        for (int k = 1; k < n; ++k) add_xfer(op, true, mod(r + k, n), dst, bytes);
        Step& s = op.steps.back();
        s.red_dst = dst;
        s.red_src = all;
        s.red_count = a.count;
        s.red_gathered = n;
        return BALLAST_OK;
      }
      if (!ring) {
        op.algorithm = BALLAST_ALGO_RECURSIVE_DOUBLING;
        char* tmp = c->scratch.get(bytes);
        if (!tmp) return nomem();
        int p = 1;
        while (p * 2 <= n) p *= 2;
        const int extra = n - p;
        if (r >= p) {
          begin_step(op);
          add_xfer(op, true, r - p, dst, bytes);
          begin_step(op);
          add_xfer(op, false, r - p, dst, bytes);
          return BALLAST_OK;
        }
        if (r < extra) {
          begin_step(op);
          add_xfer(op, false, r + p, tmp, bytes, dst);
        }
        for (int mask = 1; mask < p; mask <<= 1) {
          begin_step(op);
          add_xfer(op, true, r ^ mask, dst, bytes);
          add_xfer(op, false, r ^ mask, tmp, bytes);
          op.steps.back().red_dst = dst;
          op.steps.back().red_src = tmp;
          op.steps.back().red_count = a.count;
        }
        if (r < extra) {
          begin_step(op);
          add_xfer(op, true, r + p, dst, bytes);
        }
        return BALLAST_OK;
      }
      const Blocks b{a.count, n, es};
      if (n >= 4 && (n & (n - 1)) == 0 && bytes <= c->w->halving_bytes) {
        op.algorithm = BALLAST_ALGO_RECURSIVE_DOUBLING;
        char* tmp = c->scratch.get(std::min(bytes, kWindow * op.chunk));
        if (!tmp) return nomem();
        halving_doubling(op, dst, src ? src : dst, b, tmp);
        return BALLAST_OK;
      }
      op.algorithm = BALLAST_ALGO_RING;
      char* tmp = c->scratch.get(ring_scratch(op, b.len(0)));
      if (!tmp) return nomem();
      ring_reduce_scatter(op, dst, src ? src : dst, b, tmp);
      ring_allgather(op, dst, b);
      return BALLAST_OK;
    }
    case BALLAST_OP_REDUCE_SCATTER: {
      const Blocks b{a.count * uint64_t(n), n, es};
      if (n == 1 || a.count == 0) {
        if (bytes && src && src != dst) std::memmove(dst, src, bytes);
        op.algorithm = BALLAST_ALGO_LOCAL;
        return BALLAST_OK;
      }
      op.algorithm = BALLAST_ALGO_RING;
      char* acc = c->accum.get(bytes * size_t(n));
      char* tmp = c->scratch.get(ring_scratch(op, bytes));
      if (!acc || !tmp) return nomem();
      ring_reduce_scatter(op, acc, src ? src : dst, b, tmp);
      op.steps.back().copy_dst = dst;
      op.steps.back().copy_src = acc + b.off(r);
      op.steps.back().copy_len = bytes;
      return BALLAST_OK;
    }
    case BALLAST_OP_ALLGATHER: {
      const Blocks b{a.count * uint64_t(n), n, es};
      if (bytes && src && src != dst + b.off(r)) std::memmove(dst + b.off(r), src, bytes);
      if (n == 1 || a.count == 0) {
        op.algorithm = BALLAST_ALGO_LOCAL;
        return BALLAST_OK;
      }
      op.algorithm = BALLAST_ALGO_RING;
      ring_allgather(op, dst, b);
      return BALLAST_OK;
    }
    case BALLAST_OP_BROADCAST: {
      if (bytes && r == a.root && src && src != dst) std::memmove(dst, src, bytes);
      if (n == 1 || a.count == 0) {
        op.algorithm = BALLAST_ALGO_LOCAL;
        return BALLAST_OK;
      }
      op.algorithm = BALLAST_ALGO_BINOMIAL_TREE;
      const int vr = mod(r - a.root, n);
      int mask = 1;
      while (mask < n) {
        if (vr & mask) {
          begin_step(op);
          add_xfer(op, false, mod(vr - mask + a.root, n), dst, bytes);
          break;
        }
        mask <<= 1;
      }
      bool any = false;
      for (mask >>= 1; mask > 0; mask >>= 1)
        if (vr + mask < n) {
          if (!any) begin_step(op);
          any = true;
          add_xfer(op, true, mod(vr + mask + a.root, n), dst, bytes);
        }
      return BALLAST_OK;
    }
    case BALLAST_OP_REDUCE: {
      char* acc = r == a.root ? dst : c->accum.get(bytes);
      if (!acc && bytes) return nomem();
      if (bytes && src && src != acc) std::memmove(acc, src, bytes);
      if (n == 1 || a.count == 0) {
        op.algorithm = BALLAST_ALGO_LOCAL;
        return BALLAST_OK;
      }
      op.algorithm = BALLAST_ALGO_BINOMIAL_TREE;
      char* tmp = c->scratch.get(std::min(bytes, kWindow * op.chunk));
      if (!tmp) return nomem();
      const int vr = mod(r - a.root, n);
      for (int mask = 1; mask < n; mask <<= 1) {
        if (vr & mask) {
          begin_step(op);
          add_xfer(op, true, mod(vr - mask + a.root, n), acc, bytes);
          break;
        }
        if (vr + mask < n) {
          begin_step(op);
          add_xfer(op, false, mod(vr + mask + a.root, n), tmp, bytes, acc);
        }
      }
      return BALLAST_OK;
    }
    case BALLAST_OP_ALLTOALL: {
      if (src == dst && bytes) return set_last_error(BALLAST_EINVAL, "alltoall cannot run in place (sendbuf == recvbuf)");
      if (bytes) std::memcpy(dst + size_t(r) * bytes, src + size_t(r) * bytes, bytes);
      if (n == 1 || a.count == 0) {
        op.algorithm = BALLAST_ALGO_LOCAL;
        return BALLAST_OK;
      }
      op.algorithm = BALLAST_ALGO_PAIRWISE;
      begin_step(op);
      for (int k = 1; k < n; ++k) {
        const int to = mod(r + k, n), from = mod(r - k, n);
        add_xfer(op, true, to, const_cast<char*>(src) + size_t(to) * bytes, bytes);
        add_xfer(op, false, from, dst + size_t(from) * bytes, bytes);
      }
      return BALLAST_OK;
    }
    case BALLAST_OP_BARRIER: {
      op.algorithm = n == 1 ? BALLAST_ALGO_LOCAL : BALLAST_ALGO_DISSEMINATION;
      for (int d = 1; d < n; d <<= 1) {
        begin_step(op);
        add_xfer(op, true, mod(r + d, n), nullptr, 0);
        add_xfer(op, false, mod(r - d, n), nullptr, 0);
      }
      return BALLAST_OK;
    }
    case BALLAST_OP_SEND:
    case BALLAST_OP_RECV: {
      op.algorithm = BALLAST_ALGO_DIRECT;
      begin_step(op);
      add_xfer(op, a.op == BALLAST_OP_SEND, a.root, a.op == BALLAST_OP_SEND ? const_cast<char*>(src) : dst, bytes);
      return BALLAST_OK;
    }
    default:
      return set_last_error(BALLAST_EINVAL, "unknown operation " + std::to_string(a.op));
  }
}

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

int post_chunk(Op& op, Xfer& x) {
  Comm* c = op.comm;
  const size_t k = x.posted;
  Pending& p = x.win[k % kWindow];
  p.off = k * op.chunk;
  p.len = x.len == 0 ? 0 : std::min(op.chunk, x.len - p.off);
  if (!x.staged) p.at = x.buf + p.off;
  else if (op.ring) p.at = x.buf + (op.recvs_posted % kWindow) * op.slot_bytes;
  else p.at = x.buf + (k % kWindow) * op.chunk;
  p.req = nullptr;
  p.done_now = false;
  ucp_request_param_t prm{};
  void* r;
  if (x.send) {
    r = ucp_tag_send_nbx(c->peer(x.peer).ep, p.at, p.len,
                         make_tag(op.seq, uint32_t(c->rank), op.tag_ctx, op.low), &prm);
  } else {
    // Always a request: UCX 1.13 leaves recv_info unset on immediate completion.
    prm.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    r = ucp_tag_recv_nbx(c->w->worker, p.at, p.len, make_tag(op.seq, uint32_t(x.peer), op.tag_ctx, 0),
                         kMatchMask, &prm);
  }
  if (UCS_PTR_IS_ERR(r))  // a peer that failed first has likely said why: fail_peer looks
    return fail_peer(op, op_words(op) + ": cannot " + (x.send ? "send to" : "receive from") + " rank " +
                             std::to_string(x.peer) + ": " + ucs_status_string(UCS_PTR_STATUS(r)));
  if (r) p.req = r;
  else p.done_now = true;
  ++x.posted;
  ++op.chunks_posted;
  if (x.send) ++op.sends_in_flight;
  else ++op.recvs_in_flight, ++op.recvs_posted;
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
  if (st != UCS_OK)
    return fail_peer(op, op_words(op) + ": transfer with " + who() + " failed: " + ucs_status_string(st));
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
  if (op.large && op.slot) {
    // Hang analysis reads progress in milliseconds: the coarse clock (4-7 ns)
    // rather than the exact one (about 25 ns) for every chunk, never before
    // the start. A 2-rank 64 KiB ring completes 4 chunks in some 11 us.
    flush_progress(op);
    put(&op.slot->progress_tick, std::max(trace_tick_coarse(), op.start_tick));
  }
  ++x.completed;
  if (x.send) --op.sends_in_flight;
  else --op.recvs_in_flight;
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
      return fail_peer(op, op_words(op) + ": the connection to rank " + std::to_string(x.peer) + " (pid " +
                               std::to_string(ps.pid) + ") failed: " + ucs_status_string(ps.ep_status));
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
  auto send_of = [&](size_t s) -> Xfer& { return op.xfers[op.steps[s].first]; };
  auto recv_of = [&](size_t s) -> Xfer& { return op.xfers[op.steps[s].first + 1]; };
  for (; op.recv_done < n; ++op.recv_done) {
    Xfer& x = recv_of(op.recv_done);
    if (complete_ready(op, x) < 0) return -1;
    if (x.completed < x.nchunks) break;
  }
  for (; op.send_done < n; ++op.send_done) {
    Xfer& x = send_of(op.send_done);
    if (complete_ready(op, x) < 0) return -1;
    if (x.completed < x.nchunks) break;
  }
  op.cur = std::min(op.send_done, op.recv_done);
  if (op.cur == n) return 1;
  // Receives first: posted before the neighbour's data arrives, it lands in
  // place instead of in UCX's unexpected queue.
  for (; op.recv_next < n; ++op.recv_next) {
    Xfer& x = recv_of(op.recv_next);
    while (x.posted < x.nchunks && op.recvs_in_flight < kWindow)
      if (post_chunk(op, x) != BALLAST_OK) return -1;
    if (x.posted < x.nchunks) break;
  }
  for (; op.send_next < n; ++op.send_next) {
    Xfer& x = send_of(op.send_next);
    const Xfer* feed = op.send_next > 0 ? &recv_of(op.send_next - 1) : nullptr;
    while (x.posted < x.nchunks && op.sends_in_flight < kWindow && (!feed || feed->completed > x.posted))
      if (post_chunk(op, x) != BALLAST_OK) return -1;
    if (x.posted < x.nchunks) break;
  }
  return 0;
}

// One round of progress. 1: done (op.status says how), 0: running.
int progress(Op& op) {
  Comm* c = op.comm;
  op.events = ucp_worker_progress(c->w->worker);
  if (c->abort_flag.load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> lock(c->abort_mu);
    finish(op, BALLAST_EABORTED, op_words(op) + " aborted: " + c->abort_reason, true);
    return 1;
  }
  std::string notice;
  if (control_arrived(c, &notice)) {
    finish(op, BALLAST_EPEER, op_words(op) + " failed: " + notice, false);
    return 1;
  }
  if (op.ring) {
    const int rc = progress_ring(op);
    if (rc < 0) return 1;
    if (rc > 0)  // ring steps carry at most a final copy (reduce-scatter's result)
      for (const Step& s : op.steps)
        if (s.copy_dst) std::memcpy(s.copy_dst, s.copy_src, s.copy_len);
  }
  while (!op.ring && op.cur < op.steps.size()) {
    Step& s = op.steps[op.cur];
    if (!op.step_posted) {
      op.step_posted = true;
      for (uint32_t i = s.first; i < s.last; ++i) {
        Xfer& x = op.xfers[i];
        while (x.posted < x.nchunks && x.posted - x.completed < kWindow)
          if (post_chunk(op, x) != BALLAST_OK) return 1;
      }
    }
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
    if (s.copy_dst) std::memcpy(s.copy_dst, s.copy_src, s.copy_len);
    ++op.cur;
    op.step_posted = false;
  }
  if (op.cur == op.steps.size()) {
    finish(op, BALLAST_OK, "", false);
    return 1;
  }
  if ((++op.iter & 63) == 0) {
    if (op.slot) flush_progress(op);
    const int64_t now = monotonic_ns();
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

int validate(Comm* c, const ballast_comm_args* a) {
  if (!a || a->size < offsetof(ballast_comm_args, stream)) return set_last_error(BALLAST_EINVAL, "args is NULL or too short");
  if (a->op == BALLAST_OP_NONE || a->op > BALLAST_OP_BARRIER)
    return set_last_error(BALLAST_EINVAL, "unknown operation " + std::to_string(a->op));
  if (a->op == BALLAST_OP_BARRIER) return BALLAST_OK;
  if (a->dtype >= BALLAST_DT_COUNT) return set_last_error(BALLAST_EINVAL, "unknown dtype " + std::to_string(a->dtype));
  if (a->redop >= BALLAST_RED_COUNT) return set_last_error(BALLAST_EINVAL, "unknown redop " + std::to_string(a->redop));
  const bool rooted = a->op == BALLAST_OP_BROADCAST || a->op == BALLAST_OP_REDUCE || a->op == BALLAST_OP_SEND ||
                      a->op == BALLAST_OP_RECV;
  if (rooted && (a->root < 0 || a->root >= c->n))
    return set_last_error(BALLAST_EINVAL, std::string(ballast_op_name(a->op)) + ": root/peer " + std::to_string(a->root) +
                                              " is out of range for " + std::to_string(c->n) + " ranks");
  if ((a->op == BALLAST_OP_SEND || a->op == BALLAST_OP_RECV) && a->root == c->rank)
    return set_last_error(BALLAST_EINVAL, std::string(ballast_op_name(a->op)) + " to itself (rank " + std::to_string(c->rank) + ")");
  if (a->count == 0) return BALLAST_OK;
  const bool needs_send = a->op == BALLAST_OP_SEND || a->op == BALLAST_OP_ALLTOALL;
  const bool needs_recv = !(a->op == BALLAST_OP_SEND || (a->op == BALLAST_OP_REDUCE && a->root != c->rank));
  if (needs_send && !a->sendbuf) return set_last_error(BALLAST_EINVAL, std::string(ballast_op_name(a->op)) + ": sendbuf is NULL");
  if (needs_recv && !a->recvbuf) return set_last_error(BALLAST_EINVAL, std::string(ballast_op_name(a->op)) + ": recvbuf is NULL");
  if (a->op == BALLAST_OP_REDUCE && a->root != c->rank && !a->sendbuf)
    return set_last_error(BALLAST_EINVAL, "reduce: sendbuf is NULL on a non-root rank");
  return BALLAST_OK;
}

std::shared_ptr<World> make_world(const ballast_comm_config* cfg, std::string* err, int* status) {
  auto str = [](const char* v, const char* env, const char* dflt) {
    if (v && *v) return std::string(v);
    const char* e = std::getenv(env);
    return std::string(e && *e ? e : dflt);
  };
  int rank = cfg && cfg->rank >= 0 ? cfg->rank : int(env_i64("RANK", -1));
  int nranks = cfg && cfg->nranks > 0 ? cfg->nranks : int(env_i64("WORLD_SIZE", 0));
  if (rank < 0 && nranks == 0) {
    rank = 0;
    nranks = 1;  // no launcher: a world of one
  }
  if (nranks <= 0 || nranks > 0xFFFF || rank < 0 || rank >= nranks) {
    *err = "invalid rank " + std::to_string(rank) + " for world size " + std::to_string(nranks) +
           " (RANK must be in [0, WORLD_SIZE), WORLD_SIZE in [1, 65535])";
    *status = BALLAST_EINVAL;
    return nullptr;
  }
  const std::string addr = str(cfg ? cfg->master_addr : nullptr, "MASTER_ADDR", "127.0.0.1");
  const int port = cfg && cfg->master_port > 0 ? cfg->master_port : int(env_i64("MASTER_PORT", 29500));
  int64_t timeout = cfg && cfg->timeout_ns > 0 ? cfg->timeout_ns : env_i64("BALLAST_COMM_TIMEOUT_MS", 300000) * 1000000;
  int64_t init_timeout = cfg && cfg->init_timeout_ns > 0 ? cfg->init_timeout_ns : timeout;
  if (port <= 0 || port > 65535) {
    *err = "invalid MASTER_PORT " + std::to_string(port);
    *status = BALLAST_EINVAL;
    return nullptr;
  }
  const int64_t deadline = monotonic_ns() + init_timeout;
  auto w = std::make_shared<World>();
  w->rank = rank;
  w->nranks = nranks;
  w->timeout_ns = timeout;
  // Over tcp alone, chunks of 512 KiB: a rendezvous there costs a round trip
  // that both ranks must be scheduled for, so fewer and larger ones win
  // (measured with 4 ranks on 2 CPUs, 1 MiB allreduce 1.28 -> 0.94 ms, 4 MiB
  // 5.9 -> 4.4 ms; 2 ranks, 4 MiB 1.60 -> 1.34 ms).
  const bool tcp = tcp_only(std::getenv("UCX_TLS"));
  w->chunk_bytes = size_t(std::max<int64_t>(4096, env_i64("BALLAST_COMM_CHUNK_BYTES", tcp ? 512 << 10 : 256 << 10)));
  w->small_bytes = size_t(std::max<int64_t>(0, env_i64("BALLAST_COMM_SMALL_BYTES", 16 << 10)));
  // Not over tcp alone, where each message costs system calls on both ends:
  // 4 ranks, 8 B allreduce 24 us by recursive doubling, 43 us in one round.
  w->direct_bytes = size_t(std::max<int64_t>(0, env_i64("BALLAST_COMM_DIRECT_BYTES", tcp ? 0 : 1 << 10)));
  w->halving_bytes = size_t(std::max<int64_t>(0, env_i64("BALLAST_COMM_HALVING_BYTES", 512 << 10)));
  // 2 ranks over tcp alone: from a chunk (the rendezvous threshold there)
  // to 1 MiB, an allreduce swaps the whole buffers (one message each way,
  // then each reduces all of it) instead of the ring's reduce-scatter and
  // allgather of halves. Medians of 6 alternating runs: 512 KiB 212 -> 186
  // us, 1 MiB 400 -> 340 us (Open MPI 204 and 324 us); at 2 MiB the ring
  // wins (630 against 690 us), and below a chunk, where the messages go
  // eager (256 KiB: 141 against 102 us).
  w->pair_bytes = size_t(std::max<int64_t>(0, env_i64("BALLAST_COMM_PAIR_BYTES", tcp ? 1 << 20 : 0)));
  w->ring_direct_bytes = size_t(std::max<int64_t>(0, env_i64("BALLAST_COMM_RING_DIRECT_BYTES", 4 << 20)));

  // tcp sockets with 4 MiB buffers from the start (the kernel caps them at
  // net.core.[wr]mem_max) instead of autotuned ones that start at 16 KiB: 2
  // ranks over tcp, 1 MiB allreduce 390-530 -> 300-350 us, 4 MiB 2.1 -> 1.6-1.8 ms.
  // Through the environment, not ucp_config_modify, which does not reach the
  // transports' settings in UCX 1.13; a value the user set is kept.
  if (may_use_tcp(std::getenv("UCX_TLS"))) {  // else UCX warns of unused variables
    setenv("UCX_TCP_SNDBUF", "4M", 0);
    setenv("UCX_TCP_RCVBUF", "4M", 0);
  }
  ucp_config_t* config = nullptr;
  if (ucp_config_read(nullptr, nullptr, &config) != UCS_OK) {
    *err = "cannot read the UCX configuration (UCX_* environment variables)";
    *status = BALLAST_EIO;
    return nullptr;
  }
  // Messages below 64 KiB go eager, not by rendezvous (UCX's own threshold
  // is lower): a rendezvous costs a round trip of control messages, and over
  // tcp its zero-copy put is emulated with active messages. Measured on this
  // 2-CPU VM, 2 ranks, 64 KiB allreduce (two 32 KiB messages per rank): sm
  // 18.0 -> 12.4 us, tcp 88 -> 25 us (Open MPI: 17.7 and 28 us). Chunks of
  // 256 KiB keep the rendezvous, which is better there (no unexpected-queue
  // copies; over sm a single copy through CMA). A user's UCX_RNDV_THRESH wins.
  // Over tcp alone, every message under a full chunk goes eager: 2 ranks,
  // 256 KiB allreduce (128 KiB messages) 125 -> 71 us, 4 ranks 0.7 -> 0.24 ms;
  // full chunks keep the rendezvous (all eager: 16 MiB 7.5 -> 13.5 ms).
  if (!std::getenv("UCX_RNDV_THRESH"))
    ucp_config_modify(config, "RNDV_THRESH", tcp ? std::to_string(w->chunk_bytes).c_str() : "64K");
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG;
  cpu_set_t cpus;
  const int ncpu = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
  // Wakeup support only where ranks may outnumber CPUs (see comm_wait);
  // BALLAST_COMM_BLOCK_US: how long a waiting rank goes without events
  // before it sleeps (-1: never).
  w->block_ns = env_i64("BALLAST_COMM_BLOCK_US", 20) * 1000;
  if (w->block_ns >= 0 && nranks > ncpu) params.features |= UCP_FEATURE_WAKEUP;
  ucs_status_t st = ucp_init(&params, config, &w->ctx);
  ucp_config_release(config);
  if (st != UCS_OK) {
    *err = std::string("ucp_init failed: ") + ucs_status_string(st) + " (check UCX_TLS)";
    *status = BALLAST_EIO;
    return nullptr;
  }
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  if ((st = ucp_worker_create(w->ctx, &wp, &w->worker)) != UCS_OK) {
    *err = std::string("ucp_worker_create failed: ") + ucs_status_string(st);
    *status = BALLAST_EIO;
    return nullptr;
  }
  ucp_address_t* ua = nullptr;
  size_t ua_len = 0;
  if ((st = ucp_worker_get_address(w->worker, &ua, &ua_len)) != UCS_OK) {
    *err = std::string("ucp_worker_get_address failed: ") + ucs_status_string(st);
    *status = BALLAST_EIO;
    return nullptr;
  }
  PeerInfo self;
  self.pid = int32_t(getpid());
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  self.host = host;
  self.address.assign(reinterpret_cast<uint8_t*>(ua), reinterpret_cast<uint8_t*>(ua) + ua_len);
  ucp_worker_release_address(w->worker, ua);
  BootstrapResult boot;
  *status = bootstrap_exchange(rank, nranks, addr, port, self, deadline, &boot, err);
  if (*status != BALLAST_OK) return nullptr;
  w->job_id = boot.job_id;
  w->peers.resize(size_t(nranks));
  for (int i = 0; i < nranks; ++i) {
    PeerState& ps = w->peers[size_t(i)];
    ps.pid = boot.peers[size_t(i)].pid;
    ps.host = boot.peers[size_t(i)].host;
    ps.local = ps.host == self.host;
    if (i == rank) continue;
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(boot.peers[size_t(i)].address.data());
    // Shared memory offers no peer-failure handling in UCX (asking for it
    // would push local peers onto tcp): local peers are watched by pid
    // instead (check_peers), remote ones by UCX.
    ep.err_mode = ps.local ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = ep_error;
    ep.err_handler.arg = &ps;
    if ((st = ucp_ep_create(w->worker, &ep, &ps.ep)) != UCS_OK) {
      *err = "cannot create a UCX endpoint to rank " + std::to_string(i) + ": " + ucs_status_string(st);
      *status = BALLAST_EPEER;
      return nullptr;
    }
  }
  // Oversubscribed when this host's ranks outnumber the CPUs they may run
  // on together: ranks bound one to a CPU each (as mpirun, srun or numactl
  // do) are not, though each one's own mask holds a single CPU.
  std::vector<pid_t> local_pids;
  for (const auto& p : w->peers)
    if (p.local) local_pids.push_back(p.pid);
  const bool oversubscribed = int(local_pids.size()) > cpus_of(local_pids);
  w->yield = env_i64("BALLAST_COMM_YIELD", oversubscribed ? 1 : 0) != 0;
  if (w->yield && (params.features & UCP_FEATURE_WAKEUP) && ucp_worker_get_efd(w->worker, &w->efd) != UCS_OK)
    w->efd = -1;
  const bool trace = !(cfg && (cfg->flags & BALLAST_COMM_NO_TRACE)) && env_i64("BALLAST_TRACE", 1) != 0;
  if (trace) {
    std::string terr;
    w->ring = TraceRing::process_ring(cfg && cfg->trace_dir ? cfg->trace_dir : "", rank, nranks, &terr);
    if (!w->ring) {
      *err = terr;
      *status = BALLAST_EIO;
      return nullptr;
    }
    w->ring->set_closed(false);
    w->exact_ticks = env_i64("BALLAST_TRACE_EXACT", 0) != 0;
  }
  *status = BALLAST_OK;
  return w;
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
  if (cfg && cfg->size < offsetof(ballast_comm_config, trace_dir) + sizeof(const char*))
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
  if (ctx > kMaxContext) return set_last_error(BALLAST_EFULL, "split: more than 2047 communicators were split in this job");
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
  if (c->busy) finish(c->op, BALLAST_EABORTED, "communicator destroyed during " + op_words(c->op), false);
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
  if (!c || !info || info->size < sizeof(ballast_comm_info))
    return set_last_error(BALLAST_EINVAL, "info: comm or info is NULL, or info->size too small");
  info->rank = c->rank;
  info->nranks = c->n;
  info->world_rank = c->w->rank;
  info->comm_id = c->id;
  info->seq = c->seq;
  return BALLAST_OK;
}

int comm_start(Comm* c, const ballast_comm_args* args, ballast_comm_request** req) {
  if (!c || !req) return set_last_error(BALLAST_EINVAL, "start: comm or req is NULL");
  *req = nullptr;
  if (c->busy) return set_last_error(BALLAST_ESTATE, "start: another operation of this communicator is in flight");
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
    }
  }
  if (c->failed != BALLAST_OK)
    return set_last_error(BALLAST_ESTATE, "communicator failed earlier: " + c->failed_msg);
  Op& op = c->op;
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
  op.chunk = std::max<size_t>(op.esize, c->w->chunk_bytes / op.esize * op.esize);
  op.xfers.clear();
  op.steps.clear();
  op.cur = 0;
  op.step_posted = false;
  op.ring = false;
  op.send_next = op.recv_next = op.send_done = op.recv_done = 0;
  op.sends_in_flight = op.recvs_in_flight = 0;
  op.recvs_posted = 0;
  op.iter = 0;
  op.status = BALLAST_OK;
  op.msg.clear();
  const int64_t now = monotonic_ns();
  op.deadline = now + (a.timeout_ns > 0 ? a.timeout_ns : c->w->timeout_ns);
  op.next_live_check = now + 10000000;
  const uint64_t bytes = a.count * op.esize;
  op.large = bytes >= (64u << 10);
  op.exact_ticks = op.large || c->w->exact_ticks;
  op.slot = nullptr;
  op.chunks_total = op.chunks_posted = op.chunks_sent = op.chunks_received = op.chunks_reduced = 0;
  op.bytes_sent = op.bytes_received = 0;
  c->busy = true;
  if (int rc = build(op); rc != BALLAST_OK) {
    const std::string m = last_error();
    finish(op, rc, m, false);
    c->failed = BALLAST_OK;  // a local argument error leaves the communicator usable
    return set_last_error(rc, m);
  }
  if (c->trace) {
    // Written straight into the slot, each of its 3 cache lines once, in
    // order (gen stays 0 until publish): no copy through the stack.
    // The start is the exact clock read above for the deadline (the ring's
    // timeline is CLOCK_MONOTONIC too): no second read of the clock.
    ballast_trace_slot* s = c->w->ring->claim(&op.slot_index);
    op.start_tick = uint64_t(now);
    *s = ballast_trace_slot{.gen = 0,
                            .comm_id = c->id,
                            .seq = op.seq,
                            .count = a.count,
                            .bytes = bytes,
                            .op = a.op,
                            .dtype = a.dtype,
                            .redop = a.redop,
                            .algorithm = op.algorithm,
                            .rank = c->rank,
                            .nranks = c->n,
                            .world_rank = c->w->rank,
                            .peer = (a.op == BALLAST_OP_BROADCAST || a.op == BALLAST_OP_REDUCE || p2p) ? a.root : -1,
                            .state = BALLAST_TRACE_STARTED,
                            .status = BALLAST_OK,
                            .flags = p2p ? uint32_t(BALLAST_TRACE_P2P) : 0u,
                            .wait_peer = -1,
                            .send_peer = -1,
                            .steps = uint32_t(op.steps.size()),
                            .step = 0,
                            .reserved0 = 0,
                            .issue_tick = op.start_tick,
                            .start_tick = op.start_tick,
                            .end_tick = 0,
                            .progress_tick = op.start_tick,
                            .chunks_total = op.chunks_total,
                            .chunks_posted = 0,
                            .chunks_sent = 0,
                            .chunks_received = 0,
                            .chunks_reduced = 0,
                            .bytes_sent = 0,
                            .bytes_received = 0};
    TraceRing::publish(s, op.slot_index);
    op.slot = s;
  }
  *req = reinterpret_cast<ballast_comm_request*>(&op);
  return BALLAST_OK;
}

int comm_test(ballast_comm_request* req, int* done) {
  if (!req || !done) return set_last_error(BALLAST_EINVAL, "test: req or done is NULL");
  Op& op = *reinterpret_cast<Op*>(req);
  *done = op.comm->busy ? progress(op) : 1;
  if (!*done) return BALLAST_OK;
  return set_last_error(op.status, op.msg);
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
  World& w = *op.comm->w;
  const bool yield = w.yield;
  int64_t idle_since = 0;
  while (op.comm->busy && !progress(op)) {
    if (!yield) continue;
    if (op.events) {
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
  return set_last_error(op.status, op.msg);
}

int comm_run(Comm* c, const ballast_comm_args* args) {
  ballast_comm_request* req = nullptr;
  const int rc = comm_start(c, args, &req);
  if (rc != BALLAST_OK) return rc;
  return comm_wait(req);
}

}  // namespace ballast::comm
