// ballast-comm-ucx: the plugin entry. The logic is in ucx_comm.cpp.
#include "ucx_comm.hpp"

#include "host_error.hpp"
#include "ring_publisher.hpp"

#include <ballast/comm.h>
#include <ballast/plugin.h>

#include <string_view>

namespace {

using namespace ballast::comm;

struct State {
  const ballast_host_api* host;
  RingPublisher publisher;
};

int start(void* state) { return static_cast<State*>(state)->publisher.start(); }
void stop(void* state) { static_cast<State*>(state)->publisher.stop(); }

int api_init(void*, const ballast_comm_config* cfg, ballast_comm** comm) {
  return comm_init(cfg, reinterpret_cast<Comm**>(comm));
}
int api_split(ballast_comm* parent, int32_t colour, int32_t key, ballast_comm** out) {
  return comm_split(reinterpret_cast<Comm*>(parent), colour, key, reinterpret_cast<Comm**>(out));
}
void api_destroy(ballast_comm* comm) { comm_destroy(reinterpret_cast<Comm*>(comm)); }
int api_abort(ballast_comm* comm, const char* reason) { return comm_abort(reinterpret_cast<Comm*>(comm), reason); }
int api_info(ballast_comm* comm, ballast_comm_info* info) { return comm_info(reinterpret_cast<Comm*>(comm), info); }
int api_start(ballast_comm* comm, const ballast_comm_args* args, ballast_comm_request** req) {
  return comm_start(reinterpret_cast<Comm*>(comm), args, req);
}
int api_run(ballast_comm* comm, const ballast_comm_args* args) { return comm_run(reinterpret_cast<Comm*>(comm), args); }
const char* api_last_error(void*) { return last_error(); }

const ballast_comm_api kApi = {sizeof(ballast_comm_api),
                               0,
                               api_init,
                               api_split,
                               api_destroy,
                               api_abort,
                               api_info,
                               api_start,
                               comm_test,
                               comm_wait,
                               api_run,
                               api_last_error};

int create(const ballast_host_api* host, void** state) {
  *state = new State{host, RingPublisher(host)};
  set_error_host(host);
  return BALLAST_OK;
}
void destroy(void* state) {
  forget_error_host(static_cast<State*>(state)->host);
  delete static_cast<State*>(state);
}

const void* get_interface(void*, const char* name, uint32_t version) {
  const std::string_view n = name ? name : "";
  return n == BALLAST_COMM_INTERFACE && version == BALLAST_COMM_VERSION ? &kApi : nullptr;
}

const ballast_interface_info kInterfaces[] = {{BALLAST_COMM_INTERFACE, BALLAST_COMM_VERSION}, {nullptr, 0}};

const ballast_plugin_descriptor kDescriptor = {sizeof(ballast_plugin_descriptor),
                                               BALLAST_ABI_MAJOR,
                                               BALLAST_ABI_MINOR,
                                               0,
                                               "comm-ucx",
                                               "0.1.0",
                                               "comm",
                                               "collectives between processes over UCX, traced in a shared-memory ring",
                                               create,
                                               start,
                                               stop,
                                               destroy,
                                               get_interface,
                                               kInterfaces};

}  // namespace

extern "C" BALLAST_EXPORT const ballast_plugin_descriptor* ballast_plugin_v1(uint32_t) { return &kDescriptor; }
