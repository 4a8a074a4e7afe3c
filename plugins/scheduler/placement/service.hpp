// The scheduler plugin's state behind the C ABI: the "ballast.command" table
// (`ballast plan`), the "ballast.scheduler" table, and the bus handlers
// (placement.request -> placement.plan; fault.confirmed marks nodes faulty).
#pragma once
#include <ballast/command.h>
#include <ballast/plugin.h>
#include <ballast/scheduler.h>

namespace ballast::sched {

int service_create(const ballast_host_api* host, void** state);
int service_start(void* state);
void service_stop(void* state);
void service_destroy(void* state);
const void* service_get_interface(void* state, const char* name, uint32_t version);

}  // namespace ballast::sched
