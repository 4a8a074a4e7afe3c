#include "nccl_profiler.hpp"

#include "trace_ring.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>

namespace ballast::comm_nccl {

namespace {

std::mutex g_mu;
std::map<std::string, std::shared_ptr<OpTracker>>& registry() {
  static std::map<std::string, std::shared_ptr<OpTracker>> r;
  return r;
}

// Every handle given to NCCL starts with its kind: stop and state calls
// bring back only the pointer.
enum class Kind : uint8_t { op, proxy_op, proxy_step, kernel_ch };

// An operation's record as its events saw it when the operation was
// enqueued. Kept in a ring of the communicator's context and never freed
// while NCCL may still use it: NCCL starts a collective's ProxyOp and
// KernelCh events after it stopped the collective's own event (stop means
// enqueued), so the handle must outlive its stop.
struct OpRef {
  Kind kind = Kind::op;
  ballast_trace_slot* slot = nullptr;
  comm::TraceRing* ring = nullptr;
  uint64_t index = 0;
  // Of an operation of a communicator that is not Ballast's, whose record
  // this profiler made (trace_every_communicator): its place in the
  // communicator's order of operations, and its kernel's channels, started
  // and stopped (all stopped: the operation is done).
  uint64_t order = 0;
  uint32_t channels = 0;
  std::atomic<uint32_t> channels_stopped{0};
};

// An operation's record held for this event's stores (TraceRing::hold)
// while its operation runs or waits behind another (issued: NCCL's proxy
// takes its work when it is enqueued), else none: a late event (the
// operation ended, failed, or NCCL went on after our watchdog gave up) or
// a slot the ring has since reused gets no writes, and the slot cannot be
// taken for a newer record between the check and the stores.
// (Copied from the OpRef, which a newer operation may take meanwhile.)
class Live {
 public:
  explicit Live(const OpRef& r) : slot_(r.slot), ring_(r.ring) {
    if (slot_ && ring_ && !ring_->hold(slot_, r.index)) slot_ = nullptr;
  }
  ~Live() {
    if (slot_) ring_->release(slot_);
  }
  Live(const Live&) = delete;
  Live& operator=(const Live&) = delete;
  ballast_trace_slot* slot() const { return slot_; }

