// Read-side sections for the bus (a small userspace RCU).
//
// Publishers read the topic table and the subscription lists without taking
// a lock or writing a shared cache line: entering a section is a store to
// the thread's own slot. A writer (subscribe, unsubscribe, shutdown) swaps
// in new lists and then calls synchronize(), which returns once every
// section that was open at the call has closed: after that, no publisher can
// still call a removed handler or read a retired list.
//
// The store/load ordering between a publisher entering its section and a
// writer scanning the slots needs a full fence on one side. With Linux's
// membarrier(PRIVATE_EXPEDITED) the writer issues it for everybody (writers
// are rare); without it, each publisher pays a fence on entry.
//
// Threads get a slot on first use (kMaxThreads at once; the slot is freed
// when the thread exits). Sections nest: a handler may publish.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>

namespace ballast::rcu {

inline constexpr unsigned kMaxThreads = 1024;

struct alignas(64) Slot {
  std::atomic<uint64_t> ctr{0};     // odd while the thread is inside a section
  std::atomic<uint32_t> parked{0};  // in its outermost section, blocked on a full queue (park())
};

extern Slot g_slots[kMaxThreads];
extern bool g_asymmetric;  // membarrier is used: readers need no fence

struct ThreadState {
  uint32_t index_plus_one;  // 0: no slot yet
  uint32_t nesting;
};
extern constinit thread_local ThreadState t_state;  // constant-initialised: no TLS guard on access

// Give this thread a slot; false when kMaxThreads threads hold one.
bool register_thread();

inline bool in_section() { return t_state.nesting > 0; }

// Enter a section; false (and nothing entered) when no slot is left.
inline bool enter() {
  if (t_state.index_plus_one == 0 && !register_thread()) return false;
  if (t_state.nesting++ == 0) {
    Slot& s = g_slots[t_state.index_plus_one - 1];
    s.ctr.store(s.ctr.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    if (g_asymmetric)
      std::atomic_signal_fence(std::memory_order_seq_cst);
    else
      std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  return true;
}

inline void leave() {
  if (--t_state.nesting == 0) {
    Slot& s = g_slots[t_state.index_plus_one - 1];
    s.ctr.store(s.ctr.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }
}

// A publisher blocked on a full queue in its outermost section "parks":
// while parked it runs no handler and reads no list. park() and unpark() do
// nothing deeper (a handler of the outer publish is on the stack) or
// outside a section.
void park();
void unpark();

// Wait until every section open at the call has closed, except this
// thread's own. With skip_parked (implied when called from inside a
// section), parked threads are not waited for: a writer running in a
// handler must not wait for a publisher that waits for that handler's
// dispatcher. A parked thread may still hold a list, so such a caller must
// not free what it retired (see Bus). `help`, when given, is called while
// waiting and returns whether it did some work (a dispatcher draining its
// queues).
void synchronize(const std::function<bool()>& help = {}, bool skip_parked = false);

// The two sides of an asymmetric fence, for any store-then-load handshake
// where one side is rare (a dispatcher going to sleep) and the other hot (a
// publisher checking whether to wake it): full_barrier() is a full fence in
// every thread of the process (membarrier), light_barrier() then only needs
// to stop the compiler. Without membarrier both are plain full fences.
// light_barrier() is only valid after this thread's register_thread().
void full_barrier();
void light_barrier();

// Sleep a little longer each time: spin, yield, then sleep up to 1 ms.
void backoff(unsigned& round);

}  // namespace ballast::rcu
