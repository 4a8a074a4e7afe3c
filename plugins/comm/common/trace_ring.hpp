// The writer side of the collective trace ring (abi/ballast/trace.h): one
// shared-memory file per comm plugin per process, mapped once, written
// without locks.
#pragma once

#include <ballast/trace.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include <time.h>

namespace ballast::comm {

// The ring's clock is CLOCK_MONOTONIC in ns (ns_per_tick 1). The UCX
// engine reads operations' starts and ends through its TscClock
// (tsc_clock.hpp, about 10 ns). trace_tick(): the vDSO, about 23 ns on this
// VM, for the rest (heartbeats, the ring's header) and the NCCL plugin.
// trace_tick_coarse(): CLOCK_MONOTONIC_COARSE, the same timeline as of the
// last timer interrupt (steps of 1-4 ms), about 5 ns: where the kernel does
// not count time with the TSC, the end of an operation under 64 KiB.
inline uint64_t trace_ns(clockid_t id) {
  timespec ts;
  clock_gettime(id, &ts);
  return uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
}
inline uint64_t trace_tick() { return trace_ns(CLOCK_MONOTONIC); }
inline uint64_t trace_tick_coarse() { return trace_ns(CLOCK_MONOTONIC_COARSE); }

class TraceRing {
 public:
  // The ring of this plugin in this process, created on first use as
  // "<dir>/rank-R.PID.<writer>.btrace" (dir: BALLAST_TRACE_DIR or /dev/shm
  // when empty; writer: the plugin, "ucx" or "nccl", so that two comm plugins
  // in one process keep two files). Later calls in the process return the
  // same ring whatever they say; a child forked after it gets its own. NULL
  // with *err set when the file cannot be created. Thread-safe.
  static TraceRing* process_ring(const std::string& writer, const std::string& dir, int rank, int nranks,
                                 std::string* err);
  // A new ring at `path`, for process_ring and for tests. It appears complete
  // (written under another name, then renamed), so that a reader never sees
  // a half-made file, and replaces a file of that name without truncating
  // it under a reader that still maps it.
  static TraceRing* create(const std::string& path, int rank, int nranks, std::string* err);
  // Remove from dir the rings of ended processes beyond the newest `keep`
  // (by last activity), counting only those of this host whose process is
  // gone and whose last activity (heartbeat or newest record) is at least
  // kIdleBeforeRemovalNs old: a crash stays
  // readable for a post-mortem, and a folder of a node whose jobs restart
  // all day stays bounded. Files that are not rings are left alone.
  // Returns the rings removed.
  static size_t prune(const std::string& dir, size_t keep);
  static constexpr int64_t kIdleBeforeRemovalNs = 600'000'000'000;  // 10 minutes
  static constexpr size_t kKeepDefault = 64;

