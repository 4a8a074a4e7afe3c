// TscClock against CLOCK_MONOTONIC: each reading lies between the kernel's
// clock read just before and just after it, through re-anchors (every 50 ms)
// and the slope's refinement (after 1 s).
#include <doctest/doctest.h>

#include "tsc_clock.hpp"

#include <time.h>

#include <algorithm>
#include <cstdint>
#include <string>

namespace {

uint64_t monotonic() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
}

TEST_CASE("TscClock reads CLOCK_MONOTONIC within microseconds, across re-anchors") {
  ballast::comm::TscClock clock;
  MESSAGE(std::string(clock.uses_tsc() ? "reading the TSC" : "no TSC clocksource: reading CLOCK_MONOTONIC"));
  // The slope is calibrated to about 1e-5, so 50 ms between anchors leave
  // about 0.5 us of error; 5 us allows for rounding and an anchor taken
  // across a short preemption.
  constexpr int64_t kSlackNs = 5000;
  const uint64_t until = monotonic() + 1300000000;  // past the refinement at 1 s
  int64_t worst_early = 0, worst_late = 0;
  uint64_t readings = 0;
  for (uint64_t before = monotonic(); before < until; before = monotonic()) {
    const uint64_t t = clock.now();
    const uint64_t after = monotonic();
    worst_early = std::max(worst_early, int64_t(before) - int64_t(t));
    worst_late = std::max(worst_late, int64_t(t) - int64_t(after));
    ++readings;
  }
  MESSAGE("readings: ", readings, ", most before CLOCK_MONOTONIC: ", worst_early, " ns, most after: ", worst_late,
          " ns");
  CHECK(readings > 1000);
  CHECK(worst_early <= kSlackNs);
  CHECK(worst_late <= kSlackNs);
}

TEST_CASE("TscClock: a reading long after the last keeps the kernel's timeline") {
  ballast::comm::TscClock clock;
  const uint64_t before = monotonic();
  timespec pause{0, 120000000};  // 120 ms: more than a span, so the next read re-anchors
  nanosleep(&pause, nullptr);
  const uint64_t mid = monotonic();
  const uint64_t t = clock.now();
  const uint64_t after = monotonic();
  CHECK(t >= mid - 5000);
  CHECK(t <= after + 5000);
  CHECK(t > before);
}

}  // namespace
