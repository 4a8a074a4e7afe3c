// NCCL communicators are created non-blocking (config.blocking = 0): every
// call returns at once. A trainer enqueues operations on its stream (a
// bucket of gradients after another) and seldom waits for them on the CPU,
// so each communicator has a watchdog thread: while operations are in
// flight it looks, every few milliseconds, at the CUDA event recorded after
// each, at ncclCommGetAsyncError, at their deadlines and their progress
// (watchdog.hpp decides), and ends them: done, or failed, with
// ncclCommAbort, which also frees the stream of a rank whose peer is gone
// or stuck, and ends the others in flight with the same cause. test/wait
// make the same look themselves and report what the watchdog recorded.
// NCCL allows one thread at a time on a communicator: every NCCL call on
// one, and the state of its operations, are under its mutex.
#include "nccl_comm.hpp"

#include "bootstrap.hpp"
#include "host_error.hpp"
#include "nccl_profiler.hpp"
#include "trace_ring.hpp"
#include "watchdog.hpp"

#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace ballast::comm_nccl {

using ballast::comm::monotonic_ns;
using ballast::comm::trace_tick;
using ballast::comm::TraceRing;

namespace {

thread_local std::string t_error;
int fail(int status, const std::string& msg) {
  t_error = msg;
  if (status != BALLAST_OK) ballast::comm::report_error(msg);
  return status;
}

int64_t env_i64(const char* name, int64_t dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoll(v, nullptr, 10) : dflt;
}

const ncclDataType_t kTypes[BALLAST_DT_COUNT] = {ncclFloat32, ncclFloat64, ncclFloat16, ncclBfloat16,
                                                 ncclInt32,   ncclInt64,   ncclUint8};
const ncclRedOp_t kOps[BALLAST_RED_COUNT] = {ncclSum, ncclProd, ncclMin, ncclMax};

// Operations started and not yet collected by test or wait, as comm-ucx.
constexpr size_t kMaxInFlight = 64;

}  // namespace

struct Comm;

// One operation: running from its start until its outcome is known (the
// watchdog or the owner saw it), then kept until test or wait collects it.
// The caller's request points to it. Made when first needed, reused after.
struct Op {
  Comm* comm = nullptr;
  cudaEvent_t done = nullptr;  // recorded after the operation on its stream
  bool recorded = false;       // the event is on the stream
  bool running = false;
  uint32_t op = 0;
  int32_t peer = -1;
  uint64_t seq = 0;
  int64_t started = 0, deadline = 0;
  ballast_trace_slot* slot = nullptr;  // its record until it ends
  int status = BALLAST_OK;
  std::string msg;
};

struct Comm {
  cudaStream_t stream = nullptr;
  int device = 0;
  int rank = 0, n = 1, world_rank = 0;
  uint64_t id = 0, seq = 0;
  int64_t timeout_ns = 0;
  int64_t period_ns = 0, stall_ns = 0;  // the watchdog's
  TraceRing* ring = nullptr;
  void* barrier_buf = nullptr;
  // Its name in NCCL (ncclConfig_t.commName), under which NCCL's profiler
  // callbacks (progress.cpp) find the operation being enqueued when it is
  // traced.
  std::string nccl_name;
  std::shared_ptr<OpTracker> tracker = std::make_shared<OpTracker>();

  // abort(): any thread, never blocks on mu.
  std::atomic<bool> abort_flag{false};
  std::mutex reason_mu;
  std::string abort_reason;

  // Under mu, shared by the owner thread and the watchdog.
  std::mutex mu;
  std::condition_variable wake;  // the watchdog's: an operation started, abort(), destroy()
  std::thread watchdog;
  bool stopping = false;
  ncclComm_t nccl = nullptr;  // NULL once aborted
  int failed = BALLAST_OK;
  std::string failed_msg;
  std::vector<std::unique_ptr<Op>> ops;  // every Op made
  std::vector<Op*> idle;                 // made and not started, or collected
  std::vector<Op*> running;              // in start order
};

