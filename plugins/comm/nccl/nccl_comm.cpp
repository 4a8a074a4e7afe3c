// NCCL communicators are created non-blocking (config.blocking = 0): every
// call returns at once. A trainer enqueues an operation on its stream and
// seldom waits for it on the CPU, so each communicator has a watchdog
// thread: while an operation is in flight it looks, every few milliseconds,
// at the CUDA event recorded after it, at ncclCommGetAsyncError, at its
// deadline and at its progress (watchdog.hpp decides), and ends it: done,
// or failed, with ncclCommAbort, which also frees the stream of a rank
// whose peer is gone or stuck. test/wait make the same look themselves and
// report what the watchdog recorded. NCCL allows one thread at a time on a
// communicator: every NCCL call on one, and its operation's state, are
// under its mutex.
#include "nccl_comm.hpp"

#include "bootstrap.hpp"
#include "progress.hpp"
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
#include <mutex>
#include <string>
#include <system_error>
#include <thread>

namespace ballast::comm_nccl {

using ballast::comm::monotonic_ns;
using ballast::comm::trace_tick;
using ballast::comm::TraceRing;

namespace {

thread_local std::string t_error;
int fail(int status, const std::string& msg) {
  t_error = msg;
  return status;
}

int64_t env_i64(const char* name, int64_t dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoll(v, nullptr, 10) : dflt;
}

const ncclDataType_t kTypes[BALLAST_DT_COUNT] = {ncclFloat32, ncclFloat64, ncclFloat16, ncclBfloat16,
                                                 ncclInt32,   ncclInt64,   ncclUint8};
const ncclRedOp_t kOps[BALLAST_RED_COUNT] = {ncclSum, ncclProd, ncclMin, ncclMax};

}  // namespace

struct Comm {
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;
  int device = 0;
  int rank = 0, n = 1, world_rank = 0;
  uint64_t id = 0, seq = 0;
  int64_t timeout_ns = 0;
  int64_t period_ns = 0, stall_ns = 0;  // the watchdog's
  TraceRing* ring = nullptr;
  void* barrier_buf = nullptr;
  // Its name in NCCL (ncclConfig_t.commName), under which NCCL's profiler
  // callbacks (progress.cpp) find the operation in flight when it is traced.
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
  bool busy = false;
  // The operation in flight, or the last one.
  uint32_t op = 0;
  int32_t peer = -1;
  uint64_t op_seq = 0;
  int64_t started = 0, deadline = 0;
  ballast_trace_slot* slot = nullptr;
  uint64_t slot_index = 0;
  int status = BALLAST_OK;
  std::string msg;
};

namespace {

std::string abort_reason(Comm* c) {
  std::lock_guard<std::mutex> lock(c->reason_mu);
  return c->abort_reason;
}

// Abort c's NCCL communicator once, and make every later call report `msg`.
// The caller holds c->mu or has c to itself.
void fail_comm(Comm* c, int status, const std::string& msg) {
  if (c->failed == BALLAST_OK) {
    c->failed = status;
    c->failed_msg = msg;
  }
  if (c->nccl) ncclCommAbort(c->nccl);  // unblocks this rank's kernels; peers see the error or time out
  c->nccl = nullptr;
}

// End the operation in flight with `status`; a failure aborts the
// communicator. Under c->mu.
void finish(Comm* c, int status, const std::string& msg) {
  c->tracker->end();
  if (c->slot) {
    c->slot->status = status;
    __atomic_store_n(&c->slot->end_tick, trace_tick(), __ATOMIC_RELAXED);
    __atomic_store_n(&c->slot->state, status == BALLAST_OK ? BALLAST_TRACE_DONE : BALLAST_TRACE_FAILED, __ATOMIC_RELEASE);
    c->slot = nullptr;
  }
  if (status != BALLAST_OK) fail_comm(c, status, msg);
  c->status = status;
  c->msg = msg;
  c->busy = false;
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
    if (c->busy) finish(c, status, m);
    else fail_comm(c, status, m);
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
  cudaEventCreateWithFlags(&c->done, cudaEventDisableTiming);
  cudaMalloc(&c->barrier_buf, 16);
  return c;
}

// What the operation in flight is, for messages. Under c->mu.
std::string describe_op(const Comm* c) {
  char buf[160];
  const bool p2p = c->op == BALLAST_OP_SEND || c->op == BALLAST_OP_RECV;
  std::snprintf(buf, sizeof buf, "%s %s %lld on communicator %016llx (rank %d of %d)", ballast_op_name(c->op),
                p2p ? "with rank" : "seq", p2p ? static_cast<long long>(c->peer) : static_cast<long long>(c->op_seq),
                static_cast<unsigned long long>(c->id), c->rank, c->n);
  return buf;
}

// One look at the operation in flight (its event is recorded when
// `recorded`); ends it when its outcome is known. Returns the verdict and,
// while NCCL is still in progress, says so in *in_progress. Under c->mu.
Verdict look(Comm* c, bool recorded, bool* in_progress = nullptr) {
  OpState s;
  s.now = monotonic_ns();
  s.started = c->started;
  s.deadline = c->deadline;
  s.stall_ns = c->stall_ns;
  s.abort_requested = c->abort_flag.load();
  ncclResult_t st = ncclSuccess;
  if (ncclCommGetAsyncError(c->nccl, &st) != ncclSuccess) st = ncclInternalError;
  s.nccl = st == ncclSuccess ? NcclState::ok : st == ncclInProgress ? NcclState::in_progress : NcclState::error;
  cudaError_t q = cudaErrorNotReady;
  if (recorded) q = cudaEventQuery(c->done);
  s.event = q == cudaSuccess ? EventState::done : q == cudaErrorNotReady ? EventState::pending : EventState::error;
  if (c->slot) {
    const uint64_t p = __atomic_load_n(&c->slot->progress_tick, __ATOMIC_RELAXED);
    if (p > c->slot->start_tick) s.last_progress = int64_t(p);  // both CLOCK_MONOTONIC ns
  }
  if (in_progress) *in_progress = s.nccl == NcclState::in_progress;
  const Verdict v = decide(s);
  if (v == Verdict::running) return v;
  std::string detail;
  if (v == Verdict::aborted) detail = abort_reason(c);
  if (v == Verdict::nccl_error) detail = std::string(ncclGetErrorString(st)) + ": " + ncclGetLastError(c->nccl);
  if (v == Verdict::cuda_error) detail = cudaGetErrorString(q);
  finish(c, status_of(v), describe(v, describe_op(c), s, detail));
  return v;
}

// The watchdog thread of c: sleeps while nothing is in flight, else looks
// at the operation every period_ns. Runs until destroy() sets stopping.
void watch(Comm* c) {
  cudaSetDevice(c->device);  // for cudaEventQuery; NCCL's calls set their own
  std::unique_lock<std::mutex> lock(c->mu);
  while (!c->stopping) {
    if (!c->busy) {
      c->wake.wait(lock, [c] { return c->stopping || c->busy; });
      continue;
    }
    c->wake.wait_for(lock, std::chrono::nanoseconds(c->period_ns), [c] { return c->stopping || c->abort_flag.load(); });
    if (!c->stopping && c->busy) look(c, true);
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
    return fail(BALLAST_ENOSYS, std::string("no CUDA device: ") + (ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices"));
  int rank = cfg && cfg->rank >= 0 ? cfg->rank : int(env_i64("RANK", 0));
  int n = cfg && cfg->nranks > 0 ? cfg->nranks : int(env_i64("WORLD_SIZE", 1));
  if (n <= 0 || rank < 0 || rank >= n) return fail(BALLAST_EINVAL, "invalid rank " + std::to_string(rank) + " for world size " + std::to_string(n));
  const int device = int(env_i64("LOCAL_RANK", rank)) % devices;
  cudaSetDevice(device);
  const char* ea = std::getenv("MASTER_ADDR");
  const std::string addr = cfg && cfg->master_addr ? cfg->master_addr : ea && *ea ? ea : "127.0.0.1";
  const int port = cfg && cfg->master_port > 0 ? cfg->master_port : int(env_i64("MASTER_PORT", 29500));
  const int64_t timeout = cfg && cfg->timeout_ns > 0 ? cfg->timeout_ns : env_i64("BALLAST_COMM_TIMEOUT_MS", 300000) * 1000000;
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
  if (c->busy) finish(c, BALLAST_EABORTED, describe_op(c) + " cancelled: the communicator was destroyed");
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
  cudaEventDestroy(c->done);
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
  // The watchdog aborts NCCL at once if an operation is in flight; else the
  // next start() fails. Without the mutex: a wake-up missed is one period late.
  c->wake.notify_all();
  return BALLAST_OK;
}

int c_info(ballast_comm* comm, ballast_comm_info* info) {
  auto* c = reinterpret_cast<Comm*>(comm);
  if (!c || !info || info->size < offsetof(ballast_comm_info, max_in_flight)) return fail(BALLAST_EINVAL, "info: bad arguments");
  info->rank = c->rank;
  info->nranks = c->n;
  info->world_rank = c->world_rank;
  info->comm_id = c->id;
  info->seq = c->seq;
  if (info->size >= sizeof *info) info->max_in_flight = 1;
  return BALLAST_OK;
}

ncclResult_t enqueue(Comm* c, const ballast_comm_args& a, cudaStream_t s) {
  const ncclDataType_t dt = kTypes[a.dtype];
  const ncclRedOp_t op = kOps[a.redop];
  const size_t es = ballast_dtype_size(a.dtype);
  switch (a.op) {
    case BALLAST_OP_ALLREDUCE: return ncclAllReduce(a.sendbuf ? a.sendbuf : a.recvbuf, a.recvbuf, a.count, dt, op, c->nccl, s);
    case BALLAST_OP_BROADCAST: return ncclBroadcast(a.sendbuf ? a.sendbuf : a.recvbuf, a.recvbuf, a.count, dt, a.root, c->nccl, s);
    case BALLAST_OP_REDUCE: return ncclReduce(a.sendbuf, a.recvbuf, a.count, dt, op, a.root, c->nccl, s);
    case BALLAST_OP_ALLGATHER: return ncclAllGather(a.sendbuf, a.recvbuf, a.count, dt, c->nccl, s);
    case BALLAST_OP_REDUCE_SCATTER: return ncclReduceScatter(a.sendbuf, a.recvbuf, a.count, dt, op, c->nccl, s);
    case BALLAST_OP_SEND: return ncclSend(a.sendbuf, a.count, dt, a.root, c->nccl, s);
    case BALLAST_OP_RECV: return ncclRecv(a.recvbuf, a.count, dt, a.root, c->nccl, s);
    case BALLAST_OP_BARRIER: return ncclAllReduce(c->barrier_buf, c->barrier_buf, 1, ncclInt32, ncclSum, c->nccl, s);
    case BALLAST_OP_ALLTOALL: {
      ncclGroupStart();
      for (int p = 0; p < c->n; ++p) {
        ncclSend(static_cast<const char*>(a.sendbuf) + size_t(p) * a.count * es, a.count, dt, p, c->nccl, s);
        ncclRecv(static_cast<char*>(a.recvbuf) + size_t(p) * a.count * es, a.count, dt, p, c->nccl, s);
      }
      return ncclGroupEnd();
    }
    default: return ncclInvalidArgument;
  }
}

int c_start(ballast_comm* comm, const ballast_comm_args* args, ballast_comm_request** req) {
  auto* c = reinterpret_cast<Comm*>(comm);
  if (!c || !args || !req || args->size < offsetof(ballast_comm_args, stream)) return fail(BALLAST_EINVAL, "start: bad arguments");
  *req = nullptr;
  if (args->op == BALLAST_OP_NONE || args->op > BALLAST_OP_BARRIER || args->dtype >= BALLAST_DT_COUNT ||
      args->redop >= BALLAST_RED_COUNT)
    return fail(BALLAST_EINVAL, "start: unknown op, dtype or redop");
  std::lock_guard<std::mutex> lock(c->mu);
  if (c->abort_flag.load()) return fail(BALLAST_EABORTED, "communicator aborted: " + abort_reason(c));
  // The previous operation may have ended since the watchdog's last look;
  // if it failed (then or earlier, unseen by the caller), that is the news.
  if (c->busy) look(c, true);
  if (c->failed != BALLAST_OK) return fail(BALLAST_ESTATE, "communicator failed earlier: " + c->failed_msg);
  if (c->busy)
    return fail(BALLAST_EFULL, "start: another operation of this communicator is in flight (comm-nccl takes one at a time)");
  ballast_comm_args a{};
  std::memcpy(&a, args, std::min<size_t>(args->size, sizeof a));
  cudaStream_t s = args->size >= sizeof a && a.stream ? static_cast<cudaStream_t>(a.stream) : c->stream;
  c->op = a.op;
  const bool p2p = a.op == BALLAST_OP_SEND || a.op == BALLAST_OP_RECV;
  c->peer = p2p ? a.root : -1;
  c->op_seq = p2p ? 0 : ++c->seq;
  c->busy = true;
  c->started = monotonic_ns();
  c->deadline = c->started + (a.timeout_ns > 0 ? a.timeout_ns : c->timeout_ns);
  if (c->ring) {
    ballast_trace_slot* t = c->ring->claim(&c->slot_index);
    std::memset(reinterpret_cast<char*>(t) + sizeof t->gen, 0, sizeof *t - sizeof t->gen);
    t->comm_id = c->id;
    t->seq = c->op_seq;
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
    t->state = BALLAST_TRACE_STARTED;
    t->flags = p2p ? BALLAST_TRACE_P2P : 0;
    t->wait_peer = t->send_peer = -1;
    t->steps = 1;
    t->issue_tick = t->start_tick = t->progress_tick = trace_tick();
    TraceRing::publish(t, c->slot_index);
    c->slot = t;
    c->tracker->begin(t, c->slot_index);  // NCCL's profiler callbacks count its chunks from here
  }
  const ncclResult_t r = enqueue(c, a, s);
  if (r != ncclSuccess && r != ncclInProgress) {
    const std::string m = std::string(ballast_op_name(a.op)) + ": NCCL refused it: " + ncclGetErrorString(r);
    finish(c, BALLAST_EIO, m);
    return fail(BALLAST_EIO, m);
  }
  // A communicator still connecting returns ncclInProgress, and NCCL puts
  // the kernels on the stream only once it leaves that state: an event
  // recorded before would pass at once, and so would the caller's next
  // kernels. Wait here, within the deadline and abort().
  for (bool in_progress = r == ncclInProgress; in_progress; usleep(100))
    if (look(c, false, &in_progress) != Verdict::running) return fail(c->status, c->msg);
  if (const cudaError_t e = cudaEventRecord(c->done, s); e != cudaSuccess) {
    const std::string m = describe_op(c) + ": cudaEventRecord failed: " + cudaGetErrorString(e);
    finish(c, BALLAST_EIO, m);
    return fail(BALLAST_EIO, m);
  }
  c->wake.notify_one();
  *req = reinterpret_cast<ballast_comm_request*>(c);
  return BALLAST_OK;
}

int c_test(ballast_comm_request* req, int* done) {
  auto* c = reinterpret_cast<Comm*>(req);
  if (!c || !done) return fail(BALLAST_EINVAL, "test: bad arguments");
  std::lock_guard<std::mutex> lock(c->mu);
  if (c->busy) look(c, true);
  *done = c->busy ? 0 : 1;
  return *done ? fail(c->status, c->msg) : BALLAST_OK;
}

int c_wait(ballast_comm_request* req) {
  auto* c = reinterpret_cast<Comm*>(req);
  if (!c) return fail(BALLAST_EINVAL, "wait: req is NULL");
  while (true) {
    {
      std::lock_guard<std::mutex> lock(c->mu);
      if (c->busy) look(c, true);
      if (!c->busy) return fail(c->status, c->msg);
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

const ballast_comm_api kApi = {sizeof(ballast_comm_api), 0, c_init, c_split, c_destroy, c_abort, c_info,
                               c_start, c_test, c_wait, c_run, c_last_error};

}  // namespace

const char* last_error() { return t_error.c_str(); }
const ballast_comm_api* api() { return &kApi; }

}  // namespace ballast::comm_nccl
