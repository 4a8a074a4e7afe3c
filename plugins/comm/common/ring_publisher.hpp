// The process's trace ring on the bus: collective.record once for each
// finished operation, collective.progress for each one in flight every time
// it is called. Called from the host's timer thread, off the operations'
// path; it only reads the ring. Shared by the UCX and NCCL plugins, as the
// ring itself is. Records overwritten before a call saw them (more operations
// between two calls than the ring holds) are counted in the plugin's counter
// "records_lost", never guessed.
#pragma once

#include "trace_ring.hpp"

#include <ballast/plugin.h>

#include <cstdint>
#include <set>

namespace ballast::comm {

class RingPublisher {
 public:
  explicit RingPublisher(const ballast_host_api* host) : host_(host) {}
  ~RingPublisher() { stop(); }
  RingPublisher(const RingPublisher&) = delete;
  RingPublisher& operator=(const RingPublisher&) = delete;

  // The plugin's start and stop: publish on the host's timer every
  // publish_period_seconds of the plugin's config (0.1 by default; not
  // positive: BALLAST_EINVAL), from the ring's head now on (what happened
  // before is not news). Without a host bus or timers, nothing to do.
  int start();
  void stop();

  // Publish from record `index` on.
  void start_at(uint64_t index) {
    cursor_ = index;
    published_.clear();
  }
  // Publish what changed since the last call. Returns the events published.
  int publish(const TraceRing& ring);

 private:
  const ballast_host_api* host_;
  uint64_t timer_ = 0;
  bool timing_ = false;
  uint64_t cursor_ = 0;             // the records before it are finished and were published
  std::set<uint64_t> published_;    // finished records after cursor_ already published
};

}  // namespace ballast::comm
