// `ballast startup ...`: the command-line face of the plugin.
#pragma once

#include <ballast/plugin.h>

namespace ballast::startup {

// Runs `ballast startup SUBCOMMAND ARGS...` (argv[0] is "ballast startup").
// host may be NULL (no events published). Returns the exit code.
int run_command(const ballast_host_api* host, int argc, char** argv);

}  // namespace ballast::startup
