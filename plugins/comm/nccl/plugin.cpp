// ballast-comm-nccl: the plugin entry. The logic is in nccl_comm.cpp.
#include "nccl_comm.hpp"

#include <ballast/plugin.h>

#include <new>
#include <string_view>

namespace {

int create(const ballast_host_api*, void** state) {
  *state = nullptr;  // stateless: every communicator carries its own state
  return BALLAST_OK;
}
void destroy(void*) {}

const void* get_interface(void*, const char* name, uint32_t version) {
  const std::string_view n = name ? name : "";
  return n == BALLAST_COMM_INTERFACE && version == BALLAST_COMM_VERSION ? ballast::comm_nccl::api() : nullptr;
}

const ballast_interface_info kInterfaces[] = {{BALLAST_COMM_INTERFACE, BALLAST_COMM_VERSION}, {nullptr, 0}};

const ballast_plugin_descriptor kDescriptor = {
    sizeof(ballast_plugin_descriptor), BALLAST_ABI_MAJOR, BALLAST_ABI_MINOR, 0, "comm-nccl", "0.1.0", "comm",
    "collectives on CUDA devices over NCCL (non-blocking communicators, watchdog, abort on timeout), traced",
    create, nullptr, nullptr, destroy, get_interface, kInterfaces};

}  // namespace

extern "C" BALLAST_EXPORT const ballast_plugin_descriptor* ballast_plugin_v1(uint32_t) { return &kDescriptor; }
