// The `ballast` subcommands that plugins add (interface "ballast.command",
// abi/ballast/command.h): found in the plugin search path, each plugin
// created in a host of its own, not started. Uses the host's public
// interface only.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace ballast {

// Every plugin subcommand: name -> summary.
std::vector<std::pair<std::string, std::string>> list_plugin_commands();

// Run the plugin subcommand `name`. Returns the exit code, or -1 when no
// plugin offers `name`.
int run_plugin_command(const std::string& name, int argc, char** argv);

}  // namespace ballast
