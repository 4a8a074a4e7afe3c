// The event bus (DESIGN.md "Events").
//
// Guarantees, stated here once:
// - Topics are interned: publishing looks the topic up once per call in a
//   read-mostly table (no allocation once a topic has been seen).
// - A subscription matches a topic exactly ("a.b"), by prefix ("a.*" matches
//   "a.b" and "a.b.c", not "a"), or everything ("*").
// - Inline delivery runs the handler in the publisher's thread with the
//   publisher's event: no copy, no allocation per event.
// - Queued delivery copies the event (deeply, well-known payloads included)
//   into a bounded queue preallocated at subscribe time, drained by the bus's
//   dispatcher threads. Events from one publishing thread reach a subscriber
//   in publish order (FIFO per publisher).
// - A full queue blocks the publisher until there is room, unless the
//   subscription is lossy: then the event is dropped and counted. Nothing is
//   lost silently: stats() and dropped(id) show every drop.
// - shutdown() stops accepting events, delivers everything already queued,
//   then joins the dispatchers. While it drains, handlers run by the
//   dispatchers may still publish, and what they publish is delivered too
//   (so queued handlers that publish to each other forever keep it from
//   returning).
// - Queue capacities are rounded up to a power of two (at least 2). The
//   event a queued handler is reading keeps its slot until the handler
//   returns.
// - A queued handler that publishes into a full lossless queue served by its
//   own dispatcher thread does not wait for itself: that queue is drained in
//   place, or, when it is the handler's own queue, the event is dropped and
//   counted. Full lossless queues that feed each other across dispatcher
//   threads can still wait for each other: make one of them lossy.
// - Handlers must not throw; one that does anyway counts as a failure.
//   unsubscribe() from a queued subscription's own handler returns
//   BALLAST_ESTATE; shutdown() and ~Bus() must not be called from a handler.
//   A handler may subscribe and unsubscribe; an inline handler that
//   unsubscribes waits for the handlers running in other threads, so two
//   inline handlers that remove each other's subscriptions at the same
//   moment wait for each other.
// Thread-safety: every member function is thread-safe.
#pragma once

#include <ballast/event.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace ballast {

struct BusOptions {
  unsigned dispatcher_threads = 1;         // threads draining queued subscriptions
  uint32_t default_queue_capacity = 4096;  // slots when a subscriber asks for 0
};

struct BusStats {
  uint64_t published = 0;         // publish() calls accepted
  uint64_t delivered = 0;         // handler calls made
  uint64_t dropped = 0;           // events dropped by full lossy queues (and on unsubscribe)
  uint64_t handler_failures = 0;  // handler calls that returned < 0
  uint64_t subscriptions = 0;     // live subscriptions
  uint64_t topics = 0;            // interned topics
};

class Bus {
 public:
  explicit Bus(BusOptions options = {});
  ~Bus();  // shutdown()
  Bus(const Bus&) = delete;
  Bus& operator=(const Bus&) = delete;

  // Subscribe; `owner` names the subscriber in messages (a plugin's name).
  // options may be null (inline). Returns a status; writes the id to *id.
  int subscribe(std::string_view pattern, const ballast_subscribe_options* options, ballast_handler handler, void* user,
                std::string_view owner, uint64_t* id);

  // See ballast_host_api.unsubscribe.
  int unsubscribe(uint64_t id);

  // Deliver `event` to every matching subscription. The event must have its
  // topic, ts_ns and source filled. BALLAST_ESTATE after shutdown().
  int publish(const ballast_event& event);

  // Drain and stop (idempotent).
  void shutdown();

  BusStats stats() const;
  // Events dropped for one subscription; 0 for an unknown id.
  uint64_t dropped(uint64_t id) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ballast
