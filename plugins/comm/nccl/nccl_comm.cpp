// NCCL communicators are created non-blocking (config.blocking = 0): every
// call returns at once, and the owner's test/wait loop is the watchdog. It
// polls ncclCommGetAsyncError and a CUDA event recorded after the operation,
// enforces the deadline, and calls ncclCommAbort on a timeout, an abort()
// or an asynchronous NCCL error, so that no rank waits forever.
#include "nccl_comm.hpp"

#include "bootstrap.hpp"
#include "progress.hpp"
#include "trace_ring.hpp"

#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

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
  ncclComm_t nccl = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;
  int rank = 0, n = 1, world_rank = 0;
  uint64_t id = 0, seq = 0;
  int64_t timeout_ns = 0;
  TraceRing* ring = nullptr;
  std::atomic<bool> abort_flag{false};
  std::mutex mu;
  std::string abort_reason;
  int failed = BALLAST_OK;
  std::string failed_msg;
  bool busy = false;
  // the operation in flight
  int64_t deadline = 0;
  ballast_trace_slot* slot = nullptr;
  uint64_t slot_index = 0;
  uint32_t op = 0;
  int status = BALLAST_OK;
  std::string msg;
  void* barrier_buf = nullptr;
  // Its name in NCCL (ncclConfig_t.commName), under which NCCL's profiler
  // callbacks (progress.cpp) find the operation in flight when it is traced.
  std::string nccl_name;
  std::shared_ptr<OpTracker> tracker = std::make_shared<OpTracker>();
};

namespace {

// Wait for a non-blocking NCCL call on comm to leave ncclInProgress.
int settle(Comm* c, int64_t deadline, const std::string& what) {
  ncclResult_t st = ncclInProgress;
  while (true) {
    if (ncclCommGetAsyncError(c->nccl, &st) != ncclSuccess) st = ncclInternalError;
    if (st != ncclInProgress) break;
    if (monotonic_ns() > deadline) {
      ncclCommAbort(c->nccl);
      c->nccl = nullptr;
      return fail(BALLAST_ETIMEDOUT, what + " timed out (NCCL still in progress); the communicator was aborted");
    }
    usleep(100);
  }
  if (st != ncclSuccess) return fail(BALLAST_EPEER, what + " failed: " + ncclGetErrorString(st) + ": " + ncclGetLastError(c->nccl));
  return BALLAST_OK;
}

// A name unique in the process, and known to the profiler when traced.
std::string nccl_name(uint64_t id, const std::shared_ptr<OpTracker>& tracker, bool traced) {
  static std::atomic<uint32_t> serial{0};
  char buf[64];
  std::snprintf(buf, sizeof buf, "ballast-%016llx-%u", static_cast<unsigned long long>(id), serial.fetch_add(1));
  if (traced) track(buf, tracker);
  return buf;
}

Comm* new_comm(int rank, int n, int world_rank, uint64_t id, int64_t timeout, TraceRing* ring) {
  auto* c = new Comm();
  c->nccl_name = nccl_name(id, c->tracker, ring != nullptr);
  c->rank = rank;
  c->n = n;
  c->world_rank = world_rank;
  c->id = id;
  c->timeout_ns = timeout;
  c->ring = ring;
  cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
  cudaEventCreateWithFlags(&c->done, cudaEventDisableTiming);
  cudaMalloc(&c->barrier_buf, 16);
  return c;
}

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
  const int local = int(env_i64("LOCAL_RANK", rank));
  cudaSetDevice(local % devices);
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
  if (trace && !(ring = TraceRing::process_ring(cfg && cfg->trace_dir ? cfg->trace_dir : "", rank, n, &err)))
    return fail(BALLAST_EIO, err);
  Comm* c = new_comm(rank, n, rank, boot.job_id, timeout, ring);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = c->nccl_name.c_str();
  ncclResult_t r = ncclCommInitRankConfig(&c->nccl, n, uid, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    untrack(c->nccl_name);
    delete c;
    return fail(BALLAST_EIO, std::string("ncclCommInitRankConfig failed: ") + ncclGetErrorString(r));
  }
  if (int rc = settle(c, deadline, "ncclCommInitRankConfig"); rc != BALLAST_OK) {
    const std::string m = t_error;
    untrack(c->nccl_name);
    delete c;
    return fail(rc, m);
  }
  *out = reinterpret_cast<ballast_comm*>(c);
  return BALLAST_OK;
}

