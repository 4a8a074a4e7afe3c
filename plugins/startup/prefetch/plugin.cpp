// ballast-startup.so: the `ballast startup` command ("ballast.command" v1)
// and the trainer-facing "ballast.startup" v1 interface. The logic lives in
// ballast_startup_impl (the other files of this folder).
#include <cstring>
#include <new>

#include <ballast/command.h>
#include <ballast/startup.h>

#include "api.hpp"
#include "startup_command.hpp"

namespace {

int run_startup(void* state, int argc, char** argv) {
  return ballast::startup::run_command(static_cast<ballast::startup::ApiState*>(state)->host, argc, argv);
}

const ballast_command kCommands[] = {
    {"startup", "start-up profile, hot-block prefetch, dependency snapshots, striped checkpoint loads", run_startup}};
const ballast_command_table kCommandTable = {sizeof(ballast_command_table), 1, kCommands};

int create(const ballast_host_api* host, void** state) {
  auto* s = new (std::nothrow) ballast::startup::ApiState{host};
  if (s == nullptr) return BALLAST_ENOMEM;
  *state = s;
  return BALLAST_OK;
}

void destroy(void* state) { delete static_cast<ballast::startup::ApiState*>(state); }

const void* get_interface(void*, const char* name, uint32_t version) {
  if (std::strcmp(name, BALLAST_COMMAND_INTERFACE) == 0 && version == BALLAST_COMMAND_VERSION) return &kCommandTable;
  if (std::strcmp(name, BALLAST_STARTUP_INTERFACE) == 0 && version == BALLAST_STARTUP_VERSION)
    return ballast::startup::startup_api();
  return nullptr;
}

const ballast_interface_info kInterfaces[] = {{BALLAST_COMMAND_INTERFACE, BALLAST_COMMAND_VERSION},
                                              {BALLAST_STARTUP_INTERFACE, BALLAST_STARTUP_VERSION},
                                              {nullptr, 0}};

const ballast_plugin_descriptor kDescriptor = {
    sizeof(ballast_plugin_descriptor),
    BALLAST_ABI_MAJOR,
    BALLAST_ABI_MINOR,
    0,
    "startup",
    "0.1.0",
    "startup",
    "start-up profile, hot-block record and prefetch, dependency snapshots, striped checkpoint reads",
    create,
    nullptr,
    nullptr,
    destroy,
    get_interface,
    kInterfaces};

}  // namespace

extern "C" BALLAST_EXPORT const ballast_plugin_descriptor* ballast_plugin_v1(uint32_t host_minor) {
  (void)host_minor;
  return &kDescriptor;
}
