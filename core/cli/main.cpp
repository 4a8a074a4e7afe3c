// `ballast`: the command-line host. The built-in subcommands (run, plugins,
// policy check, journal cat) live in this folder; `ballast NAME ...` for any
// other NAME runs the subcommand a plugin offers through "ballast.command".
#include "commands.hpp"

#include "command_line.hpp"
#include "plugin_commands.hpp"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>

namespace {

bool is_builtin(const std::string& name) {
  return name == "run" || name == "plugins" || name == "policy" || name == "journal";
}

// The plugin files, inspected once (in child processes) when first needed.
const std::vector<ballast::PluginProbe>& probes() {
  static const std::vector<ballast::PluginProbe> p = ballast::command_probes();
  return p;
}

std::string plugin_commands_footer() {
  // Each command names its plugin (the name `ballast plugins` lists and a
  // config's `plugins` list loads).
  std::string text = "\nCommands from plugins (the plugin offering each in brackets):\n";
  auto commands = ballast::list_plugin_commands(probes());
  if (commands.empty()) text += "  (none found; set BALLAST_PLUGIN_PATH)\n";
  for (const auto& c : commands) {
    char line[320];
    std::snprintf(line, sizeof line, "  %-12s [%s] %s\n", c.name.c_str(), c.plugin.c_str(), c.summary.c_str());
    text += line;
  }
  for (const auto& p : probes())
    if (!p.error.empty()) text += "  (" + p.error + ")\n";
  return commands.empty() ? text : text + "\nRun `ballast COMMAND --help` for a command's options.\n";
}

int run_main(int argc, char** argv) {
  ballast::cli::install_crash_report();
  // A plugin subcommand: hand it the arguments after its name.
  if (argc >= 2 && argv[1][0] != '-' && !is_builtin(argv[1])) {
    std::string name = argv[1];
    std::string argv0 = std::string("ballast ") + name;
    argv[1] = argv0.data();
    int rc = ballast::run_plugin_command(name, probes(), argc - 1, argv + 1);
    if (rc >= 0) return rc;
    std::vector<std::string> known{"run", "plugins", "policy", "journal"};
    for (const auto& c : ballast::list_plugin_commands(probes())) known.push_back(c.name);
    std::string hint = ballast::util::closest(name, known);
    if (!hint.empty()) hint = " (did you mean '" + hint + "'?)";
    std::fprintf(stderr, "ballast: unknown command '%s'%s: no built-in and no plugin offers it\n", name.c_str(),
                 hint.c_str());
    std::fputs(plugin_commands_footer().c_str(), stderr);
    return ballast::util::kUsageError;
  }

  CLI::App app{"Ballast keeps large distributed training jobs running.", "ballast"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "ballast " BALLAST_VERSION);
  app.footer([] { return plugin_commands_footer(); });
  ballast::cli::add_run(app);
  ballast::cli::add_plugins(app);
  ballast::cli::add_policy(app);
  ballast::cli::add_journal(app);
  if (int rc = ballast::util::parse_command_line(app, argc, argv); rc >= 0) return rc;
  return ballast::cli::exit_code();
}

}  // namespace

// Every command ends here: an exception no command caught (a library's,
// std::bad_alloc) becomes a clear error and exit 1, never an abort.
int main(int argc, char** argv) {
  try {
    return run_main(argc, argv);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "ballast: out of memory (the input asks for more than this machine has)\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ballast: internal error: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "ballast: internal error: an unknown exception\n");
  }
  return 1;
}
