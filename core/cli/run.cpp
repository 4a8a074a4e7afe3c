// ballast run CONFIG.lua: the host process.
#include "commands.hpp"

#include "config_file.hpp"
#include "error.hpp"
#include "host_config.hpp"
#include "role.hpp"
#include "run_job.hpp"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <utility>

namespace ballast::cli {

namespace {

// --log-level and --log-format, else BALLAST_LOG_LEVEL and BALLAST_LOG_FORMAT,
// else the config's log_level and log_format: the winner goes into the config.
bool log_overrides(nlohmann::json& config, const std::string& level_flag, const std::string& format_flag,
                   std::string* error) {
  struct Setting {
    const char* key;
    const std::string& flag;
    const char* flag_name;
    const char* env;
    bool (*valid)(const std::string&);
    const char* expected;
  };
  const Setting settings[] = {
      {"log_level", level_flag, "--log-level", "BALLAST_LOG_LEVEL",
       [](const std::string& v) {
         int l;
         return parse_log_level(v, &l);
       },
       "error, warn, info or debug"},
      {"log_format", format_flag, "--log-format", "BALLAST_LOG_FORMAT",
       [](const std::string& v) {
         LogFormat f;
         return parse_log_format(v, &f);
       },
       "text or json"},
  };
  for (const Setting& s : settings) {
    const char* env = std::getenv(s.env);
    const std::string value = !s.flag.empty() ? s.flag : env != nullptr && *env ? env : "";
    if (value.empty()) continue;
    if (!s.valid(value)) {
      *error = std::string(!s.flag.empty() ? s.flag_name : s.env) + ": '" + value + "': expected " + s.expected;
      return false;
    }
    config[s.key] = value;
  }
  return true;
}

}  // namespace

void add_run(CLI::App& app) {
  auto* cmd = app.add_subcommand("run", "Run the host (agent or controller) from a Lua config file");
  static std::string config_path;
  static bool json = false;
  cmd->add_option("CONFIG", config_path, "Config file: a Lua file returning a table (its keys: docs/config.md)")
      ->required();
  cmd->add_flag("--json", json, "On exit, print the counters (with a job: the job's report) as one JSON object");
  static JobFlags job_flags;
  cmd->add_option("--inject", job_flags.inject,
                  "Inject a fault into the job (repeatable): hang|crash|skip:rank=R@T, slow:rank=R,factor=F@T, "
                  "machine:node=N,kind=cpu|mem@T, nan@STEP, usererror@STEP");
  cmd->add_option("--inject-schedule", job_flags.inject_schedule,
                  "Inject the faults of a JSON-lines schedule (or the InfiniteHBD trace)");
  cmd->add_option("--timeline", job_flags.timeline, "Write the job's timeline as a Chrome/Perfetto trace");
  static std::string log_level, log_format;
  cmd->add_option("--log-level", log_level,
                  "error|warn|info|debug (default: $BALLAST_LOG_LEVEL, else the config's log_level, else info)")
      ->check(CLI::IsMember({"error", "warn", "info", "debug"}));
  cmd->add_option("--log-format", log_format,
                  "text|json: json writes one object per line (default: $BALLAST_LOG_FORMAT, else the config's "
                  "log_format, else text)")
      ->check(CLI::IsMember({"text", "json"}));
  cmd->footer(
      "Signals: SIGINT/SIGTERM stop, SIGHUP reloads the policy, SIGUSR1/SIGUSR2 write the counters to the log "
      "and publish host.signal.");
  cmd->callback([] {
    nlohmann::json config;
    if (eval_lua_table(config_path, false, &config) != BALLAST_OK) {
      std::fprintf(stderr, "ballast run: %s\n", last_error());
      set_exit_code(1);
      return;
    }
    if (std::string why; config.is_object() && !log_overrides(config, log_level, log_format, &why)) {
      std::fprintf(stderr, "ballast run: %s\n", why.c_str());
      set_exit_code(2);
      return;
    }
    std::string base = std::filesystem::absolute(config_path).parent_path().string();
    const bool json_log = config.is_object() && config.contains("log_format") && config["log_format"] == "json";
    job_flags.json = json;
    bool has_job = false;
    if (std::string why; !hand_job_to_runner(config, base, job_flags, &has_job, &why)) {
      std::fprintf(stderr, "ballast run: %s\n", why.c_str());
      set_exit_code(2);
      return;
    }
    std::unique_ptr<Host> host;
    if (host_from_config(config, base, &host) != BALLAST_OK) {
      std::fprintf(stderr, "ballast run: %s: %s\n", config_path.c_str(), last_error());
      set_exit_code(1);
      return;
    }
    // The cluster role (agent or controller), when the config has a cluster table.
    std::unique_ptr<cluster::Role> role;
    if (cluster::Role::from_config(config, base, *host, &role) != BALLAST_OK) {
      std::fprintf(stderr, "ballast run: %s: %s\n", config_path.c_str(), last_error());
      set_exit_code(1);
      return;
    }
    Host* h = host.get();
    // The role's counters with the host's: on SIGUSR1/2, /metrics and the stop line.
    struct RoleCounters {
      Host* host;
      uint64_t id;
      ~RoleCounters() {
        if (id != 0) host->remove_counter_source(id);
      }
    } role_counters{h, role ? h->add_counter_source([r = role.get()] { return r->counters(); }) : 0};
    bool role_failed = false;
    JobWatch watch;
    if (has_job) watch.attach(*h);
    auto ready = [h, has_job, &watch, &role, &role_failed] {
      if (role && role->start() != BALLAST_OK) {
        std::fprintf(stderr, "ballast run: cluster role: %s\n", last_error());
        role_failed = true;
        h->request_stop();
        return;
      }
      if (has_job && !watch.started()) {
        std::fprintf(stderr, "ballast run: %s: the job did not start (the error is above)\n", config_path.c_str());
        set_exit_code(1);
        h->request_stop();
        return;
      }
      h->log(BALLAST_LOG_INFO, "host",
             "running on node " + h->node() + " with " + std::to_string(h->plugin_count()) +
                 " plugin(s); SIGINT/SIGTERM stop, SIGHUP reloads the policy, SIGUSR1/SIGUSR2 log the counters");
    };
    if (host->run(true, ready) != BALLAST_OK) {
      std::fprintf(stderr, "ballast run: %s\n", last_error());
      set_exit_code(1);
      return;
    }
    if (role) role->stop();
    const nlohmann::json counters = host->counters();
    if (role_counters.id != 0) h->remove_counter_source(std::exchange(role_counters.id, 0));
    role.reset();
    host.reset();  // destroy plugins in reverse order before reporting
    if (role_failed) set_exit_code(1);
    // Events the journal could not write (a full disk): not a clean stop.
    const uint64_t journal_failed = counters.value("journal.failed", uint64_t{0});
    if (journal_failed > 0) set_exit_code(1);
    if (has_job && watch.started()) {
      set_exit_code(watch.exit_code() == 0 && journal_failed > 0 ? 1 : watch.exit_code());
      if (json) {
        nlohmann::json report = watch.report();
        report["counters"] = counters;
        std::printf("%s\n", report.dump().c_str());
        return;
      }
    }
    if (json) {
      std::printf("%s\n", counters.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else if (json_log) {
      // The last line in the log's own format: the summary as one JSON object.
      nlohmann::json line = nlohmann::json::parse(
          log_line(LogFormat::json, journal_failed > 0 ? BALLAST_LOG_ERROR : BALLAST_LOG_INFO, "run",
                   journal_failed > 0 ? "stopped; the journal lost events" : "stopped cleanly"));
      line["counters"] = counters;
      std::fprintf(stderr, "%s\n", line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else {
      if (journal_failed > 0) {
        std::fprintf(stderr, "ballast run: stopped; the journal lost %llu event(s) (the first error is above);",
                     static_cast<unsigned long long>(journal_failed));
      } else {
        std::fprintf(stderr, "ballast run: stopped cleanly;");
      }
      for (auto& [k, v] : counters.items())
        std::fprintf(stderr, " %s=%s", k.c_str(),
                     v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
      std::fprintf(stderr, "\n");
    }
  });
}

}  // namespace ballast::cli
