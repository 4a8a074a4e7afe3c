// The deadline watchdog of Lua sandbox calls.
//
// A count hook that reads a clock costs every instruction of every call:
// once any hook is set, Lua traps each instruction, 50-60 ns of a 1 µs
// handler call. Instead one thread per process watches the calls in
// progress; a caller only stores a sequence number when its call starts and
// ends. When a call has run past its deadline, the watchdog marks it
// expired and sends kSignal to the calling thread, whose handler sets a
// count hook on the running state (lua_sethook may be called from a signal
// handler: Lua's own interpreter stops scripts on SIGINT this way); the hook
// then raises the deadline error.
//
// Precision: a call is stopped between its deadline and its deadline plus
// one poll period (an eighth of the smallest deadline watched, 2 to 50 ms).
// Where the signal cannot be used (the process already handles kSignal, or
// the calling thread blocks it) the caller keeps a count hook every few
// instructions that reads the expired mark.
//
// interrupt() makes every call of a WatchedCall, the one in progress and all
// later ones, past its deadline at the watchdog's next poll: a host that
// stops does not wait for a policy's deadline.
#pragma once

#include <pthread.h>

#include <atomic>
#include <csignal>
#include <cstdint>

namespace ballast {

struct WatchedCall {
  static constexpr int kSignal = SIGURG;  // ignored by default, rarely used

  std::atomic<uint64_t> running{0};      // sequence number of the call in progress; 0: none
  std::atomic<uint64_t> expired{0};      // the last sequence number past its deadline
  std::atomic<bool> interrupted{false};  // every call is past its deadline (interrupt())
  pthread_t thread{};                    // the caller, written before `running`
  uint32_t deadline_ms = 0;              // set before watch()
  uint64_t next_seq = 1;                 // the caller's
  uint64_t seen = 0;                     // the watchdog's: the call it last saw
  int64_t seen_at_ns = 0;                // and when it first saw it

  // Returns the call this one runs inside (a re-entered state), for end().
  uint64_t begin() {
    uint64_t outer = running.load(std::memory_order_relaxed);
    thread = pthread_self();
    running.store(next_seq++, std::memory_order_release);
    return outer;
  }
  void end(uint64_t outer) { running.store(outer, std::memory_order_relaxed); }
  // The call in progress counts its deadline from now (a new sequence number).
  void restart() { running.store(next_seq++, std::memory_order_release); }
  // The call in progress (on the calling thread) has passed its deadline.
  bool past_deadline() const {
    uint64_t r = running.load(std::memory_order_relaxed);
    return r != 0 && expired.load(std::memory_order_acquire) == r;
  }
};

// Start watching (the watchdog thread starts with the first call watched);
// false when the thread cannot be started.
bool watch(WatchedCall* call);
// Stop watching; the thread stops after the last call is unwatched.
void unwatch(WatchedCall* call);

// Make the call in progress and every later one of `call` past its deadline
// (thread-safe; takes effect at the watchdog's next poll).
void interrupt(WatchedCall* call);

// Install `handler` for WatchedCall::kSignal once per process. False when
// another handler already owns the signal (it is left alone).
bool install_watchdog_handler(void (*handler)(int));

// Whether the calling thread receives WatchedCall::kSignal (checked once
// per thread).
bool thread_receives_watchdog_signal();

}  // namespace ballast
