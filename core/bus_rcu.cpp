#include "bus_rcu.hpp"

#include <mutex>
#include <thread>
#include <vector>

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace ballast::rcu {

Slot g_slots[kMaxThreads];
bool g_asymmetric = false;
constinit thread_local ThreadState t_state = {0, 0};

namespace {

std::mutex g_mu;
std::vector<uint32_t> g_free;     // released slot indexes
std::atomic<uint32_t> g_used{0};  // slots ever handed out (scan bound)
std::once_flag g_init;

void init() {
  // Registration is per process; readers only rely on it after this ran.
  g_asymmetric = syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
}

// Frees the slot when the thread exits.
struct SlotOwner {
  ~SlotOwner() {
    if (t_state.index_plus_one == 0) return;
    std::lock_guard<std::mutex> lock(g_mu);
    g_free.push_back(t_state.index_plus_one - 1);
    t_state.index_plus_one = 0;
  }
};
thread_local SlotOwner t_owner;

}  // namespace

void full_barrier() {
  std::call_once(g_init, init);
  if (g_asymmetric)
    syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
  else
    std::atomic_thread_fence(std::memory_order_seq_cst);
}

void light_barrier() {
  if (g_asymmetric)
    std::atomic_signal_fence(std::memory_order_seq_cst);
  else
    std::atomic_thread_fence(std::memory_order_seq_cst);
}

bool register_thread() {
  std::call_once(g_init, init);
  std::lock_guard<std::mutex> lock(g_mu);
  uint32_t index;
  if (!g_free.empty()) {
    index = g_free.back();
    g_free.pop_back();
  } else {
    index = g_used.load(std::memory_order_relaxed);
    if (index >= kMaxThreads) return false;
    g_used.store(index + 1, std::memory_order_release);
  }
  (void)&t_owner;  // instantiate the thread's owner so that its destructor runs
  t_state.index_plus_one = index + 1;
  return true;
}

void backoff(unsigned& round) {
  ++round;
  if (round < 64) return;
  if (round < 128) {
    std::this_thread::yield();
    return;
  }
  const unsigned us = round < 256 ? 20 : 1000;
  std::this_thread::sleep_for(std::chrono::microseconds(us));
}

// Only a thread in its outermost section parks: deeper, a handler of an
// outer publish is on its stack.
thread_local bool t_parked = false;

void park() {
  if (t_state.nesting != 1) return;
  t_parked = true;
  g_slots[t_state.index_plus_one - 1].parked.store(1, std::memory_order_seq_cst);
}

void unpark() {
  if (!t_parked) return;
  t_parked = false;
  // The exchange orders this against the loads of the section that follow
  // (a writer that skipped us saw parked = 1).
  g_slots[t_state.index_plus_one - 1].parked.exchange(0, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

void synchronize(const std::function<bool()>& help, bool skip_parked) {
  skip_parked = skip_parked || in_section();
  const int self = t_state.index_plus_one == 0 ? -1 : static_cast<int>(t_state.index_plus_one) - 1;
  full_barrier();
  const uint32_t used = g_used.load(std::memory_order_acquire);
  for (uint32_t i = 0; i < used; ++i) {
    if (static_cast<int>(i) == self) continue;
    Slot& s = g_slots[i];
    const uint64_t seen = s.ctr.load(std::memory_order_acquire);
    if ((seen & 1) == 0) continue;
    unsigned round = 0;
    while (s.ctr.load(std::memory_order_acquire) == seen) {
      if (skip_parked && s.parked.load(std::memory_order_seq_cst) != 0) break;
      if (help && help()) continue;
      backoff(round);
    }
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

}  // namespace ballast::rcu