void c_destroy(ballast_comm* comm) {
  auto* c = reinterpret_cast<Comm*>(comm);
  if (!c) return;
  if (c->nccl) {
    if (c->busy || c->failed != BALLAST_OK) ncclCommAbort(c->nccl);
    else {
      ncclCommFinalize(c->nccl);
      settle(c, monotonic_ns() + c->timeout_ns, "ncclCommFinalize");
      if (c->nccl) ncclCommDestroy(c->nccl);
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
  if (p->failed != BALLAST_OK) return fail(BALLAST_ESTATE, "communicator failed earlier: " + p->failed_msg);
  // The child exists before NCCL's, so that NCCL's profiler finds it by name.
  Comm* c = new_comm(0, 1, p->world_rank, p->id * 31 + uint64_t(colour) + 1, p->timeout_ns, p->ring);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = c->nccl_name.c_str();
  ncclComm_t nc = nullptr;
  ncclResult_t r = ncclCommSplit(p->nccl, colour < 0 ? NCCL_SPLIT_NOCOLOR : colour, key, &nc, &config);
  int rc = r == ncclSuccess || r == ncclInProgress
               ? settle(p, monotonic_ns() + p->timeout_ns, "ncclCommSplit")
               : fail(BALLAST_EIO, std::string("ncclCommSplit failed: ") + ncclGetErrorString(r));
  if (rc != BALLAST_OK || !nc) {
    c_destroy(reinterpret_cast<ballast_comm*>(c));
    return rc;
  }
  ncclCommUserRank(nc, &c->rank);
  ncclCommCount(nc, &c->n);
  c->nccl = nc;
  *out = reinterpret_cast<ballast_comm*>(c);
  return BALLAST_OK;
}

int c_abort(ballast_comm* comm, const char* reason) {
  auto* c = reinterpret_cast<Comm*>(comm);
  if (!c) return fail(BALLAST_EINVAL, "abort: comm is NULL");
  {
    std::lock_guard<std::mutex> lock(c->mu);
    if (!c->abort_flag.load()) c->abort_reason = reason ? reason : "abort() was called";
  }
  c->abort_flag.store(true);
  return BALLAST_OK;
}

int c_info(ballast_comm* comm, ballast_comm_info* info) {
  auto* c = reinterpret_cast<Comm*>(comm);
  if (!c || !info || info->size < sizeof *info) return fail(BALLAST_EINVAL, "info: bad arguments");
  info->rank = c->rank;
  info->nranks = c->n;
  info->world_rank = c->world_rank;
  info->comm_id = c->id;
  info->seq = c->seq;
  return BALLAST_OK;
}

int finish(Comm* c, int status, const std::string& msg) {
  if (status != BALLAST_OK && c->failed == BALLAST_OK) {
    c->failed = status;
    c->failed_msg = msg;
    if (c->nccl) ncclCommAbort(c->nccl);  // unblocks this rank's kernels; peers see the error or time out
    c->nccl = nullptr;
  }
  c->tracker->end();
  if (c->slot) {
    c->slot->status = status;
    __atomic_store_n(&c->slot->end_tick, trace_tick(), __ATOMIC_RELAXED);
    __atomic_store_n(&c->slot->state, status == BALLAST_OK ? BALLAST_TRACE_DONE : BALLAST_TRACE_FAILED, __ATOMIC_RELEASE);
    c->slot = nullptr;
  }
  c->status = status;
  c->msg = msg;
  c->busy = false;
  return fail(status, msg);
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
  if (c->busy) return fail(BALLAST_ESTATE, "start: another operation of this communicator is in flight");
  if (args->op == BALLAST_OP_NONE || args->op > BALLAST_OP_BARRIER || args->dtype >= BALLAST_DT_COUNT ||
      args->redop >= BALLAST_RED_COUNT)
    return fail(BALLAST_EINVAL, "start: unknown op, dtype or redop");
  if (c->abort_flag.load()) {
    std::lock_guard<std::mutex> lock(c->mu);
    return fail(BALLAST_EABORTED, "communicator aborted: " + c->abort_reason);
  }
  if (c->failed != BALLAST_OK) return fail(BALLAST_ESTATE, "communicator failed earlier: " + c->failed_msg);
  ballast_comm_args a{};
  std::memcpy(&a, args, std::min<size_t>(args->size, sizeof a));
  cudaStream_t s = args->size >= sizeof a && a.stream ? static_cast<cudaStream_t>(a.stream) : c->stream;
  c->op = a.op;
  const bool p2p = a.op == BALLAST_OP_SEND || a.op == BALLAST_OP_RECV;
  const uint64_t seq = p2p ? 0 : ++c->seq;
  c->busy = true;
  c->deadline = monotonic_ns() + (a.timeout_ns > 0 ? a.timeout_ns : c->timeout_ns);
  if (c->ring) {
    ballast_trace_slot* t = c->ring->claim(&c->slot_index);
    std::memset(reinterpret_cast<char*>(t) + sizeof t->gen, 0, sizeof *t - sizeof t->gen);
    t->comm_id = c->id;
    t->seq = seq;
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
  if (r != ncclSuccess && r != ncclInProgress)
    return finish(c, BALLAST_EIO, std::string(ballast_op_name(a.op)) + ": NCCL refused it: " + ncclGetErrorString(r));
  if (cudaEventRecord(c->done, s) != cudaSuccess) return finish(c, BALLAST_EIO, "cudaEventRecord failed");
  *req = reinterpret_cast<ballast_comm_request*>(c);
  return BALLAST_OK;
}

// One round of the watchdog. 1 when the operation ended.
int poll_once(Comm* c) {
  const std::string what = std::string(ballast_op_name(c->op)) + " seq " + std::to_string(c->seq);
  if (c->abort_flag.load()) {
    std::lock_guard<std::mutex> lock(c->mu);
    finish(c, BALLAST_EABORTED, what + " aborted: " + c->abort_reason);
    return 1;
  }
  ncclResult_t st = ncclSuccess;
  ncclCommGetAsyncError(c->nccl, &st);
  if (st != ncclSuccess && st != ncclInProgress) {
    finish(c, BALLAST_EPEER, what + " failed in NCCL: " + ncclGetErrorString(st) + ": " + ncclGetLastError(c->nccl));
    return 1;
  }
  const cudaError_t q = cudaEventQuery(c->done);
  if (q == cudaSuccess && st == ncclSuccess) {
    finish(c, BALLAST_OK, "");
    return 1;
  }
  if (q != cudaSuccess && q != cudaErrorNotReady) {
    finish(c, BALLAST_EIO, what + ": CUDA error " + cudaGetErrorString(q));
    return 1;
  }
  if (monotonic_ns() > c->deadline) {
    finish(c, BALLAST_ETIMEDOUT, what + " timed out; ncclCommAbort was called");
    return 1;
  }
  return 0;
}

int c_test(ballast_comm_request* req, int* done) {
  auto* c = reinterpret_cast<Comm*>(req);
  if (!c || !done) return fail(BALLAST_EINVAL, "test: bad arguments");
  *done = c->busy ? poll_once(c) : 1;
  return *done ? fail(c->status, c->msg) : BALLAST_OK;
}

int c_wait(ballast_comm_request* req) {
  auto* c = reinterpret_cast<Comm*>(req);
  if (!c) return fail(BALLAST_EINVAL, "wait: req is NULL");
  while (c->busy && !poll_once(c)) usleep(20);
  return fail(c->status, c->msg);
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
