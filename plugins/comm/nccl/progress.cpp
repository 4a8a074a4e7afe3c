#include "progress.hpp"

#include "trace_ring.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <map>
#include <mutex>

namespace ballast::comm_nccl {

namespace {

std::mutex g_mu;
std::map<std::string, std::shared_ptr<OpTracker>>& registry() {
  static std::map<std::string, std::shared_ptr<OpTracker>> r;
  return r;
}

// Every handle given to NCCL starts with its kind: stop and state calls
// bring back only the pointer.
enum class Kind : uint8_t { op, proxy_op, proxy_step };

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

struct Context {
  std::shared_ptr<OpTracker> tracker;
  OpRef refs[kOpRefs];
  std::atomic<uint32_t> next{0};
};

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

ncclResult_t prof_init(void** context, uint64_t, int* mask, const char* name, int, int, int, ballast_nccl_logger) {
  *context = nullptr;
  *mask = 0;
  std::shared_ptr<OpTracker> t;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = registry().find(name ? name : "");
    if (it == registry().end()) return ncclSuccess;  // not one of ours: no events
    t = it->second;
  }
  auto* c = new Context();
  c->tracker = std::move(t);
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
      const Live live(*op);
      if (ballast_trace_slot* s = live.slot()) touch(s);
      *handle = op;  // its stop is one more sign of life; nothing to free
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
  delete static_cast<Context*>(context);
  return ncclSuccess;
}

}  // namespace

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

extern "C" const ballast_nccl_profiler_v5 ncclProfiler_v5 = {
    "ballast-progress", ballast::comm_nccl::prof_init, ballast::comm_nccl::prof_start,
    ballast::comm_nccl::prof_stop, ballast::comm_nccl::prof_state, ballast::comm_nccl::prof_finalize};
