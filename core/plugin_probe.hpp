// Inspecting plugin files without running them in this process: each file
// is loaded in a child process of its own (its ELF constructors, its
// descriptor and, when asked, its create() and command table run there),
// with a time limit; the child reports what it found through a pipe. A file
// that crashes, hangs or exits in the child is reported by name and costs
// the caller nothing: `ballast plugins` and the discovery of plugin
// subcommands go through here.
#pragma once

#include "plugin_loader.hpp"

#include <string>
#include <utility>
#include <vector>

namespace ballast {

struct PluginProbe {
  std::string path;
  std::string error;  // empty: the file loaded; else why not, naming the file
  PluginFile info;    // name, version, kind, abi, interfaces (descriptor is NULL here)
  std::vector<std::pair<std::string, std::string>> commands;  // name, summary
};

// How long one file may take, BALLAST_PLUGIN_PROBE_MS (default 10000).
int plugin_probe_timeout_ms();

// Probes every file at once, in children; `with_commands`: also create
// plugins offering "ballast.command" (not started) and read their commands.
std::vector<PluginProbe> probe_plugin_files(const std::vector<std::string>& files, bool with_commands);

}  // namespace ballast
