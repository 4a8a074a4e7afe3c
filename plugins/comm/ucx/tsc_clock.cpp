#include "tsc_clock.hpp"

#include <fstream>
#include <mutex>
#include <string>

namespace ballast::comm {

namespace {

constexpr uint64_t kSpanNs = 50000000;      // re-anchor after 50 ms
constexpr uint64_t kRefineNs = 1000000000;  // refine the slope from anchors this far apart

#if defined(__x86_64__)
// A TSC reading and CLOCK_MONOTONIC at the same moment: the TSC read on each
// side of the clock's, and the pair taken from the narrowest of a few tries
// (a pair split by an interrupt is off by microseconds).
void anchor(uint64_t* tsc, uint64_t* ns) {
  uint64_t best = ~uint64_t(0);
  for (int i = 0; i < 5; ++i) {
    const uint64_t a = __builtin_ia32_rdtsc();
    const uint64_t m = trace_tick();
    const uint64_t b = __builtin_ia32_rdtsc();
    if (b - a < best) {
      best = b - a;
      *tsc = a + (b - a) / 2;
      *ns = m;
    }
  }
}

// ns per tick << 32 over two anchors; 0 when they make no sense.
uint64_t slope(uint64_t tsc_a, uint64_t ns_a, uint64_t tsc_b, uint64_t ns_b) {
  if (tsc_b <= tsc_a || ns_b <= ns_a) return 0;
  return uint64_t((static_cast<unsigned __int128>(ns_b - ns_a) << 32) / (tsc_b - tsc_a));
}

bool kernel_clock_is_tsc() {
  std::ifstream f("/sys/devices/system/clocksource/clocksource0/current_clocksource");
  std::string name;
  return f >> name && name == "tsc";
}

// The process's first slope: two anchors 2 ms apart (error about 1e-5, a
// microsecond over a span), taken once. 0 when the kernel does not count
// time with the TSC.
uint64_t process_slope() {
  static std::once_flag once;
  static uint64_t mult = 0;
  std::call_once(once, [] {
    if (!kernel_clock_is_tsc()) return;
    uint64_t t0, n0, t1, n1;
    anchor(&t0, &n0);
    do anchor(&t1, &n1);
    while (n1 - n0 < 2000000);
    mult = slope(t0, n0, t1, n1);
  });
  return mult;
}
#endif

}  // namespace

TscClock::TscClock() {
#if defined(__x86_64__)
  mult_ = process_slope();
  if (!mult_) return;
  anchor(&tsc0_, &ns0_);
  first_tsc_ = tsc0_;
  first_ns_ = ns0_;
  span_ = (kSpanNs << kShift) / mult_;
#endif
}

uint64_t TscClock::reanchor() {
#if defined(__x86_64__)
  anchor(&tsc0_, &ns0_);
  if (ns0_ - first_ns_ >= kRefineNs)
    if (const uint64_t m = slope(first_tsc_, first_ns_, tsc0_, ns0_)) mult_ = m;
  span_ = (kSpanNs << kShift) / mult_;
  return ns0_;
#else
  return trace_tick();
#endif
}

}  // namespace ballast::comm
