#include "plugin_commands.hpp"

#include "host.hpp"
#include "loader.hpp"

#include <ballast/command.h>

#include <functional>

namespace ballast {

namespace {

// Every loadable plugin file offering "ballast.command" in the search path,
// first occurrence of a name winning.
std::vector<PluginFile> command_plugins() {
  std::vector<PluginFile> found;
  for (const auto& dir : plugin_search_path()) {
    for (const auto& path : plugin_files_in(dir)) {
      PluginFile f;
      if (load_plugin_file(path, &f) != BALLAST_OK) continue;
      if (!f.offers(BALLAST_COMMAND_INTERFACE, BALLAST_COMMAND_VERSION)) continue;
      bool dup = false;
      for (const auto& g : found) dup = dup || g.name == f.name;
      if (!dup) found.push_back(f);
    }
  }
  return found;
}

// Create each command plugin in a host of its own (not started) and call
// visit(state, command) for each of its commands until visit returns true.
// Returns whether some call did.
bool visit_commands(const std::function<bool(void*, const ballast_command&)>& visit) {
  for (const auto& f : command_plugins()) {
    HostOptions o;
    o.log_level = BALLAST_LOG_WARN;
    Host host(o);
    if (host.load_plugin(f.path, nlohmann::json::object()) != BALLAST_OK) continue;
    void* state = nullptr;
    auto* table = static_cast<const ballast_command_table*>(
        host.get_interface(f.name, BALLAST_COMMAND_INTERFACE, BALLAST_COMMAND_VERSION, &state));
    if (table == nullptr || table->size < BALLAST_COMMAND_TABLE_V1_SIZE) continue;
    for (uint32_t i = 0; i < table->count; ++i)
      if (table->commands[i].name && visit(state, table->commands[i])) return true;
  }
  return false;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> list_plugin_commands() {
  std::vector<std::pair<std::string, std::string>> out;
  visit_commands([&](void*, const ballast_command& c) {
    out.emplace_back(c.name, c.summary ? c.summary : "");
    return false;
  });
  return out;
}

int run_plugin_command(const std::string& name, int argc, char** argv) {
  int rc = -1;
  visit_commands([&](void* state, const ballast_command& c) {
    if (name != c.name || c.run == nullptr) return false;
    rc = c.run(state, argc, argv);
    return true;
  });
  return rc;
}

}  // namespace ballast
