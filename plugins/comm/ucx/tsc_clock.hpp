// CLOCK_MONOTONIC in nanoseconds, read from the CPU's time-stamp counter.
//
// An operation reads the clock at its start (its deadline and its trace
// record's start) and, from 64 KiB, at its end (the record's end). Through
// the vDSO that read costs about 23 ns on this VM, rdtsc about 10: the 20 ns
// that a trace record may add to an operation do not fit another vDSO read.
//
// The kernel's own CLOCK_MONOTONIC is a linear function of the TSC when its
// clocksource is "tsc" (it picks that only when the TSC is constant and
// synchronised across CPUs), so this clock keeps a line through two points
// of it: an anchor (a TSC reading and CLOCK_MONOTONIC at the same moment)
// re-read every 50 ms of use, and a slope from the process's calibration,
// refined from the first anchor once a second has passed. Its readings stay
// within a few microseconds of CLOCK_MONOTONIC and may step by that much at a
// re-anchor: callers that need an order (end >= start) clamp.
//
// Elsewhere (another clocksource, not x86-64) it is trace_tick().
// One per communicator: not thread-safe, as a communicator runs one
// operation at a time.
#pragma once

#include "trace_ring.hpp"

#include <cstdint>

namespace ballast::comm {

class TscClock {
 public:
  TscClock();
  uint64_t now() {
#if defined(__x86_64__)
    if (mult_) {
      const uint64_t d = __builtin_ia32_rdtsc() - tsc0_;
      if (d < span_) return ns0_ + ((d * mult_) >> kShift);  // d * mult_ < 2^64: see span_
      return reanchor();
    }
#endif
    return trace_tick();
  }
  bool uses_tsc() const { return mult_ != 0; }

 private:
  static constexpr int kShift = 32;
  uint64_t reanchor();

  uint64_t mult_ = 0;                      // ns per TSC tick << kShift; 0: read CLOCK_MONOTONIC
  uint64_t tsc0_ = 0, ns0_ = 0;            // the anchor
  uint64_t span_ = 0;                      // TSC ticks in 50 ms: re-anchor after
  uint64_t first_tsc_ = 0, first_ns_ = 0;  // the first anchor, for the slope
};

}  // namespace ballast::comm
