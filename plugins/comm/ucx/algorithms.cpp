// The algorithms: each operation built as steps of chunked transfers, with
// the reductions and copies that follow each step.
#include "engine.hpp"

#include <cstdint>

namespace ballast::comm {

namespace {

char g_zero_byte = 0;  // where a transfer of 0 bytes points

// Recorded, not done: plan() does the copies of every operation, of a kept
// plan too, in this order.
void copy_first(Op& op, char* dst, const char* src, size_t len) { op.copies[op.ncopies++] = {dst, src, len}; }

void begin_step(Op& op) {
  Step s;
  s.first = s.last = uint32_t(op.xfers.size());
  op.steps.push_back(s);
}

void add_xfer(Op& op, bool send, int peer, char* buf, size_t len, char* reduce_dst = nullptr) {
  Xfer& x = op.xfers.emplace_back();  // in place: an Xfer is some 500 bytes, its window left unwritten
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
  size_t off(int i) const {
    return (uint64_t(i) * (count / uint64_t(n)) + std::min<uint64_t>(uint64_t(i), count % uint64_t(n))) * es;
  }
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

// What every builder below reads: the operation, its communicator and its
// buffers. src becomes dst once an input was copied there first.
struct Build {
  Op& op;
  Comm* c;
  const ballast_comm_args& a;
  int n, r;
  size_t es, bytes;
  char* dst;
  const char* src;

  explicit Build(Op& o)
      : op(o),
        c(o.comm),
        a(o.args),
        n(o.comm->n),
        r(o.comm->rank),
        es(o.esize),
        bytes(size_t(o.args.count) * o.esize),
        dst(static_cast<char*>(o.args.recvbuf)),
        src(static_cast<const char*>(o.args.sendbuf)) {}

  int nomem() const { return set_last_error(BALLAST_ENOMEM, "cannot allocate scratch for " + op_words(op)); }
  // Nothing to exchange: a world of one or no elements.
  bool local() const { return n == 1 || a.count == 0; }
};

// Two ranks swap whole buffers, one message each way as one chunk (over tcp
// every message, a rendezvous above all, costs a round trip of system calls;
// on one host each wait may cost a trip through a busy scheduler), and each
// reduces all of it (see BALLAST_COMM_PAIR_BYTES in world.cpp). Out of place
// the peer's buffer lands in dst and is reduced there (dst = in op dst); in
// place through scratch.
int allreduce_pair(Build& b) {
  Op& op = b.op;
  op.algorithm = BALLAST_ALGO_RECURSIVE_DOUBLING;
  op.chunk = std::max(op.chunk, b.bytes);
  const int peer = 1 - b.r;
  begin_step(op);
  if (b.src && b.src != b.dst) {
    add_xfer(op, true, peer, const_cast<char*>(b.src), b.bytes);
    add_xfer(op, false, peer, b.dst, b.bytes, b.dst);
    op.xfers.back().staged = false;
    op.xfers.back().reduce_in = b.src;
    return BALLAST_OK;
  }
  char* tmp = b.c->scratch.get(b.bytes);
  if (!tmp) return b.nomem();
  add_xfer(op, true, peer, b.dst, b.bytes);
  add_xfer(op, false, peer, tmp, b.bytes);
  Step& s = op.steps.back();
  s.red_dst = b.dst;
  s.red_src = tmp;
  s.red_count = b.a.count;
  return BALLAST_OK;
}

// Tiny messages in small worlds: every rank sends its input to every other in
// one round, then reduces all inputs in rank order (the same order on every
// rank, so every rank gets the same bits). One round instead of log2(n):
// when ranks outnumber CPUs each round waits for peers to be scheduled
// (BALLAST_COMM_DIRECT_BYTES: up to 1 KiB).
int allreduce_direct(Build& b) {
  Op& op = b.op;
  op.algorithm = BALLAST_ALGO_PAIRWISE;
  char* all = b.c->scratch.get(b.bytes * size_t(b.n));
  if (!all) return b.nomem();
  copy_first(op, all + size_t(b.r) * b.bytes, b.dst, b.bytes);
  begin_step(op);
  for (int k = 1; k < b.n; ++k) {
    const int from = mod(b.r - k, b.n);
    add_xfer(op, false, from, all + size_t(from) * b.bytes, b.bytes);
  }
  for (int k = 1; k < b.n; ++k) add_xfer(op, true, mod(b.r + k, b.n), b.dst, b.bytes);
  Step& s = op.steps.back();
  s.red_dst = b.dst;
  s.red_src = all;
  s.red_count = b.a.count;
  s.red_gathered = b.n;
  return BALLAST_OK;
}

// Recursive doubling over the largest power of two of ranks; the ranks
// beyond it hand their input to a partner first and get the result back.
int allreduce_doubling(Build& b) {
  Op& op = b.op;
  op.algorithm = BALLAST_ALGO_RECURSIVE_DOUBLING;
  char* tmp = b.c->scratch.get(b.bytes);
  if (!tmp) return b.nomem();
  const int r = b.r;
  int p = 1;
  while (p * 2 <= b.n) p *= 2;
  const int extra = b.n - p;
  if (r >= p) {
    begin_step(op);
    add_xfer(op, true, r - p, b.dst, b.bytes);
    begin_step(op);
    add_xfer(op, false, r - p, b.dst, b.bytes);
    return BALLAST_OK;
  }
  if (r < extra) {
    begin_step(op);
    add_xfer(op, false, r + p, tmp, b.bytes, b.dst);
  }
  for (int mask = 1; mask < p; mask <<= 1) {
    begin_step(op);
    add_xfer(op, true, r ^ mask, b.dst, b.bytes);
    add_xfer(op, false, r ^ mask, tmp, b.bytes);
    op.steps.back().red_dst = b.dst;
    op.steps.back().red_src = tmp;
    op.steps.back().red_count = b.a.count;
  }
  if (r < extra) {
    begin_step(op);
    add_xfer(op, true, r + p, b.dst, b.bytes);
  }
  return BALLAST_OK;
}

int build_allreduce(Build& b) {
  const World& w = *b.c->w;
  const bool pair =
      b.n == 2 && b.bytes >= w.pair_min_bytes && b.bytes <= w.pair_bytes && (w.tcp_only || b.c->peer(1 - b.r).local);
  const bool ring = b.n > 1 && b.bytes > w.small_bytes && b.a.count >= uint64_t(b.n) && !pair;
  // The ring and the pair swap read a separate input in place; the others work in dst.
  if (b.bytes && b.src && b.src != b.dst && (!(ring || pair) || partly_overlap(b.src, b.dst, b.bytes))) {
    copy_first(b.op, b.dst, b.src, b.bytes);
    b.src = b.dst;
  }
  if (b.local()) {
    b.op.algorithm = BALLAST_ALGO_LOCAL;
    return BALLAST_OK;
  }
  if (pair) return allreduce_pair(b);
  if (!ring && b.n > 2 && b.n <= 8 && b.bytes <= w.direct_bytes) return allreduce_direct(b);
  if (!ring) return allreduce_doubling(b);
  const Blocks blocks{b.a.count, b.n, b.es};
  const char* in = b.src ? b.src : b.dst;
  if (b.n >= 4 && (b.n & (b.n - 1)) == 0 && b.bytes <= w.halving_bytes) {
    b.op.algorithm = BALLAST_ALGO_RECURSIVE_DOUBLING;
    char* tmp = b.c->scratch.get(std::min(b.bytes, kWindow * b.op.chunk));
    if (!tmp) return b.nomem();
    halving_doubling(b.op, b.dst, in, blocks, tmp);
    return BALLAST_OK;
  }
  b.op.algorithm = BALLAST_ALGO_RING;
  char* tmp = b.c->scratch.get(ring_scratch(b.op, blocks.len(0)));
  if (!tmp) return b.nomem();
  ring_reduce_scatter(b.op, b.dst, in, blocks, tmp);
  ring_allgather(b.op, b.dst, blocks);
  return BALLAST_OK;
}

int build_reduce_scatter(Build& b) {
  const Blocks blocks{b.a.count * uint64_t(b.n), b.n, b.es};
  if (b.local()) {
    if (b.bytes && b.src && b.src != b.dst) copy_first(b.op, b.dst, b.src, b.bytes);
    b.op.algorithm = BALLAST_ALGO_LOCAL;
    return BALLAST_OK;
  }
  b.op.algorithm = BALLAST_ALGO_RING;
  char* acc = b.c->accum.get(b.bytes * size_t(b.n));
  char* tmp = b.c->scratch.get(ring_scratch(b.op, b.bytes));
  if (!acc || !tmp) return b.nomem();
  ring_reduce_scatter(b.op, acc, b.src ? b.src : b.dst, blocks, tmp);
  Step& last = b.op.steps.back();
  last.copy_dst = b.dst;
  last.copy_src = acc + blocks.off(b.r);
  last.copy_len = b.bytes;
  return BALLAST_OK;
}

int build_allgather(Build& b) {
  const Blocks blocks{b.a.count * uint64_t(b.n), b.n, b.es};
  char* mine = b.dst + blocks.off(b.r);
  if (b.bytes && b.src && b.src != mine) copy_first(b.op, mine, b.src, b.bytes);
  if (b.local()) {
    b.op.algorithm = BALLAST_ALGO_LOCAL;
    return BALLAST_OK;
  }
  b.op.algorithm = BALLAST_ALGO_RING;
  ring_allgather(b.op, b.dst, blocks);
  return BALLAST_OK;
}

int build_broadcast(Build& b) {
  const int n = b.n, root = b.a.root;
  if (b.bytes && b.r == root && b.src && b.src != b.dst) copy_first(b.op, b.dst, b.src, b.bytes);
  if (b.local()) {
    b.op.algorithm = BALLAST_ALGO_LOCAL;
    return BALLAST_OK;
  }
  b.op.algorithm = BALLAST_ALGO_BINOMIAL_TREE;
  const int vr = mod(b.r - root, n);
  int mask = 1;
  while (mask < n) {
    if (vr & mask) {
      begin_step(b.op);
      add_xfer(b.op, false, mod(vr - mask + root, n), b.dst, b.bytes);
      break;
    }
    mask <<= 1;
  }
  bool any = false;
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (vr + mask < n) {
      if (!any) begin_step(b.op);
      any = true;
      add_xfer(b.op, true, mod(vr + mask + root, n), b.dst, b.bytes);
    }
  return BALLAST_OK;
}

int build_reduce(Build& b) {
  const int n = b.n, root = b.a.root;
  char* acc = b.r == root ? b.dst : b.c->accum.get(b.bytes);
  if (!acc && b.bytes) return b.nomem();
  if (b.bytes && b.src && b.src != acc) copy_first(b.op, acc, b.src, b.bytes);
  if (b.local()) {
    b.op.algorithm = BALLAST_ALGO_LOCAL;
    return BALLAST_OK;
  }
  b.op.algorithm = BALLAST_ALGO_BINOMIAL_TREE;
  char* tmp = b.c->scratch.get(std::min(b.bytes, kWindow * b.op.chunk));
  if (!tmp) return b.nomem();
  const int vr = mod(b.r - root, n);
  for (int mask = 1; mask < n; mask <<= 1) {
    if (vr & mask) {
      begin_step(b.op);
      add_xfer(b.op, true, mod(vr - mask + root, n), acc, b.bytes);
      break;
    }
    if (vr + mask < n) {
      begin_step(b.op);
      add_xfer(b.op, false, mod(vr + mask + root, n), tmp, b.bytes, acc);
    }
  }
  return BALLAST_OK;
}

int build_alltoall(Build& b) {
  const size_t bytes = b.bytes;
  if (bytes) copy_first(b.op, b.dst + size_t(b.r) * bytes, b.src + size_t(b.r) * bytes, bytes);
  if (b.local()) {
    b.op.algorithm = BALLAST_ALGO_LOCAL;
    return BALLAST_OK;
  }
  b.op.algorithm = BALLAST_ALGO_PAIRWISE;
  begin_step(b.op);
  for (int k = 1; k < b.n; ++k) {
    const int to = mod(b.r + k, b.n), from = mod(b.r - k, b.n);
    add_xfer(b.op, true, to, const_cast<char*>(b.src) + size_t(to) * bytes, bytes);
    add_xfer(b.op, false, from, b.dst + size_t(from) * bytes, bytes);
  }
  return BALLAST_OK;
}

int build_barrier(Build& b) {
  b.op.algorithm = b.n == 1 ? BALLAST_ALGO_LOCAL : BALLAST_ALGO_DISSEMINATION;
  for (int d = 1; d < b.n; d <<= 1) {
    begin_step(b.op);
    add_xfer(b.op, true, mod(b.r + d, b.n), nullptr, 0);
    add_xfer(b.op, false, mod(b.r - d, b.n), nullptr, 0);
  }
  return BALLAST_OK;
}

int build_point_to_point(Build& b) {
  const bool send = b.a.op == BALLAST_OP_SEND;
  b.op.algorithm = BALLAST_ALGO_DIRECT;
  begin_step(b.op);
  add_xfer(b.op, send, b.a.root, send ? const_cast<char*>(b.src) : b.dst, b.bytes);
  return BALLAST_OK;
}

// The steps and transfers of op (0, or a failure), by operation.
int build(Op& op) {
  Build b(op);
  switch (op.args.op) {
    case BALLAST_OP_ALLREDUCE:
      return build_allreduce(b);
    case BALLAST_OP_REDUCE_SCATTER:
      return build_reduce_scatter(b);
    case BALLAST_OP_ALLGATHER:
      return build_allgather(b);
    case BALLAST_OP_BROADCAST:
      return build_broadcast(b);
    case BALLAST_OP_REDUCE:
      return build_reduce(b);
    case BALLAST_OP_ALLTOALL:
      return build_alltoall(b);
    case BALLAST_OP_BARRIER:
      return build_barrier(b);
    case BALLAST_OP_SEND:
    case BALLAST_OP_RECV:
      return build_point_to_point(b);
    default:
      return set_last_error(BALLAST_EINVAL, "unknown operation " + std::to_string(op.args.op));
  }
}

}  // namespace

// A trainer repeats the same collectives on the same buffers: the plan of
// this Op's last operation is kept when that had the same arguments and the
// communicator's scratch buffers are where they were (one that grew since
// may have moved). Building a plan is a tenth of a small operation's cost.
int plan(Op& op) {
  const Comm* c = op.comm;
  const PlanKey& k = op.plan_key;
  if (!op.planned || !same_args(k, op.args) || k.scratch != c->scratch.p || k.accum != c->accum.p) {
    op.planned = false;
    op.record_made = false;
    op.chunk = std::max<size_t>(op.esize, c->w->chunk_bytes / op.esize * op.esize);
    op.algorithm = BALLAST_ALGO_NONE;
    op.xfers.clear();
    op.steps.clear();
    op.ncopies = 0;
    op.ring = false;
    op.chunks_total = 0;
    if (int rc = build(op); rc != BALLAST_OK) return rc;
    const ballast_comm_args& a = op.args;  // the scratch buffers after build, which may grow them
    op.plan_key = {a.op, a.dtype, a.redop, a.root, a.count, a.sendbuf, a.recvbuf, c->scratch.p, c->accum.p};
    op.planned = true;
  } else {
    for (Xfer& x : op.xfers) x.posted = x.completed = 0;
  }
  for (uint32_t i = 0; i < op.ncopies; ++i) std::memmove(op.copies[i].dst, op.copies[i].src, op.copies[i].len);
  return BALLAST_OK;
}

}  // namespace ballast::comm