 private:
  ballast_trace_slot* slot_;
  comm::TraceRing* ring_;
};

constexpr size_t kOpRefs = 256;  // operations of one communicator whose events may still come

// A communicator the profiler traces on its own (not Ballast's): its
// identity in the records, and its counters. NCCL calls a communicator's
// enqueue callbacks from one thread at a time.
struct Foreign {
  comm::TraceRing* ring = nullptr;  // the process's ring of foreign communicators
  uint64_t comm_id = 0;
  int32_t rank = -1, nranks = 0, world_rank = -1;
  uint64_t seq = 0;                     // collectives so far
  std::map<int32_t, uint64_t> p2p;      // messages so far, by peer and direction (peer * 2 + is_send)
  uint64_t order = 0;                   // operations so far
  std::atomic<uint64_t> done_below{0};  // every operation up to this order is ended
};

struct Context {
  std::shared_ptr<OpTracker> tracker;
  OpRef refs[kOpRefs];
  std::atomic<uint32_t> next{0};
  std::unique_ptr<Foreign> foreign;  // set for a communicator that is not Ballast's
};

// A kernel channel's event: its operation, and for the stop.
struct KernelCh {
  Kind kind = Kind::kernel_ch;
  OpRef* op;
};

std::atomic<bool> g_every{false};    // trace_every_communicator
std::atomic<int> g_foreign_live{0};  // foreign communicators not finalized

// A channel's network work with one peer, and one transfer (chunk) of it:
// freed at their stop, the last call NCCL makes on a handle; a ProxyOp's
// steps start before it stops.
struct ProxyOp {
  Kind kind = Kind::proxy_op;
  const OpRef* op;
  bool send;
};
struct ProxyStep {
  Kind kind = Kind::proxy_step;
  const ProxyOp* parent;
  size_t bytes = 0;       // the transfer size NCCL last gave
  bool received = false;  // a receive's data arrived and was counted
};

Kind kind_of(void* handle) { return *static_cast<const Kind*>(handle); }

void add(uint64_t* field, uint64_t n) { __atomic_fetch_add(field, n, __ATOMIC_RELAXED); }
void touch(ballast_trace_slot* s) { __atomic_store_n(&s->progress_tick, comm::trace_tick(), __ATOMIC_RELAXED); }

void count_received(ProxyStep* step, ballast_trace_slot* s) {
  if (step->received) return;
  step->received = true;
  add(&s->chunks_received, 1);
  add(&s->bytes_received, step->bytes);
}

// The global rank and world size of this process, from torchrun's
// environment; else the communicator's own.
int32_t world_rank(int32_t comm_rank) {
  const char* r = std::getenv("RANK");
  return r && *r ? int32_t(std::atoi(r)) : comm_rank;
}
int32_t world_size(int32_t comm_size) {
  const char* w = std::getenv("WORLD_SIZE");
  return w && *w ? int32_t(std::atoi(w)) : comm_size;
}

uint32_t op_of(const char* func) {
  struct Name {
    const char* nccl;
    uint32_t op;
  };
  static constexpr Name kNames[] = {{"AllReduce", BALLAST_OP_ALLREDUCE},
                                    {"Broadcast", BALLAST_OP_BROADCAST},
                                    {"Reduce", BALLAST_OP_REDUCE},
                                    {"AllGather", BALLAST_OP_ALLGATHER},
                                    {"ReduceScatter", BALLAST_OP_REDUCE_SCATTER},
                                    {"AllToAll", BALLAST_OP_ALLTOALL},
                                    {"Send", BALLAST_OP_SEND},
                                    {"Recv", BALLAST_OP_RECV}};
  for (const auto& n : kNames)
    if (func && std::strcmp(func, n.nccl) == 0) return n.op;
  return BALLAST_OP_NONE;
}

// NCCL's datatype names ("ncclFloat32", ...); a type Ballast has no name for
// counts in bytes (u8), its count scaled.
uint32_t dtype_of(const char* name, uint64_t* count) {
  struct Name {
    const char* nccl;
    uint32_t dtype;
    uint32_t bytes;
  };
  static constexpr Name kNames[] = {
      {"ncclFloat32", BALLAST_DT_F32, 4},   {"ncclFloat", BALLAST_DT_F32, 4},    {"ncclFloat64", BALLAST_DT_F64, 8},
      {"ncclDouble", BALLAST_DT_F64, 8},    {"ncclFloat16", BALLAST_DT_F16, 2},  {"ncclHalf", BALLAST_DT_F16, 2},
      {"ncclBfloat16", BALLAST_DT_BF16, 2}, {"ncclInt32", BALLAST_DT_I32, 4},    {"ncclInt", BALLAST_DT_I32, 4},
      {"ncclInt64", BALLAST_DT_I64, 8},     {"ncclUint8", BALLAST_DT_U8, 1},     {"ncclInt8", BALLAST_DT_U8, 1},
      {"ncclChar", BALLAST_DT_U8, 1},       {"ncclUint32", BALLAST_DT_U8, 4},    {"ncclUint64", BALLAST_DT_U8, 8},
      {"ncclFloat8e4m3", BALLAST_DT_U8, 1}, {"ncclFloat8e5m2", BALLAST_DT_U8, 1}};
  for (const auto& n : kNames)
    if (name && std::strcmp(name, n.nccl) == 0) {
      if (n.dtype == BALLAST_DT_U8) *count *= n.bytes;
      return n.dtype;
    }
  return BALLAST_DT_U8;
}

// The record of an operation of a foreign communicator, made when NCCL
// starts its event while the caller enqueues it: issued (NCCL runs a
// communicator's operations in order: it starts when its kernel does). The
// caller's thread pays a claim and a few stores, no system call or lock.
void begin_foreign(Context* c, const ballast_nccl_prof_descr_v5* d, OpRef* r) {
  Foreign& f = *c->foreign;
  comm::TraceRing* ring = f.ring;
  const bool p2p = d->type == NCCL_PROF_P2P;
  uint64_t count = p2p ? d->p2p.count : d->coll.count;
  const uint32_t op = op_of(p2p ? d->p2p.func : d->coll.func);
  const uint32_t dtype = dtype_of(p2p ? d->p2p.datatype : d->coll.datatype, &count);
  const int32_t peer = p2p ? d->p2p.peer : (op == BALLAST_OP_BROADCAST || op == BALLAST_OP_REDUCE ? d->coll.root : -1);
  r->slot = nullptr;
  r->ring = ring;
  r->order = ++f.order;
  r->channels = p2p ? d->p2p.nChannels : d->coll.nChannels;
  r->channels_stopped.store(0, std::memory_order_relaxed);
  uint64_t index = 0;
  ballast_trace_slot* t = ring->claim(&index);
  if (!t) return;  // every slot in flight: unrecorded (counted in the ring)
  std::memset(reinterpret_cast<char*>(t) + sizeof t->gen, 0, sizeof *t - sizeof t->gen);
  t->comm_id = f.comm_id;
  t->seq = p2p ? ++f.p2p[peer * 2 + (op == BALLAST_OP_SEND)] : ++f.seq;
  t->count = count;
  t->bytes = count * ballast_dtype_size(dtype);
  t->op = op;
  t->dtype = dtype;
  t->algorithm = BALLAST_ALGO_NCCL;
  t->rank = f.rank;
  t->nranks = f.nranks;
  t->world_rank = f.world_rank;
  t->peer = peer;
  t->state = BALLAST_TRACE_ISSUED;
  t->flags = p2p ? BALLAST_TRACE_P2P : 0;
  t->wait_peer = t->send_peer = -1;
  t->steps = 1;
  t->issue_tick = t->progress_tick = comm::trace_tick();
  comm::TraceRing::publish(t, index);
  ring->heartbeat();
  r->index = index;
  r->slot = t;
}

// A foreign operation's kernel began: started. Those before it on the
// communicator are done (NCCL runs them in order), whether or not their
// channels' stops came.
void finish_foreign(OpRef* r);
void start_foreign(Context* c, OpRef* r) {
  {
    const Live live(*r);
    ballast_trace_slot* s = live.slot();
    if (!s || __atomic_load_n(&s->state, __ATOMIC_ACQUIRE) != BALLAST_TRACE_ISSUED) return;  // a later channel
    __atomic_store_n(&s->start_tick, comm::trace_tick(), __ATOMIC_RELAXED);
    __atomic_store_n(&s->state, BALLAST_TRACE_STARTED, __ATOMIC_RELEASE);
  }
  // Once per operation (its first channel), and only over those not known ended.
  const uint64_t below = c->foreign->done_below.exchange(r->order - 1);
  if (below + 1 >= r->order) return;
  for (OpRef& other : c->refs)
    if (other.slot && other.order > below && other.order < r->order) finish_foreign(&other);
}

void finish_foreign(OpRef* r) {
  const Live live(*r);
  ballast_trace_slot* s = live.slot();
  if (!s) return;  // ended already, or its slot reused
  const uint64_t now = comm::trace_tick();
  if (__atomic_load_n(&s->start_tick, __ATOMIC_RELAXED) == 0) __atomic_store_n(&s->start_tick, now, __ATOMIC_RELAXED);
  __atomic_store_n(&s->end_tick, now, __ATOMIC_RELAXED);
  __atomic_store_n(&s->progress_tick, now, __ATOMIC_RELAXED);
  __atomic_store_n(&s->state, BALLAST_TRACE_DONE, __ATOMIC_RELEASE);
}

ncclResult_t prof_init(void** context, uint64_t comm_id, int* mask, const char* name, int, int nranks, int rank,
                       ballast_nccl_logger logfn) {
  *context = nullptr;
  *mask = 0;
  std::shared_ptr<OpTracker> t;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = registry().find(name ? name : "");
    if (it != registry().end()) t = it->second;
  }
  const bool ballasts = name && std::strncmp(name, "ballast-", 8) == 0;  // comm-nccl's: it traces them itself
  if (!t && (ballasts || !g_every.load(std::memory_order_relaxed))) return ncclSuccess;  // no events
  auto* c = new (std::nothrow) Context();
  if (!c) return ncclSuccess;
  c->tracker = std::move(t);
  if (!c->tracker) {
    c->foreign = std::make_unique<Foreign>();
    c->foreign->comm_id = comm_id;
    c->foreign->rank = rank;
    c->foreign->nranks = nranks;
    c->foreign->world_rank = world_rank(rank);
    c->tracker = std::make_shared<OpTracker>();
    std::string err;
    comm::TraceRing* ring =
        comm::TraceRing::process_ring(kStandaloneWriter, "", c->foreign->world_rank, world_size(nranks), &err);
    if (!ring) {
      if (logfn) logfn(2 /* NCCL_LOG_WARN */, ~0ul, __FILE__, __LINE__, "ballast-nccl-profiler: %s", err.c_str());
      delete c;
      return ncclSuccess;
    }
    c->foreign->ring = ring;
    ring->set_closed(false);
    g_foreign_live.fetch_add(1);
  }
  *context = c;
  *mask = NCCL_PROF_COLL | NCCL_PROF_P2P | NCCL_PROF_PROXY_OP | NCCL_PROF_PROXY_STEP | NCCL_PROF_KERNEL_CH;
  return ncclSuccess;
}

ncclResult_t prof_start(void* context, void** handle, ballast_nccl_prof_descr_v5* d) {
  *handle = nullptr;
  auto* c = static_cast<Context*>(context);
  if (!c || !d) return ncclSuccess;
  switch (d->type) {
    case NCCL_PROF_COLL:
    case NCCL_PROF_P2P: {
      OpRef& r = c->refs[c->next.fetch_add(1, std::memory_order_relaxed) % kOpRefs];
      if (c->foreign)
        begin_foreign(c, d, &r);
      else
        r.slot = c->tracker->current(&r.ring, &r.index);
      *handle = &r;
      break;
    }
    case NCCL_PROF_PROXY_OP: {
      // With PXN another process's proxy may report our work: its parent
      // pointer is then an address in that process.
      if (d->proxyOp.pid != getpid() || !d->parentObj || kind_of(d->parentObj) != Kind::op) break;
      auto* p = new ProxyOp{Kind::proxy_op, static_cast<const OpRef*>(d->parentObj), d->proxyOp.isSend != 0};
      const Live live(*p->op);
      if (ballast_trace_slot* s = live.slot()) {
        add(&s->chunks_total, uint64_t(std::max(d->proxyOp.nSteps, 0)));
        __atomic_store_n(p->send ? &s->send_peer : &s->wait_peer, int32_t(d->proxyOp.peer), __ATOMIC_RELAXED);
        touch(s);
      }
      *handle = p;
      break;
    }
    case NCCL_PROF_PROXY_STEP: {
      if (!d->parentObj || kind_of(d->parentObj) != Kind::proxy_op) break;
      auto* step = new ProxyStep{Kind::proxy_step, static_cast<const ProxyOp*>(d->parentObj)};
      const Live live(*step->parent->op);
      if (ballast_trace_slot* s = live.slot()) add(&s->chunks_posted, 1);
      *handle = step;
      break;
    }
    case NCCL_PROF_KERNEL_CH: {
      if (!d->parentObj || kind_of(d->parentObj) != Kind::op) break;
      auto* op = static_cast<OpRef*>(d->parentObj);
      if (c->foreign) start_foreign(c, op);
      {
        const Live live(*op);
        if (ballast_trace_slot* s = live.slot()) touch(s);
      }
      *handle = new (std::nothrow) KernelCh{Kind::kernel_ch, op};  // its stop: a sign of life, or the end
      break;
    }
    default:
      break;
  }
  return ncclSuccess;
}

ncclResult_t prof_state(void* handle, int state, ballast_nccl_prof_state_args_v5* args) {
  if (!handle || kind_of(handle) != Kind::proxy_step) return ncclSuccess;
  auto* step = static_cast<ProxyStep*>(handle);
  if (args) step->bytes = args->proxyStep.transSize;
  const Live live(*step->parent->op);
  ballast_trace_slot* s = live.slot();
  if (!s) return ncclSuccess;
  // A receive's data has arrived once it is flushed to or waits for the GPU.
  if (!step->parent->send && (state == NCCL_PROF_STEP_RECV_FLUSH_WAIT || state == NCCL_PROF_STEP_RECV_GPU_WAIT))
    count_received(step, s);
  touch(s);
  return ncclSuccess;
}

ncclResult_t prof_stop(void* handle) {
  if (!handle) return ncclSuccess;
  switch (kind_of(handle)) {
    case Kind::op: {
      const Live live(*static_cast<OpRef*>(handle));
      if (ballast_trace_slot* s = live.slot()) touch(s);
      break;
    }
    case Kind::proxy_op:
      delete static_cast<ProxyOp*>(handle);
      break;
    case Kind::kernel_ch: {
      auto* k = static_cast<KernelCh*>(handle);
      OpRef* op = k->op;
      delete k;
      // A foreign operation whose every channel stopped is done.
      if (op->channels && op->channels_stopped.fetch_add(1) + 1 >= op->channels) {
        finish_foreign(op);
        break;
      }
      const Live live(*op);
      if (ballast_trace_slot* s = live.slot()) touch(s);
      break;
    }
    case Kind::proxy_step: {
      auto* step = static_cast<ProxyStep*>(handle);
      const Live live(*step->parent->op);
      if (ballast_trace_slot* s = live.slot()) {
        if (step->parent->send) {
          add(&s->chunks_sent, 1);
          add(&s->bytes_sent, step->bytes);
        } else {
          count_received(step, s);
        }
        touch(s);
      }
      delete step;
      break;
    }
  }
  return ncclSuccess;
}

ncclResult_t prof_finalize(void* context) {
  auto* c = static_cast<Context*>(context);
  // The process's last foreign communicator shut down cleanly: its ring says
  // so (a reader tells a clean end from a crash by it).
  if (c && c->foreign && g_foreign_live.fetch_sub(1) == 1) c->foreign->ring->set_closed(true);
  delete c;
  return ncclSuccess;
}

}  // namespace