namespace {

std::string abort_reason(Comm* c) {
  std::lock_guard<std::mutex> lock(c->reason_mu);
  return c->abort_reason;
}

// What an operation is, for messages.
std::string describe_op(const Op& op) {
  const Comm* c = op.comm;
  char buf[160];
  const bool p2p = op.op == BALLAST_OP_SEND || op.op == BALLAST_OP_RECV;
  std::snprintf(buf, sizeof buf, "%s %s %lld on communicator %016llx (rank %d of %d)", ballast_op_name(op.op),
                p2p ? "with rank" : "seq", p2p ? static_cast<long long>(op.peer) : static_cast<long long>(op.seq),
                static_cast<unsigned long long>(c->id), c->rank, c->n);
  return buf;
}

// End a running operation with `status`, and its record. Under c->mu (or
// the caller has c to itself).
void end_op(Op& op, int status, const std::string& msg) {
  if (ballast_trace_slot* t = op.slot) {
    const uint64_t end = trace_tick();
    // Seen done while still issued (on another stream than the one ahead
    // of it): it ran, at a time not known closer than its end.
    if (status == BALLAST_OK && t->start_tick == 0) __atomic_store_n(&t->start_tick, end, __ATOMIC_RELAXED);
    t->status = status;
    __atomic_store_n(&t->end_tick, end, __ATOMIC_RELAXED);
    __atomic_store_n(&t->state, status == BALLAST_OK ? BALLAST_TRACE_DONE : BALLAST_TRACE_FAILED, __ATOMIC_RELEASE);
    op.slot = nullptr;
  }
  op.running = false;
  op.status = status;
  op.msg = msg;
  auto& r = op.comm->running;
  r.erase(std::find(r.begin(), r.end(), &op));
}

// Abort c's NCCL communicator once, make every later call report `msg`,
// and end the operations still in flight with it. The caller holds c->mu
// or has c to itself.
void fail_comm(Comm* c, int status, const std::string& msg) {
  if (c->failed == BALLAST_OK) {
    c->failed = status;
    c->failed_msg = msg;
  }
  if (c->nccl) ncclCommAbort(c->nccl);  // unblocks this rank's kernels; peers see the error or time out
  c->nccl = nullptr;
  while (!c->running.empty()) {
    Op& op = *c->running.front();
    end_op(op, status, describe_op(op) + " did not complete: " + msg);
  }
}

// An operation enqueued behind others waits for them on the GPU: its record
// says issued until the one before it ended, then started from the moment
// that was seen (by the watchdog or the owner: up to a period late), as a
// collective queued in comm-ucx. The hang analysis places a rank at the
// operation it runs, not at those queued behind it. Under c->mu.
void start_next(Comm* c) {
  if (c->running.empty()) return;
  ballast_trace_slot* t = c->running.front()->slot;
  if (!t || __atomic_load_n(&t->state, __ATOMIC_RELAXED) != BALLAST_TRACE_ISSUED) return;
  const uint64_t now = trace_tick();
  __atomic_store_n(&t->start_tick, now, __ATOMIC_RELAXED);
  __atomic_store_n(&t->progress_tick, std::max(now, __atomic_load_n(&t->progress_tick, __ATOMIC_RELAXED)),
                   __ATOMIC_RELAXED);
  __atomic_store_n(&t->state, BALLAST_TRACE_STARTED, __ATOMIC_RELEASE);
}

// End op as failed: the communicator is aborted, and the others in flight
// end with op's message (those still issued never started).
void fail_op(Op& op, int status, const std::string& msg) {
  end_op(op, status, msg);
  fail_comm(op.comm, status, msg);
}

// An idle operation of c, made (with its event) when none is; NULL with
// t_error set when CUDA cannot make the event. Under c->mu.
Op* take_op(Comm* c) {
  if (c->idle.empty()) {
    auto op = std::make_unique<Op>();
    if (const cudaError_t e = cudaEventCreateWithFlags(&op->done, cudaEventDisableTiming); e != cudaSuccess) {
      fail(BALLAST_EIO, std::string("start: cannot create a CUDA event: ") + cudaGetErrorString(e));
      return nullptr;
    }
    op->comm = c;
    c->ops.push_back(std::move(op));
    c->idle.push_back(c->ops.back().get());
  }
  Op* op = c->idle.back();
  c->idle.pop_back();
  return op;
}

// Give a collected operation back to c and return its status, its message
// in t_error. Under c->mu.
int collect(Op& op) {
  op.comm->idle.push_back(&op);
  return fail(op.status, op.msg);
}

// Wait for a non-blocking NCCL call on c (init, split, finalize) to leave
// ncclInProgress. A failure aborts c, and the operation in flight with it.
// The caller holds c->mu or has c to itself.
int settle(Comm* c, int64_t deadline, const std::string& what) {
  while (true) {
    ncclResult_t st = ncclSuccess;
    if (ncclCommGetAsyncError(c->nccl, &st) != ncclSuccess) st = ncclInternalError;
    if (st == ncclSuccess) return BALLAST_OK;
    int status = BALLAST_OK;
    std::string m;
    if (st != ncclInProgress) {
      status = BALLAST_EPEER;
      m = what + " failed: " + ncclGetErrorString(st) + ": " + ncclGetLastError(c->nccl);
    } else if (c->abort_flag.load()) {
      status = BALLAST_EABORTED;
      m = what + " aborted: " + abort_reason(c);
    } else if (monotonic_ns() > deadline) {
      status = BALLAST_ETIMEDOUT;
      m = what + " timed out (NCCL still in progress)";
    } else {
      usleep(100);
      continue;
    }
    m += "; ncclCommAbort was called on the communicator";
    fail_comm(c, status, m);
    return fail(status, m);
  }
}

// A name unique in the process, and known to the profiler when traced.
std::string nccl_name(uint64_t id, const std::shared_ptr<OpTracker>& tracker, bool traced) {
  static std::atomic<uint32_t> serial{0};
  char buf[64];
  std::snprintf(buf, sizeof buf, "ballast-%016llx-%u", static_cast<unsigned long long>(id), serial.fetch_add(1));
  if (traced) track(buf, tracker);
  return buf;
}

Comm* new_comm(int device, int rank, int n, int world_rank, uint64_t id, int64_t timeout, TraceRing* ring) {
  auto* c = new Comm();
  c->nccl_name = nccl_name(id, c->tracker, ring != nullptr);
  c->device = device;
  c->rank = rank;
  c->n = n;
  c->world_rank = world_rank;
  c->id = id;
  c->timeout_ns = timeout;
  c->period_ns = watchdog_period_ns();
  c->stall_ns = stall_ns();
  c->ring = ring;
  cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
  cudaMalloc(&c->barrier_buf, 16);
  return c;
}

// One look at the operations in flight, in start order: each whose outcome
// is known ends (a failure ends them all). While NCCL is still in progress
// (a communicator connecting), says so in *in_progress. Under c->mu.
void look(Comm* c, bool* in_progress = nullptr) {
  OpState s;
  s.now = monotonic_ns();
  s.stall_ns = c->stall_ns;
  s.abort_requested = c->abort_flag.load();
  ncclResult_t st = ncclSuccess;
  if (c->nccl && ncclCommGetAsyncError(c->nccl, &st) != ncclSuccess) st = ncclInternalError;
  s.nccl = st == ncclSuccess ? NcclState::ok : st == ncclInProgress ? NcclState::in_progress : NcclState::error;
  if (in_progress) *in_progress = s.nccl == NcclState::in_progress;
  for (size_t i = 0; i < c->running.size();) {
    Op& op = *c->running[i];
    s.started = op.started;
    s.deadline = op.deadline;
    s.last_progress = 0;
    const cudaError_t q = op.recorded ? cudaEventQuery(op.done) : cudaErrorNotReady;
    s.event = q == cudaSuccess ? EventState::done : q == cudaErrorNotReady ? EventState::pending : EventState::error;
    if (op.slot && op.slot->start_tick) {  // a queued one (issued) has no start: its deadline alone applies
      const uint64_t p = __atomic_load_n(&op.slot->progress_tick, __ATOMIC_RELAXED);
      if (p > op.slot->start_tick) s.last_progress = int64_t(p);  // both CLOCK_MONOTONIC ns
    }
    const Verdict v = decide(s);
    if (v == Verdict::running) {
      ++i;
      continue;
    }
    if (v == Verdict::done) {
      end_op(op, BALLAST_OK, "");  // out of running: i is the next one now
      if (i == 0) start_next(c);
      continue;
    }
    std::string detail;
    if (v == Verdict::aborted) detail = abort_reason(c);
    if (v == Verdict::nccl_error) detail = std::string(ncclGetErrorString(st)) + ": " + ncclGetLastError(c->nccl);
    if (v == Verdict::cuda_error) detail = cudaGetErrorString(q);
    fail_op(op, status_of(v), describe(v, describe_op(op), s, detail));
    return;
  }
}

// The watchdog thread of c: sleeps while nothing is in flight, else looks
// at the operations every period_ns. Runs until destroy() sets stopping.
void watch(Comm* c) {
  cudaSetDevice(c->device);  // for cudaEventQuery; NCCL's calls set their own
  std::unique_lock<std::mutex> lock(c->mu);
  while (!c->stopping) {
    if (c->running.empty()) {
      c->wake.wait(lock, [c] { return c->stopping || !c->running.empty(); });
      continue;
    }
    c->wake.wait_for(lock, std::chrono::nanoseconds(c->period_ns), [c] { return c->stopping || c->abort_flag.load(); });
    if (!c->stopping) look(c);
  }
}

int start_watchdog(Comm* c) {
  try {
    c->watchdog = std::thread(watch, c);
  } catch (const std::system_error& e) {
    return fail(BALLAST_EIO, std::string("cannot start the watchdog thread: ") + e.what());
  }
  return BALLAST_OK;
}

void c_destroy(ballast_comm* comm);

int c_init(void*, const ballast_comm_config* cfg, ballast_comm** out) {
  if (!out) return fail(BALLAST_EINVAL, "init: comm is NULL");
  *out = nullptr;
  // Before any NCCL communicator of the process: NCCL reads the variable then.
  static std::once_flag profiler_once;
  if (!(cfg && (cfg->flags & BALLAST_COMM_NO_TRACE)) && env_i64("BALLAST_TRACE", 1) != 0)
    std::call_once(profiler_once, [] {
      std::string why;
      use_as_profiler(&why);  // without it records carry no chunk counters: not an error
    });
  int devices = 0;
  const cudaError_t ce = cudaGetDeviceCount(&devices);
  if (ce != cudaSuccess || devices == 0)
    return fail(BALLAST_ENOSYS,
                std::string("no CUDA device: ") + (ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices"));
  int rank = cfg && cfg->rank >= 0 ? cfg->rank : int(env_i64("RANK", 0));
  int n = cfg && cfg->nranks > 0 ? cfg->nranks : int(env_i64("WORLD_SIZE", 1));
  if (n <= 0 || rank < 0 || rank >= n)
    return fail(BALLAST_EINVAL, "invalid rank " + std::to_string(rank) + " for world size " + std::to_string(n));
  const int device = int(env_i64("LOCAL_RANK", rank)) % devices;
  cudaSetDevice(device);
  const char* ea = std::getenv("MASTER_ADDR");
  const std::string addr = cfg && cfg->master_addr ? cfg->master_addr : ea && *ea ? ea : "127.0.0.1";
  const int port = cfg && cfg->master_port > 0 ? cfg->master_port : int(env_i64("MASTER_PORT", 29500));
  const int64_t timeout =
      cfg && cfg->timeout_ns > 0 ? cfg->timeout_ns : env_i64("BALLAST_COMM_TIMEOUT_MS", 300000) * 1000000;
  const int64_t deadline = monotonic_ns() + (cfg && cfg->init_timeout_ns > 0 ? cfg->init_timeout_ns : timeout);
  // Rank 0's unique id travels in the bootstrap's address field.
  ncclUniqueId uid{};
  if (rank == 0 && ncclGetUniqueId(&uid) != ncclSuccess) return fail(BALLAST_EIO, "ncclGetUniqueId failed");
  ballast::comm::PeerInfo self;
  self.pid = int32_t(getpid());
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  self.host = host;
  self.address.assign(reinterpret_cast<uint8_t*>(&uid), reinterpret_cast<uint8_t*>(&uid) + sizeof uid);
  ballast::comm::BootstrapResult boot;
  std::string err;
  if (int rc = ballast::comm::bootstrap_exchange(rank, n, addr, port, self, deadline, &boot, &err); rc != BALLAST_OK)
    return fail(rc, err);
  std::memcpy(&uid, boot.peers[0].address.data(), std::min(sizeof uid, boot.peers[0].address.size()));
  TraceRing* ring = nullptr;
  const bool trace = !(cfg && (cfg->flags & BALLAST_COMM_NO_TRACE)) && env_i64("BALLAST_TRACE", 1) != 0;
  if (trace && !(ring = TraceRing::process_ring("nccl", cfg && cfg->trace_dir ? cfg->trace_dir : "", rank, n, &err)))
    return fail(BALLAST_EIO, err);
  Comm* c = new_comm(device, rank, n, rank, boot.job_id, timeout, ring);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = c->nccl_name.c_str();
  ncclResult_t r = ncclCommInitRankConfig(&c->nccl, n, uid, rank, &config);
  int rc = BALLAST_OK;
  if (r == ncclSuccess || r == ncclInProgress) {
    rc = settle(c, deadline, "ncclCommInitRankConfig");
  } else {
    rc = fail(BALLAST_EIO, std::string("ncclCommInitRankConfig failed: ") + ncclGetErrorString(r));
    fail_comm(c, rc, t_error);  // aborts what NCCL may have handed back
  }
  if (rc == BALLAST_OK) rc = start_watchdog(c);
  if (rc != BALLAST_OK) {
    const std::string m = t_error;
    c_destroy(reinterpret_cast<ballast_comm*>(c));
    return fail(rc, m);
  }
  *out = reinterpret_cast<ballast_comm*>(c);
  return BALLAST_OK;
}

void c_destroy(ballast_comm* comm) {
  auto* c = reinterpret_cast<Comm*>(comm);
  if (!c) return;
  if (c->watchdog.joinable()) {
    {
      std::lock_guard<std::mutex> lock(c->mu);
      c->stopping = true;
    }
    c->wake.notify_all();
    c->watchdog.join();
  }
  // The owner's alone from here.
  if (!c->running.empty()) {
    for (Op* op : std::vector<Op*>(c->running))
      end_op(*op, BALLAST_EABORTED, describe_op(*op) + " cancelled: the communicator was destroyed");
    fail_comm(c, BALLAST_EABORTED, "the communicator was destroyed with operations in flight");
  }
  if (c->nccl) {
    if (c->abort_flag.load()) {
      ncclCommAbort(c->nccl);
    } else {
      ncclCommFinalize(c->nccl);
      if (settle(c, monotonic_ns() + c->timeout_ns, "ncclCommFinalize") == BALLAST_OK) ncclCommDestroy(c->nccl);
    }
  }
  untrack(c->nccl_name);
  cudaFree(c->barrier_buf);
  for (const auto& op : c->ops) cudaEventDestroy(op->done);
  cudaStreamDestroy(c->stream);
  delete c;
}

int c_split(ballast_comm* parent, int32_t colour, int32_t key, ballast_comm** out) {
  auto* p = reinterpret_cast<Comm*>(parent);
  if (!p || !out) return fail(BALLAST_EINVAL, "split: parent or out is NULL");
  *out = nullptr;
  std::unique_lock<std::mutex> lock(p->mu);  // the parent's watchdog may be looking at it
  if (p->abort_flag.load()) return fail(BALLAST_EABORTED, "communicator aborted: " + abort_reason(p));
  if (p->failed != BALLAST_OK) return fail(BALLAST_ESTATE, "communicator failed earlier: " + p->failed_msg);
  // The child exists before NCCL's, so that NCCL's profiler finds it by name.
  Comm* c = new_comm(p->device, 0, 1, p->world_rank, p->id * 31 + uint64_t(colour) + 1, p->timeout_ns, p->ring);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = c->nccl_name.c_str();
  ncclComm_t nc = nullptr;
  ncclResult_t r = ncclCommSplit(p->nccl, colour < 0 ? NCCL_SPLIT_NOCOLOR : colour, key, &nc, &config);
  int rc = r == ncclSuccess || r == ncclInProgress
               ? settle(p, monotonic_ns() + p->timeout_ns, "ncclCommSplit")
               : fail(BALLAST_EIO, std::string("ncclCommSplit failed: ") + ncclGetErrorString(r));
  lock.unlock();
  if (rc == BALLAST_OK && nc) {
    ncclCommUserRank(nc, &c->rank);
    ncclCommCount(nc, &c->n);
    c->nccl = nc;
    rc = start_watchdog(c);
  } else if (nc) {
    ncclCommAbort(nc);  // half made: its parent failed
  }
  if (rc != BALLAST_OK || !nc) {
    const std::string m = t_error;
    c_destroy(reinterpret_cast<ballast_comm*>(c));
    return fail(rc, m);  // BALLAST_OK with *out NULL for BALLAST_COMM_UNDEFINED
  }
  *out = reinterpret_cast<ballast_comm*>(c);
  return BALLAST_OK;
}

int c_abort(ballast_comm* comm, const char* reason) {
  auto* c = reinterpret_cast<Comm*>(comm);
  if (!c) return fail(BALLAST_EINVAL, "abort: comm is NULL");
  {
    std::lock_guard<std::mutex> lock(c->reason_mu);
    if (!c->abort_flag.load()) c->abort_reason = reason ? reason : "abort() was called";
    c->abort_flag.store(true);
  }
  // The watchdog aborts NCCL at once if operations are in flight; else the
  // next start() fails. Without the mutex: a wake-up missed is one period late.
  c->wake.notify_all();
  return BALLAST_OK;
}

int c_info(ballast_comm* comm, ballast_comm_info* info) {
  auto* c = reinterpret_cast<Comm*>(comm);
  if (!c || !info || info->size < BALLAST_COMM_INFO_V1_SIZE) return fail(BALLAST_EINVAL, "info: bad arguments");
  info->rank = c->rank;
  info->nranks = c->n;
  info->world_rank = c->world_rank;
  info->comm_id = c->id;
  info->seq = c->seq;
  if (info->size >= sizeof *info) info->max_in_flight = uint32_t(kMaxInFlight);
  return BALLAST_OK;
}

ncclResult_t enqueue(Comm* c, const ballast_comm_args& a, cudaStream_t s) {
  const ncclDataType_t dt = kTypes[a.dtype];
  const ncclRedOp_t op = kOps[a.redop];
  const size_t es = ballast_dtype_size(a.dtype);
  switch (a.op) {
    case BALLAST_OP_ALLREDUCE:
      return ncclAllReduce(a.sendbuf ? a.sendbuf : a.recvbuf, a.recvbuf, a.count, dt, op, c->nccl, s);
    case BALLAST_OP_BROADCAST:
      return ncclBroadcast(a.sendbuf ? a.sendbuf : a.recvbuf, a.recvbuf, a.count, dt, a.root, c->nccl, s);
    case BALLAST_OP_REDUCE:
      return ncclReduce(a.sendbuf, a.recvbuf, a.count, dt, op, a.root, c->nccl, s);
    case BALLAST_OP_ALLGATHER:
      return ncclAllGather(a.sendbuf, a.recvbuf, a.count, dt, c->nccl, s);
    case BALLAST_OP_REDUCE_SCATTER:
      return ncclReduceScatter(a.sendbuf, a.recvbuf, a.count, dt, op, c->nccl, s);
    case BALLAST_OP_SEND:
      return ncclSend(a.sendbuf, a.count, dt, a.root, c->nccl, s);
    case BALLAST_OP_RECV:
      return ncclRecv(a.recvbuf, a.count, dt, a.root, c->nccl, s);
    case BALLAST_OP_BARRIER:
      return ncclAllReduce(c->barrier_buf, c->barrier_buf, 1, ncclInt32, ncclSum, c->nccl, s);
    case BALLAST_OP_ALLTOALL: {
      ncclGroupStart();
      for (int p = 0; p < c->n; ++p) {
        ncclSend(static_cast<const char*>(a.sendbuf) + size_t(p) * a.count * es, a.count, dt, p, c->nccl, s);
        ncclRecv(static_cast<char*>(a.recvbuf) + size_t(p) * a.count * es, a.count, dt, p, c->nccl, s);
      }
      return ncclGroupEnd();
    }
    default:
      return ncclInvalidArgument;
  }
}

int c_start(ballast_comm* comm, const ballast_comm_args* args, ballast_comm_request** req) {
  auto* c = reinterpret_cast<Comm*>(comm);
  if (!c || !args || !req || args->size < BALLAST_COMM_ARGS_V1_SIZE)
    return fail(BALLAST_EINVAL, "start: bad arguments");
  *req = nullptr;
  if (args->op == BALLAST_OP_NONE || args->op > BALLAST_OP_BARRIER || args->dtype >= BALLAST_DT_COUNT ||
      args->redop >= BALLAST_RED_COUNT)
    return fail(BALLAST_EINVAL, "start: unknown op, dtype or redop");
  std::lock_guard<std::mutex> lock(c->mu);
  if (c->abort_flag.load()) return fail(BALLAST_EABORTED, "communicator aborted: " + abort_reason(c));
  // Operations in flight may have ended since the watchdog's last look; if
  // one failed (then or earlier, unseen by the caller), that is the news.
  if (!c->running.empty()) look(c);
  if (c->failed != BALLAST_OK) return fail(BALLAST_ESTATE, "communicator failed earlier: " + c->failed_msg);
  if (c->ops.size() - c->idle.size() >= kMaxInFlight)
    return fail(BALLAST_EFULL, "start: " + std::to_string(kMaxInFlight) +
                                   " operations of this communicator are started and not yet completed by test or "
                                   "wait, the most it takes");
  Op* op = take_op(c);
  if (!op) return BALLAST_EIO;
  ballast_comm_args a{};
  std::memcpy(&a, args, std::min<size_t>(args->size, sizeof a));
  cudaStream_t s = args->size >= sizeof a && a.stream ? static_cast<cudaStream_t>(a.stream) : c->stream;
  const bool p2p = a.op == BALLAST_OP_SEND || a.op == BALLAST_OP_RECV;
  op->op = a.op;
  op->peer = p2p ? a.root : -1;
  op->seq = p2p ? 0 : ++c->seq;
  op->recorded = false;
  op->running = true;
  op->started = monotonic_ns();
  op->deadline = op->started + (a.timeout_ns > 0 ? a.timeout_ns : c->timeout_ns);
  const bool queued = !c->running.empty();
  c->running.push_back(op);
  uint64_t index = 0;
  // NULL from claim: every slot holds an operation in flight, this one goes unrecorded.
  if (ballast_trace_slot* t = c->ring ? c->ring->claim(&index) : nullptr) {
    std::memset(reinterpret_cast<char*>(t) + sizeof t->gen, 0, sizeof *t - sizeof t->gen);
    t->comm_id = c->id;
    t->seq = op->seq;
    t->count = a.count;
    t->bytes = a.count * ballast_dtype_size(a.dtype);
    t->op = a.op;
    t->dtype = a.dtype;
    t->redop = a.redop;
    t->algorithm = BALLAST_ALGO_NCCL;
    t->rank = c->rank;
    t->nranks = c->n;
    t->world_rank = c->world_rank;
    t->peer = (a.op == BALLAST_OP_BROADCAST || a.op == BALLAST_OP_REDUCE || p2p) ? a.root : -1;
    t->state = queued ? BALLAST_TRACE_ISSUED : BALLAST_TRACE_STARTED;
    t->flags = p2p ? BALLAST_TRACE_P2P : 0;
    t->wait_peer = t->send_peer = -1;
    t->steps = 1;
    t->issue_tick = t->progress_tick = trace_tick();
    t->start_tick = queued ? 0 : t->issue_tick;
    TraceRing::publish(t, index);
    op->slot = t;
    // NCCL's profiler binds the events it starts while enqueuing (one per
    // collective, send or receive) to this record; later events follow them.
    c->tracker->begin(c->ring, t, index);
  }
  const ncclResult_t r = enqueue(c, a, s);
  if (r != ncclSuccess && r != ncclInProgress) {
    c->tracker->end();
    fail_op(*op, BALLAST_EIO, std::string(ballast_op_name(a.op)) + ": NCCL refused it: " + ncclGetErrorString(r));
    return collect(*op);
  }
  // A communicator still connecting returns ncclInProgress, and NCCL puts
  // the kernels on the stream (and starts the operation's profiler events)
  // only once it leaves that state: an event recorded before would pass at
  // once, and so would the caller's next kernels. Wait here, within the
  // deadline and abort().
  for (bool in_progress = r == ncclInProgress; in_progress && op->running; usleep(100)) look(c, &in_progress);
  c->tracker->end();
  if (!op->running) return collect(*op);  // failed while NCCL was in progress
  if (const cudaError_t e = cudaEventRecord(op->done, s); e != cudaSuccess) {
    fail_op(*op, BALLAST_EIO, describe_op(*op) + ": cudaEventRecord failed: " + cudaGetErrorString(e));
    return collect(*op);
  }
  op->recorded = true;
  c->wake.notify_one();
  *req = reinterpret_cast<ballast_comm_request*>(op);
  return BALLAST_OK;
}

int c_test(ballast_comm_request* req, int* done) {
  auto* op = reinterpret_cast<Op*>(req);
  if (!op || !done) return fail(BALLAST_EINVAL, "test: bad arguments");
  std::lock_guard<std::mutex> lock(op->comm->mu);
  if (op->running) look(op->comm);
  *done = op->running ? 0 : 1;
  return *done ? collect(*op) : BALLAST_OK;
}

int c_wait(ballast_comm_request* req) {
  auto* op = reinterpret_cast<Op*>(req);
  if (!op) return fail(BALLAST_EINVAL, "wait: req is NULL");
  while (true) {
    {
      std::lock_guard<std::mutex> lock(op->comm->mu);
      if (op->running) look(op->comm);
      if (!op->running) return collect(*op);
    }
    usleep(20);
  }
}

int c_run(ballast_comm* comm, const ballast_comm_args* args) {
  ballast_comm_request* req = nullptr;
  const int rc = c_start(comm, args, &req);
  return rc != BALLAST_OK ? rc : c_wait(req);
}

const char* c_last_error(void*) { return t_error.c_str(); }

const ballast_comm_api kApi = {sizeof(ballast_comm_api),
                               0,
                               c_init,
                               c_split,
                               c_destroy,
                               c_abort,
                               c_info,
                               c_start,
                               c_test,
                               c_wait,
                               c_run,
                               c_last_error};

}  // namespace

const char* last_error() { return t_error.c_str(); }
const ballast_comm_api* api() { return &kApi; }

}  // namespace ballast::comm_nccl
