// ballast-comm-nccl: the plugin entry. The logic is in nccl_comm.cpp; with
// a host, a timer publishes the process's trace ring (ring_publisher.hpp) every
// publish_period_seconds (default 0.1). The ring is the process's, made at
// its first traced communicator: the timer publishes nothing before.
#include "nccl_comm.hpp"
#include "ring_publisher.hpp"

#include <ballast/plugin.h>

#include <cstdlib>
#include <new>
#include <string_view>

namespace {

using ballast::comm::TraceRing;
using ballast::comm::RingPublisher;

struct State {
  const ballast_host_api* host;
  RingPublisher publisher;
  uint64_t timer = 0;
  bool timing = false;
};

void publish_ring(void* user) {
  auto* s = static_cast<State*>(user);
  if (const TraceRing* ring = TraceRing::current()) s->publisher.publish(*ring);
}

int create(const ballast_host_api* host, void** state) {
  *state = new (std::nothrow) State{host, RingPublisher(host)};
  return *state ? BALLAST_OK : BALLAST_ENOMEM;
}

int start(void* state) {
  auto* s = static_cast<State*>(state);
  if (!s->host || !s->host->timer_start || !s->host->publish) return BALLAST_OK;  // no bus to publish on
  double period = 0.1;
  const char* v = nullptr;
  if (s->host->config_get && s->host->config_get(s->host, "publish_period_seconds", &v) == BALLAST_OK)
    period = std::atof(v);
  if (!(period > 0)) {
    if (s->host->set_error)
      s->host->set_error(s->host, "publish_period_seconds must be positive");
    return BALLAST_EINVAL;
  }
  if (const TraceRing* ring = TraceRing::current()) s->publisher.start_at(ring->head());
  const int rc = s->host->timer_start(s->host, uint64_t(period * 1e9), publish_ring, s, &s->timer);
  s->timing = rc == BALLAST_OK;
  return rc;
}

void stop(void* state) {
  auto* s = static_cast<State*>(state);
  if (s->timing) s->host->timer_cancel(s->host, s->timer);
  s->timing = false;
}

void destroy(void* state) { delete static_cast<State*>(state); }

const void* get_interface(void*, const char* name, uint32_t version) {
  const std::string_view n = name ? name : "";
  return n == BALLAST_COMM_INTERFACE && version == BALLAST_COMM_VERSION ? ballast::comm_nccl::api() : nullptr;
}

const ballast_interface_info kInterfaces[] = {{BALLAST_COMM_INTERFACE, BALLAST_COMM_VERSION}, {nullptr, 0}};

const ballast_plugin_descriptor kDescriptor = {
    sizeof(ballast_plugin_descriptor), BALLAST_ABI_MAJOR, BALLAST_ABI_MINOR, 0, "comm-nccl", "0.1.0", "comm",
    "collectives on CUDA devices over NCCL (non-blocking communicators, a watchdog that aborts on timeout or error), "
    "traced and published on the bus",
    create, start, stop, destroy, get_interface, kInterfaces};

}  // namespace

extern "C" BALLAST_EXPORT const ballast_plugin_descriptor* ballast_plugin_v1(uint32_t) { return &kDescriptor; }
