// The process's trace ring on the bus: collective.record once for each
// finished operation, collective.progress for each one in flight every time
// it is called. Called from the host's timer thread, off the operations'
// path; it only reads the ring, slot by slot (the ring keeps a record in
// flight however many records come after it). Records overwritten before a
// call saw them finished (more operations between two calls than the ring
// holds) are counted in the plugin's counter "records_lost": the indices that
// went by a slot unseen, less those the writers skipped (trace.h), so exact
// once the writers skipped nothing or the skipped ones' slots moved on.
#pragma once

#include "trace_ring.hpp"

#include <ballast/plugin.h>

#include <cstdint>
#include <vector>

namespace ballast::comm {

class RingPublisher {
 public:
  // Reads publish_period_seconds from the plugin's config: a plugin asks for
  // its keys in create (plugin.h, config_get).
  explicit RingPublisher(const ballast_host_api* host);
  ~RingPublisher() { stop(); }
  RingPublisher(const RingPublisher&) = delete;
  RingPublisher& operator=(const RingPublisher&) = delete;

  // The plugin's start and stop: publish on the host's timer every
  // publish_period_seconds of the plugin's config (0.1 by default; not
  // positive: BALLAST_EINVAL), from the ring's head now on (what happened
  // before is not news). Without a host (nullptr), nothing to do.
  int start();
  void stop();

  // Publish from record `index` on; skipped: the ring's count of skipped
  // indices now.
  void start_at(uint64_t index, uint64_t skipped) {
    start_ = index;
    skipped_ = skipped;
    skip_credit_ = 0;
    slots_.clear();
  }
  // Publish what changed since the last call. Returns the events published.
  int publish(const TraceRing& ring);

 private:
  // What the last calls saw in one slot.
  struct Seen {
    bool any = false;       // a record of index >= start_
    uint64_t index = 0;     // its index
    bool finished = false;  // published as finished
  };
  const ballast_host_api* host_;
  double period_ = 0.1;  // seconds
  uint64_t timer_ = 0;
  bool timing_ = false;
  uint64_t start_ = 0;        // records before it are not news
  uint64_t skipped_ = 0;      // the ring's skipped count at the last call
  uint64_t skip_credit_ = 0;  // indices skipped and not yet met as a gap in their slot
  std::vector<Seen> slots_;
};

}  // namespace ballast::comm
