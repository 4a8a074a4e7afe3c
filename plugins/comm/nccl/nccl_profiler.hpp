// Per-chunk progress of NCCL operations in the trace ring, through NCCL's
// profiler plugin interface (v5): this shared object is also NCCL's
// profiler. NCCL calls it from its own threads (the proxy thread for
// network steps, the caller's for enqueueing); each event it reports for a
// Ballast communicator lands in the record of the operation it belongs to:
// chunks to move (ProxyOp nSteps), posted, sent and received (ProxyStep),
// bytes, the peers sent to and waited for, and the progress time (also on
// the kernel's channel events, the only ones within a node without network
// transfers).
#pragma once

#include "nccl_profiler_v5.h"

#include <ballast/trace.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

namespace ballast::comm {
class TraceRing;
}

namespace ballast::comm_nccl {

// The operation a communicator is enqueuing, as the profiler finds it: set
// by the owner before it calls NCCL, cleared once NCCL has taken it (start
// returns). The events NCCL starts meanwhile (a collective's, or a send's
// or receive's) hold that record, and the events under them follow their
// parents, so several operations in flight each get their own.
struct OpTracker {
  void begin(comm::TraceRing* ring, ballast_trace_slot* slot, uint64_t index) {
    ring_.store(ring, std::memory_order_relaxed);
    index_.store(index, std::memory_order_relaxed);
    slot_.store(slot, std::memory_order_release);
  }
  void end() { slot_.store(nullptr, std::memory_order_release); }
  // The record in flight, or NULL; *ring and *index: where it is.
  ballast_trace_slot* current(comm::TraceRing** ring, uint64_t* index) const {
    ballast_trace_slot* s = slot_.load(std::memory_order_acquire);
    *ring = ring_.load(std::memory_order_relaxed);
    *index = index_.load(std::memory_order_relaxed);
    return s;
  }

 private:
  std::atomic<ballast_trace_slot*> slot_{nullptr};
  std::atomic<comm::TraceRing*> ring_{nullptr};
  std::atomic<uint64_t> index_{0};
};

// The name under which a communicator is given to NCCL (ncclConfig_t's
// commName), and registered for the profiler until untrack().
void track(const std::string& comm_name, std::shared_ptr<OpTracker> tracker);
void untrack(const std::string& comm_name);

// Record every communicator of the process, not only Ballast's: the
// stand-alone profiler (ballast-nccl-profiler.so, NCCL_PROFILER_PLUGIN=…)
// turns it on. A communicator that is not Ballast's gets a record per
// operation in the process's ring "rank-R.PID.ncclprof.btrace" (R: RANK, or
// its rank in the first communicator), made when NCCL starts the
// operation's event while the caller enqueues it (issued), started when its
// kernel starts on a channel, done when every channel stopped or a later
// operation of the communicator started. comm-nccl's own communicators
// ("ballast-…") are left to comm-nccl.
void trace_every_communicator(bool on);
inline constexpr const char* kStandaloneWriter = "ncclprof";

// Ask NCCL to load this shared object as its profiler, unless the user
// chose one (NCCL_PROFILER_PLUGIN set) or BALLAST_NCCL_PROGRESS=0. NCCL
// reads the variable when it creates the process's first communicator.
// Returns the path set, or "" when it set none (and why in *why).
std::string use_as_profiler(std::string* why);

}  // namespace ballast::comm_nccl

// NCCL looks this symbol up by name.
extern "C" __attribute__((visibility("default"))) const ballast_nccl_profiler_v5 ncclProfiler_v5;
