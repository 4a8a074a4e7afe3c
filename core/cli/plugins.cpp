// ballast plugins [DIR|FILE...]: what plugins are found, or why one is refused.
#include "commands.hpp"

#include "error.hpp"
#include "plugin_probe.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>

namespace ballast::cli {

void add_plugins(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("plugins", "List plugins (file, name, kind, version, ABI, interfaces) or why one is refused");
  static std::vector<std::string> paths;
  static bool json = false;
  cmd->add_option("PATH", paths, "Plugin files or folders (default: the plugin search path)");
  cmd->add_flag("--json", json, "One JSON object {\"plugins\": [...], \"refused\": [...]}");
  cmd->callback([] {
    std::vector<std::string> files;
    std::vector<std::string> roots = paths.empty() ? plugin_search_path() : paths;
    for (const auto& p : roots) {
      std::error_code ec;
      if (std::filesystem::is_directory(p, ec)) {
        for (auto& f : plugin_files_in(p)) files.push_back(f);
      } else {
        files.push_back(p);  // a missing file is reported as refused
      }
    }
    nlohmann::json listed = nlohmann::json::array(), refused = nlohmann::json::array();
    // Inspected in child processes: listing a file never runs it here.
    for (const auto& probe : probe_plugin_files(files, false)) {
      if (!probe.error.empty()) {
        refused.push_back({{"file", probe.path}, {"reason", probe.error}});
        continue;
      }
      const PluginFile& pf = probe.info;
      nlohmann::json interfaces = nlohmann::json::array();
      for (auto& i : pf.interfaces) interfaces.push_back({{"name", i.name}, {"version", i.version}});
      listed.push_back({{"file", pf.path},
                        {"name", pf.name},
                        {"kind", pf.kind},
                        {"version", pf.version},
                        {"abi", std::to_string(pf.abi_major) + "." + std::to_string(pf.abi_minor)},
                        {"description", pf.description},
                        {"interfaces", interfaces}});
    }
    if (json) {
      std::printf("%s\n", nlohmann::json{{"plugins", listed}, {"refused", refused}}
                              .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                              .c_str());
    } else {
      if (files.empty()) std::printf("no plugin files in %zu folder(s)\n", roots.size());
      for (auto& p : listed) {
        std::string ifs;
        for (auto& i : p["interfaces"])
          ifs +=
              (ifs.empty() ? "" : ", ") + i["name"].get<std::string>() + " v" + std::to_string(i["version"].get<int>());
        std::printf("%-12s %-10s %-8s ABI %s  %s\n  %s\n  interfaces: %s\n", p["name"].get<std::string>().c_str(),
                    p["kind"].get<std::string>().c_str(), p["version"].get<std::string>().c_str(),
                    p["abi"].get<std::string>().c_str(), p["description"].get<std::string>().c_str(),
                    p["file"].get<std::string>().c_str(), ifs.empty() ? "(none)" : ifs.c_str());
      }
      for (auto& r : refused) std::printf("REFUSED %s\n", r["reason"].get<std::string>().c_str());
    }
    set_exit_code(refused.empty() ? 0 : 1);
  });
}

}  // namespace ballast::cli
