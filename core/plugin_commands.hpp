// The `ballast` subcommands that plugins add (interface "ballast.command",
// abi/ballast/command.h). Uses the host's public interface only.
#pragma once

#include "plugin_loader.hpp"
#include "plugin_probe.hpp"

#include <ballast/command.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace ballast {

// Every plugin file in the search path, inspected in child processes
// (plugin_probe.hpp) with the subcommands it offers.
std::vector<PluginProbe> command_probes();

// Run the plugin subcommand `name` of the first probe offering it: only
// that plugin is loaded in this process. Returns the exit code, or -1 when
// no plugin offers `name`.
int run_plugin_command(const std::string& name, const std::vector<PluginProbe>& probes, int argc, char** argv);

// A plugin subcommand and the plugin that offers it.
struct PluginCommand {
  std::string name, summary, plugin;
};

// Every plugin subcommand, the first offer of a name winning.
std::vector<PluginCommand> list_plugin_commands(const std::vector<PluginProbe>& probes);

// Create the plugin of `f` in a host of its own (not started) and call
// visit(state, command) for each of its commands, bounds-checked, until
// visit returns true. Returns whether some call did; *error says why a
// plugin or its table was refused.
bool plugin_commands_in(const PluginFile& f, std::string* error,
                        const std::function<bool(void*, const ballast_command&)>& visit);

}  // namespace ballast
