#include "lua_watchdog.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace ballast {

namespace {

struct Watchdog {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<WatchedCall*> calls;
  std::thread thread;
  bool stop = false;
  bool poke = false;       // interrupt(): poll now
  bool signal_ok = false;  // our handler owns WatchedCall::kSignal

  void run() {
    std::unique_lock<std::mutex> lock(mu);
    while (!stop) {
      int64_t now =
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
              .count();
      uint32_t shortest = UINT32_MAX;
      for (WatchedCall* c : calls) {
        shortest = std::min(shortest, c->deadline_ms);
        uint64_t r = c->running.load(std::memory_order_acquire);
        if (r == 0) continue;
        if (r != c->seen) {  // a new call: its deadline counts from now
          c->seen = r;
          c->seen_at_ns = now;
          if (!c->interrupted.load(std::memory_order_relaxed)) continue;
        }
        bool due =
            now - c->seen_at_ns >= int64_t(c->deadline_ms) * 1000000 || c->interrupted.load(std::memory_order_relaxed);
        if (!due || c->expired.load(std::memory_order_relaxed) == r) {
          continue;
        }
        c->expired.store(r, std::memory_order_release);
        // The thread is alive: it is inside the call that `running` names.
        if (signal_ok) pthread_kill(c->thread, WatchedCall::kSignal);
      }
      auto period = std::chrono::milliseconds(std::clamp<uint32_t>(shortest / 8, 2, 50));
      cv.wait_for(lock, period, [this] { return stop || poke; });
      poke = false;
    }
  }
};

// Never destroyed: sandboxes may outlive static destructors.
Watchdog& watchdog() {
  static Watchdog* w = new Watchdog;
  return *w;
}

}  // namespace

bool watch(WatchedCall* call) {
  Watchdog& w = watchdog();
  std::lock_guard<std::mutex> lock(w.mu);
  if (!w.thread.joinable()) {
    try {
      w.stop = false;
      w.thread = std::thread([&w] { w.run(); });
    } catch (const std::system_error&) {
      return false;
    }
  }
  w.calls.push_back(call);
  return true;
}

void unwatch(WatchedCall* call) {
  Watchdog& w = watchdog();
  std::thread done;
  {
    std::lock_guard<std::mutex> lock(w.mu);
    w.calls.erase(std::remove(w.calls.begin(), w.calls.end(), call), w.calls.end());
    if (!w.calls.empty()) return;
    w.stop = true;
    done = std::move(w.thread);
  }
  w.cv.notify_all();
  if (done.joinable()) done.join();
}

void interrupt(WatchedCall* call) {
  Watchdog& w = watchdog();
  call->interrupted.store(true);
  {
    std::lock_guard<std::mutex> lock(w.mu);
    w.poke = true;
  }
  w.cv.notify_all();
}

bool install_watchdog_handler(void (*handler)(int)) {
  Watchdog& w = watchdog();
  static std::once_flag once;
  std::call_once(once, [&] {
    struct sigaction old {};
    if (sigaction(WatchedCall::kSignal, nullptr, &old) != 0) return;
    bool free_to_take = !(old.sa_flags & SA_SIGINFO) && (old.sa_handler == SIG_DFL || old.sa_handler == SIG_IGN);
    if (!free_to_take) return;
    struct sigaction sa {};
    sa.sa_handler = handler;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(WatchedCall::kSignal, &sa, nullptr) != 0) return;
    std::lock_guard<std::mutex> lock(w.mu);
    w.signal_ok = true;
  });
  std::lock_guard<std::mutex> lock(w.mu);
  return w.signal_ok;
}

bool thread_receives_watchdog_signal() {
  thread_local int receives __attribute__((tls_model("initial-exec"))) = -1;
  if (receives < 0) {
    sigset_t blocked;
    sigemptyset(&blocked);
    pthread_sigmask(SIG_BLOCK, nullptr, &blocked);
    receives = sigismember(&blocked, WatchedCall::kSignal) ? 0 : 1;
  }
  return receives == 1;
}

}  // namespace ballast