  // Claim the next slot whose record is not in flight and mark it being
  // written; the caller fills it and calls publish(). NULL when every slot
  // holds an operation in flight: this one goes unrecorded (counted). Any
  // thread.
  ballast_trace_slot* claim(uint64_t* index) {
    for (uint64_t tries = 0; tries <= mask_; ++tries) {
      const uint64_t i = __atomic_fetch_add(&hdr_->head, 1, __ATOMIC_RELAXED);
      ballast_trace_slot* s = slots_ + (i & mask_);
      if (__builtin_expect(take(s, i), 1)) {
        *index = i;
        return s;
      }
      __atomic_fetch_add(&hdr_->skipped, 1, __ATOMIC_RELAXED);  // in flight, or another claimer's: go round it
    }
    __atomic_fetch_add(&hdr_->dropped, 1, __ATOMIC_RELAXED);
    return nullptr;
  }
  static void publish(ballast_trace_slot* s, uint64_t index) { __atomic_store_n(&s->gen, index + 1, __ATOMIC_RELEASE); }
  // Writers of a record besides the thread that owns it (NCCL's profiler,
  // on NCCL's threads) hold its slot around their stores: hold() is true,
  // the slot held, while slot s carries record `index` in flight (issued or
  // started); release() after the stores. A claimer that takes a held slot
  // waits for it (a hold lasts a few stores), and past kHoldWaits yields
  // leaves it as it was and goes round it: a late store lands in the record
  // it was meant for, never in the next one. Any thread.
  bool hold(ballast_trace_slot* s, uint64_t index);
  void release(ballast_trace_slot* s) { holds_[s - slots_].fetch_sub(1, std::memory_order_release); }
  static constexpr int kHoldWaits = 1000;
  void heartbeat() { __atomic_store_n(&hdr_->heartbeat_tick, trace_tick(), __ATOMIC_RELAXED); }
  void set_closed(bool closed) { __atomic_store_n(&hdr_->closed, closed ? 1u : 0u, __ATOMIC_RELEASE); }
  // This process's ring if it made one, else NULL. Any thread.
  static TraceRing* current();
  uint64_t head() const { return __atomic_load_n(&hdr_->head, __ATOMIC_ACQUIRE); }
  // A consistent copy of record i; false when it was overwritten or is being written.
  bool read(uint64_t i, ballast_trace_slot* out) const;
  // A consistent copy of the record in slot k and its index; false when the
  // slot is empty or being written.
  bool read_slot(uint64_t k, uint64_t* index, ballast_trace_slot* out) const;
  // Whether slot k holds record i (its first cache line only).
  bool holds(uint64_t k, uint64_t i) const {
    return __atomic_load_n(&slots_[k & mask_].gen, __ATOMIC_ACQUIRE) == i + 1;
  }
  int64_t wall_ns(uint64_t tick) const {
    return hdr_->clock_wall_ns + int64_t(double(int64_t(tick - hdr_->clock_tick)) * hdr_->ns_per_tick);
  }
  uint32_t capacity() const { return uint32_t(mask_ + 1); }
  uint64_t skipped() const { return __atomic_load_n(&hdr_->skipped, __ATOMIC_ACQUIRE); }
  uint64_t dropped() const { return __atomic_load_n(&hdr_->dropped, __ATOMIC_RELAXED); }
  double ns_per_tick() const { return hdr_->ns_per_tick; }

 private:
  TraceRing() = default;
  // Take slot s for index i: on the ring's first lap it is ours (no index
  // before i maps to it); after, only when it holds a published record that
  // has ended, and by one exchange of its gen for 0 (being written), so that
  // two claimers a lap apart (one held up between its index and its slot)
  // never both write it. Then, once any slot was ever held, it waits for
  // this one's holders (the exchange and the loads after it are sequentially
  // consistent, as hold()'s are: either the holder sees the exchange, or
  // the claimer sees the hold).
  bool take(ballast_trace_slot* s, uint64_t i) {
    if (i <= mask_) return true;  // a new ring's slots are zero: being written
    uint64_t g = __atomic_load_n(&s->gen, __ATOMIC_ACQUIRE);
    if (g == 0 || __atomic_load_n(&s->state, __ATOMIC_ACQUIRE) <= BALLAST_TRACE_STARTED) return false;
    if (!__atomic_compare_exchange_n(&s->gen, &g, 0, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) return false;
    if (__builtin_expect(!ever_held_.load(std::memory_order_seq_cst), 1) || wait_unheld(s)) return true;
    __atomic_store_n(&s->gen, g, __ATOMIC_RELEASE);  // still held: left as it was
    return false;
  }
  bool wait_unheld(ballast_trace_slot* s);
  ballast_trace_header* hdr_ = nullptr;
  ballast_trace_slot* slots_ = nullptr;
  uint64_t mask_ = 0;
  std::unique_ptr<std::atomic<uint32_t>[]> holds_;  // per slot: writers holding it
  std::atomic<bool> ever_held_{false};              // whether hold() ever ran: only then does take() look
};

}  // namespace ballast::comm
