// ballast-comm-nccl: the plugin entry. The logic is in nccl_comm.cpp; with
// a host, a timer publishes the process's trace ring (ring_publisher.hpp) every
// publish_period_seconds (default 0.1). The ring is the process's, made at
// its first traced communicator: the timer publishes nothing before.
#include "host_error.hpp"
#include "nccl_comm.hpp"
#include "ring_publisher.hpp"

#include <ballast/plugin.h>

#include <new>
#include <string_view>

namespace {

using ballast::comm::RingPublisher;

struct State {
  const ballast_host_api* host;
  RingPublisher publisher;
};

int create(const ballast_host_api* host, void** state) {
  *state = new (std::nothrow) State{host, RingPublisher(host)};
  if (*state == nullptr) return BALLAST_ENOMEM;
  ballast::comm::set_error_host(host);
  return BALLAST_OK;
}

int start(void* state) { return static_cast<State*>(state)->publisher.start(); }
void stop(void* state) { static_cast<State*>(state)->publisher.stop(); }

void destroy(void* state) {
  ballast::comm::forget_error_host(static_cast<State*>(state)->host);
  delete static_cast<State*>(state);
}

const void* get_interface(void*, const char* name, uint32_t version) {
  const std::string_view n = name ? name : "";
  return n == BALLAST_COMM_INTERFACE && version == BALLAST_COMM_VERSION ? ballast::comm_nccl::api() : nullptr;
}

const ballast_interface_info kInterfaces[] = {{BALLAST_COMM_INTERFACE, BALLAST_COMM_VERSION}, {nullptr, 0}};

const ballast_plugin_descriptor kDescriptor = {
    sizeof(ballast_plugin_descriptor),
    BALLAST_ABI_MAJOR,
    BALLAST_ABI_MINOR,
    0,
    "comm-nccl",
    "0.1.0",
    "comm",
    "collectives on CUDA devices over NCCL (non-blocking communicators, a watchdog that aborts on timeout or error), "
    "traced and published on the bus",
    create,
    start,
    stop,
    destroy,
    get_interface,
    kInterfaces};

}  // namespace

extern "C" BALLAST_EXPORT const ballast_plugin_descriptor* ballast_plugin_v1(uint32_t) { return &kDescriptor; }
