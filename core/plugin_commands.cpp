#include "plugin_commands.hpp"

#include "error.hpp"
#include "host.hpp"

#include <ballast/command.h>

#include <cstdio>
#include <cstring>

namespace ballast {

bool plugin_commands_in(const PluginFile& f, std::string* error,
                        const std::function<bool(void*, const ballast_command&)>& visit) {
  HostOptions o;
  o.log_level = BALLAST_LOG_WARN;
  Host host(o);
  if (host.load_plugin(f.path, nlohmann::json::object()) != BALLAST_OK) {
    *error = last_error();
    return false;
  }
  void* state = nullptr;
  auto* table = static_cast<const ballast_command_table*>(
      host.get_interface(f.name, BALLAST_COMMAND_INTERFACE, BALLAST_COMMAND_VERSION, &state));
  const std::string who = "plugin " + f.path + " (" + f.name + "): ";
  if (table == nullptr || table->size < BALLAST_COMMAND_TABLE_V1_SIZE) {
    *error = who + "offers ballast.command but returns no valid command table";
    return false;
  }
  if (table->count > 256 || (table->count > 0 && table->commands == nullptr)) {
    *error = who + "command table claims " + std::to_string(table->count) + " command(s) at " +
             (table->commands ? "an address" : "NULL") + " (at most 256 allowed)";
    return false;
  }
  for (uint32_t i = 0; i < table->count; ++i) {
    const ballast_command& c = table->commands[i];
    if (c.name == nullptr || strnlen(c.name, 65) > 64 || (c.summary && strnlen(c.summary, 257) > 256)) {
      *error = who + "command " + std::to_string(i) + " has no name or a name or summary too long";
      return false;
    }
    if (visit(state, c)) return true;
  }
  return false;
}

std::vector<PluginProbe> command_probes() {
  std::vector<std::string> files;
  for (const auto& dir : plugin_search_path())
    for (const auto& path : plugin_files_in(dir)) files.push_back(path);
  return probe_plugin_files(files, true);
}

std::vector<PluginCommand> list_plugin_commands(const std::vector<PluginProbe>& probes) {
  std::vector<PluginCommand> out;
  for (const auto& p : probes)
    for (const auto& [name, summary] : p.commands) {
      bool dup = false;
      for (const auto& o : out) dup = dup || o.name == name;
      if (!dup) out.push_back({name, summary, p.info.name});
    }
  return out;
}

int run_plugin_command(const std::string& name, const std::vector<PluginProbe>& probes, int argc, char** argv) {
  for (const auto& probe : probes) {
    bool offers = false;
    for (const auto& c : probe.commands) offers = offers || c.first == name;
    if (!offers) continue;
    // Only the plugin that offers the command is loaded in this process.
    PluginFile f;
    std::string error;
    int rc = -1;
    if (load_plugin_file(probe.path, &f) != BALLAST_OK) {
      error = last_error();
    } else {
      plugin_commands_in(f, &error, [&](void* state, const ballast_command& c) {
        if (name != c.name || c.run == nullptr) return false;
        rc = c.run(state, argc, argv);
        return true;
      });
    }
    if (rc >= 0) return rc;
    std::fprintf(stderr, "ballast %s: %s\n", name.c_str(), error.empty() ? "the command has no run()" : error.c_str());
    return 1;
  }
  return -1;
}

}  // namespace ballast
