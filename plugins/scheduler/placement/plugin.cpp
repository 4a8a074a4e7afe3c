// The scheduler plugin's entry point; the logic is in ballast_scheduler_impl.
#include <ballast/plugin.h>

#include "service.hpp"

namespace {

const ballast_interface_info kInterfaces[] = {{BALLAST_COMMAND_INTERFACE, BALLAST_COMMAND_VERSION},
                                              {BALLAST_SCHEDULER_INTERFACE, BALLAST_SCHEDULER_VERSION},
                                              {nullptr, 0}};

const ballast_plugin_descriptor kDescriptor = {
    sizeof(ballast_plugin_descriptor),
    BALLAST_ABI_MAJOR,
    BALLAST_ABI_MINOR,
    0,
    "scheduler",
    "0.1.0",
    "scheduler",
    "topology-aware placement of training jobs (after Arnold), replacement, standby sizing",
    ballast::sched::service_create,
    ballast::sched::service_start,
    ballast::sched::service_stop,
    ballast::sched::service_destroy,
    ballast::sched::service_get_interface,
    kInterfaces};

}  // namespace

extern "C" BALLAST_EXPORT const ballast_plugin_descriptor* ballast_plugin_v1(uint32_t host_minor) {
  (void)host_minor;
  return &kDescriptor;
}
