// ballast run CONFIG.lua: the host process.
#include "commands.hpp"

#include "config.hpp"
#include "error.hpp"
#include "host.hpp"

#include <cstdio>
#include <filesystem>

namespace ballast::cli {

void add_run(CLI::App& app) {
  auto* cmd = app.add_subcommand("run", "Run the host (agent or controller) from a Lua config file");
  static std::string config_path;
  static bool json = false;
  cmd->add_option("CONFIG", config_path, "Config file: a Lua table (see examples/configs/default.lua)")
      ->required();
  cmd->add_flag("--json", json, "On exit, print the counters as one JSON object");
  cmd->callback([] {
    nlohmann::json config;
    if (eval_lua_table(config_path, false, &config) != BALLAST_OK) {
      std::fprintf(stderr, "ballast run: %s\n", last_error());
      set_exit_code(1);
      return;
    }
    std::string base = std::filesystem::absolute(config_path).parent_path().string();
    std::unique_ptr<Host> host;
    if (Host::from_config(config, base, &host) != BALLAST_OK) {
      std::fprintf(stderr, "ballast run: %s: %s\n", config_path.c_str(), last_error());
      set_exit_code(1);
      return;
    }
    Host* h = host.get();
    auto ready = [h] {
      h->log(BALLAST_LOG_INFO, "host",
             "running on node " + h->node() + " with " + std::to_string(h->plugin_count()) +
                 " plugin(s); SIGINT/SIGTERM stop, SIGHUP reloads the policy");
    };
    if (host->run(true, ready) != BALLAST_OK) {
      std::fprintf(stderr, "ballast run: %s\n", last_error());
      set_exit_code(1);
      return;
    }
    nlohmann::json counters = host->counters();
    host.reset();  // destroy plugins in reverse order before reporting
    if (json) {
      std::printf("%s\n", counters.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else {
      std::fprintf(stderr, "ballast run: stopped cleanly;");
      for (auto& [k, v] : counters.items()) std::fprintf(stderr, " %s=%s", k.c_str(), v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
      std::fprintf(stderr, "\n");
    }
  });
}

}  // namespace ballast::cli
