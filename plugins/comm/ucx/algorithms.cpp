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

// The steps and transfers of op (0, or a failure).
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
      const bool pair = n == 2 && bytes >= c->w->pair_min_bytes && bytes <= c->w->pair_bytes &&
                        (c->w->tcp_only || c->peer(1 - r).local);
      const bool ring = n > 1 && bytes > c->w->small_bytes && a.count >= uint64_t(n) && !pair;
      // The ring and the pair swap read a separate input in place; the others work in dst.
      if (bytes && src && src != dst && (!(ring || pair) || partly_overlap(src, dst, bytes))) {
        copy_first(op, dst, src, bytes);
        src = dst;
      }
      if (n == 1 || a.count == 0) {
        op.algorithm = BALLAST_ALGO_LOCAL;
        return BALLAST_OK;
      }
      if (pair) {
        // Two ranks swap whole buffers, one message each way as one chunk
        // (over tcp every message, a rendezvous above all, costs a round
        // trip of system calls; on one host each wait may cost a trip
        // through a busy scheduler), and each reduces all of it (see
        // BALLAST_COMM_PAIR_BYTES in world.cpp). Out of place
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
        copy_first(op, all + size_t(r) * bytes, dst, bytes);
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
        if (bytes && src && src != dst) copy_first(op, dst, src, bytes);
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
      if (bytes && src && src != dst + b.off(r)) copy_first(op, dst + b.off(r), src, bytes);
      if (n == 1 || a.count == 0) {
        op.algorithm = BALLAST_ALGO_LOCAL;
        return BALLAST_OK;
      }
      op.algorithm = BALLAST_ALGO_RING;
      ring_allgather(op, dst, b);
      return BALLAST_OK;
    }
    case BALLAST_OP_BROADCAST: {
      if (bytes && r == a.root && src && src != dst) copy_first(op, dst, src, bytes);
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
      if (bytes && src && src != acc) copy_first(op, acc, src, bytes);
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
      if (bytes) copy_first(op, dst + size_t(r) * bytes, src + size_t(r) * bytes, bytes);
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

}  // namespace

// A trainer repeats the same collectives on the same buffers: the plan of
// this Op's last operation is kept when that had the same arguments and the
// communicator's scratch buffers are where they were (one that grew since
// may have moved). Callgrind, 8-byte allreduce on rank 0 over sm: building
// it took 314 instructions of 2,215 an operation; keeping it, 1,999 in all.
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