void trace_every_communicator(bool on) { g_every.store(on, std::memory_order_relaxed); }

void track(const std::string& comm_name, std::shared_ptr<OpTracker> tracker) {
  std::lock_guard<std::mutex> lock(g_mu);
  registry()[comm_name] = std::move(tracker);
}

void untrack(const std::string& comm_name) {
  std::lock_guard<std::mutex> lock(g_mu);
  registry().erase(comm_name);
}

std::string use_as_profiler(std::string* why) {
  const char* env = std::getenv("BALLAST_NCCL_PROGRESS");
  if (env && std::string(env) == "0") {
    *why = "BALLAST_NCCL_PROGRESS=0";
    return "";
  }
  if (const char* theirs = std::getenv("NCCL_PROFILER_PLUGIN"); theirs && *theirs) {
    *why = std::string("NCCL_PROFILER_PLUGIN is set (") + theirs + ")";
    return "";
  }
  Dl_info info{};
  if (!dladdr(reinterpret_cast<const void*>(&ncclProfiler_v5), &info) || !info.dli_fname || !*info.dli_fname) {
    *why = "cannot find the shared object holding ncclProfiler_v5";
    return "";
  }
  // Linked into an executable (the tests) rather than a shared object: NCCL
  // cannot dlopen that.
  char self[PATH_MAX], here[PATH_MAX];
  if (!realpath(info.dli_fname, here)) {
    *why = std::string("cannot resolve ") + info.dli_fname;
    return "";
  }
  if (realpath("/proc/self/exe", self) && std::string(self) == here) {
    *why = "ncclProfiler_v5 is in the executable, not in a shared object NCCL could load";
    return "";
  }
  setenv("NCCL_PROFILER_PLUGIN", here, 0);
  return here;
}

}  // namespace ballast::comm_nccl

extern "C" const ballast_nccl_profiler_v5 ncclProfiler_v5 = {"ballast-progress",
                                                             ballast::comm_nccl::prof_init,
                                                             ballast::comm_nccl::prof_start,
                                                             ballast::comm_nccl::prof_stop,
                                                             ballast::comm_nccl::prof_state,
                                                             ballast::comm_nccl::prof_finalize};
