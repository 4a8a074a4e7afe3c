// The engine's internals, shared by its files: the tag layout, the world
// (one UCX context, worker and endpoint per peer), communicators, and an
// operation as steps of chunked tag transfers. Not installed, not an ABI.
#pragma once

#include "bootstrap.hpp"
#include "trace_ring.hpp"
#include "tsc_clock.hpp"
#include "ucx_comm.hpp"

#include <ucp/api/ucp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>

namespace ballast::comm {

// ---- tags: seq 24 | source rank 16 | context 12 | op 4 | dtype 4 | redop 4 ----
// Receives match seq, source and context; the low 12 bits are compared after
// arrival, so that a peer in another operation is reported, not waited for.
inline constexpr uint64_t kSeqMask = 0xFFFFFF;
inline constexpr uint64_t kSeqControl = 0xFFFFFF;  // never a data seq: seqs wrap at 0xFFFFFF
inline constexpr uint64_t kMatchMask = ~uint64_t(0xFFF);
inline constexpr uint64_t kControlMask = (kSeqMask << 40) | (uint64_t(0xFFF) << 12);
inline constexpr uint32_t kP2PContext = 0x800;
inline constexpr uint32_t kMaxContext = 0x7FF;

inline uint64_t make_tag(uint64_t seq, uint32_t src, uint32_t ctx, uint32_t low) {
  return ((seq & kSeqMask) << 40) | (uint64_t(src & 0xFFFF) << 24) | (uint64_t(ctx & 0xFFF) << 12) | (low & 0xFFF);
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
  bool tcp_only = false;  // UCX_TLS names tcp and no other data transport
  size_t pair_bytes =
      0;  // 2 ranks: allreduce up to this size swaps whole buffers in one message (tcp alone, or one host)
  size_t pair_min_bytes = 128 << 10;  // ... from this size
  size_t direct_bytes = 1 << 10;
  size_t halving_bytes = 512 << 10;
  bool yield = false;     // more local ranks than CPUs: yield while waiting
  int efd = -1;           // the worker's event fd (UCP_FEATURE_WAKEUP) when yield: comm_wait may sleep on it
  int64_t block_ns = -1;  // ... after this long without UCX events (< 0: never sleep)
  size_t ring_direct_bytes =
      4 << 20;                  // from this size, out of place, a ring receives into the output (ring_reduce_scatter)
  bool exact_ticks = false;     // BALLAST_TRACE_EXACT=1: the exact clock for small operations too
  int64_t notices_sent_ns = 0;  // when this rank last told its peers of a failure

  ~World() {
    // A peer that loses its connection to us before it has read our failure
    // notice reports the lost connection instead of the cause (UCX drops
    // what an endpoint had not yet delivered when it fails): keep the
    // connections up, and the worker progressing, until 200 ms after the
    // notice. Seen over tcp in test_comm_ucx_faults under load ("cannot send
    // to rank 1: Endpoint timeout" where rank 1 had reported a mismatch).
    if (notices_sent_ns)
      while (monotonic_ns() < notices_sent_ns + 200000000) ucp_worker_progress(worker);
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

// A chunk posted. No initial values: post_chunk writes every field before
// anything reads it, and the 8 of a transfer are 450 bytes to zero per op.
struct Pending {
  void* req;
  bool done_now;
  size_t off, len;  // of the chunk within the transfer
  char* at;         // where the chunk's bytes are sent from or received to
  ucp_tag_recv_info_t info;
};

struct Xfer {
  Xfer() {}  // user-provided: emplace_back() leaves win as it is instead of zeroing it first
  bool send = false;
  int peer = 0;  // rank in the communicator
  char* buf = nullptr;
  size_t len = 0;
  char* reduce_dst = nullptr;       // receive: reduce each chunk into this
  const char* reduce_in = nullptr;  // ... combined with this (the local input), when not reduce_dst itself
  bool staged = false;  // chunk k lands in a slot of kWindow chunks at buf (kept in cache), not at its offset
  size_t nchunks = 0, posted = 0, completed = 0;
  Pending win[kWindow];
};

struct Step {
  uint32_t first = 0, last = 0;  // xfers
  char* red_dst = nullptr;       // after the step: red_dst op= red_src (red_count elements)
  const char* red_src = nullptr;
  size_t red_count = 0;
  int red_gathered = 0;      // or: red_dst = block 0 op block 1 op ... of red_src (this many blocks)
  char* copy_dst = nullptr;  // then: copy copy_len bytes
  const char* copy_src = nullptr;
  size_t copy_len = 0;
};

// What an operation's plan (its algorithm, steps and transfers) depends on
// besides its communicator: its arguments and where the communicator's
// scratch buffers are.
struct PlanKey {
  uint32_t op = 0, dtype = 0, redop = 0;
  int32_t root = 0;
  uint64_t count = 0;
  const void* sendbuf = nullptr;
  const void* recvbuf = nullptr;
  const char* scratch = nullptr;
  const char* accum = nullptr;
};

inline bool same_args(const PlanKey& k, const ballast_comm_args& a) {
  return k.op == a.op && k.dtype == a.dtype && k.redop == a.redop && k.root == a.root && k.count == a.count &&
         k.sendbuf == a.sendbuf && k.recvbuf == a.recvbuf;
}

// A copy an operation starts with (its input into its output, its own
// block into a gathering buffer), made before its first transfer.
struct Copy {
  char* dst;
  const char* src;
  size_t len;
};

struct Op {
  Comm* comm = nullptr;
  ballast_comm_args args{};
  uint32_t esize = 1;
  uint64_t seq = 0;  // this op's seq (collective or p2p)
  uint32_t tag_ctx = 0;
  uint32_t low = 0;  // op | dtype | redop bits
  uint32_t algorithm = 0;
  // The plan, made by build() and kept for this Op's next operation when
  // that has the same key (plan() in algorithms.cpp).
  size_t chunk = 0;
  std::vector<Xfer> xfers;
  std::vector<Step> steps;
  Copy copies[2];  // at most: an allreduce's input into its output, then its own block of them all
  uint32_t ncopies = 0;
  bool planned = false;
  PlanKey plan_key;
  // The started record of this plan, less what each operation sets (see
  // write_record); made at the plan's first record.
  ballast_trace_slot record{};
  bool record_made = false;
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
  bool exact_ticks = false;  // end the record on the exact clock (else the coarse one, see trace_ring.hpp)
  uint64_t start_tick = 0;   // the record's start: the clock read for the deadline
  // Claimed in the ring at start(), written when the record is; NULL when
  // every slot held an operation in flight (this one goes unrecorded).
  ballast_trace_slot* claimed = nullptr;
  ballast_trace_slot* slot = nullptr;
  uint64_t slot_index = 0;
  // Progress counted here, in the operation's own cache lines, and copied to
  // the trace slot every 100 us while it runs and at its end: an operation
  // done sooner costs the ring one copy.
  uint64_t chunks_total = 0, chunks_posted = 0, chunks_sent = 0, chunks_received = 0, chunks_reduced = 0;
  uint64_t bytes_sent = 0, bytes_received = 0;
  uint64_t chunks_at_refresh = 0;  // sent + received when the record's progress time was last moved
  int64_t next_refresh = 0;        // when the record's progress is next copied
  uint64_t issue_tick = 0;         // when start() was called (the clock read for the deadline)
  bool done = false;               // ended: status and msg are final, the caller has yet to collect it
  int status = BALLAST_OK;
  std::string msg;
};

// Operations started and not yet collected per communicator, at most.
inline constexpr size_t kMaxInFlight = 64;

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
  bool ctrl_arrived = false;  // the control receive completed (control_done)
  ucs_status_t ctrl_status = UCS_OK;
  char notice[512];
  Scratch scratch, accum;
  // Operations in flight. Collectives run one at a time in start order (they
  // share the scratch buffers): the first of `queue` runs, the others wait
  // with their steps not yet made. Sends and receives need no scratch and
  // all run at once, beside the collective. A request is an Op*, pooled:
  // an op returns to `idle` when test or wait hands its result over.
  std::deque<Op*> queue;
  std::vector<Op*> p2p;
  std::vector<std::unique_ptr<Op>> ops;
  std::vector<Op*> idle;
  bool trace = true;
  TscClock clock;  // operations' starts and deadlines, and their ends when exact

  PeerState& peer(int r) { return w->peers[size_t(members[size_t(r)])]; }
};

// algorithms.cpp: op's plan, made or kept, and the copies it starts with
// done (0, or a failure).
int plan(Op& op);

// world.cpp: a world from cfg and the torchrun environment, bootstrapped;
// nullptr with *err and *status on failure.
std::shared_ptr<World> make_world(const ballast_comm_config* cfg, std::string* err, int* status);

// "allreduce seq 7 (comm ..., rank 1 of 4, 1024 x f32)", for messages.
std::string op_words(const Op& op);

}  // namespace ballast::comm
