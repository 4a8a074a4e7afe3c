#include "job_config.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <sstream>

namespace ballast::runner {

namespace {

namespace fs = std::filesystem;

double number(const nlohmann::json& j, const char* key, double fallback, double lo, double hi) {
  if (!j.contains(key)) return fallback;
  const auto& v = j[key];
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < lo || v.get<double>() > hi) {
    std::ostringstream o;
    o << "job." << key << ": want a number in [" << lo << ", " << hi << "], got " << v.dump();
    throw ConfigError(o.str());
  }
  return v.get<double>();
}

int integer(const nlohmann::json& j, const char* key, int fallback, int lo, int hi) {
  const double v = number(j, key, fallback, lo, hi);
  if (v != std::floor(v)) throw ConfigError(std::string("job.") + key + ": want an integer, got " + j[key].dump());
  return int(v);
}

std::string text(const nlohmann::json& j, const char* key, const std::string& fallback, const char* prefix = "job.") {
  if (!j.contains(key)) return fallback;
  if (!j[key].is_string()) throw ConfigError(std::string(prefix) + key + ": want a string, got " + j[key].dump());
  return j[key].get<std::string>();
}

bool flag(const nlohmann::json& j, const char* key, bool fallback) {
  if (!j.contains(key)) return fallback;
  if (!j[key].is_boolean()) throw ConfigError(std::string("job.") + key + ": want true or false, got " + j[key].dump());
  return j[key].get<bool>();
}

std::string absolute(const std::string& path, const std::string& base_dir) {
  if (path.empty() || fs::path(path).is_absolute()) return path;
  return (fs::path(base_dir) / path).lexically_normal().string();
}

std::vector<std::string> strings(const nlohmann::json& j, const char* key) {
  std::vector<std::string> out;
  if (!j.contains(key)) return out;
  const std::string field = std::string("job.slurm.") + key;
  if (!j[key].is_array()) throw ConfigError(field + ": want a list of strings");
  if (j[key].size() > 100000) throw ConfigError(field + ": more than 100000 entries");
  for (size_t i = 0; i < j[key].size(); ++i) {
    const auto& v = j[key][i];
    if (!v.is_string() || v.get<std::string>().empty())
      throw ConfigError(field + "[" + std::to_string(i + 1) + "]: want a non-empty string, got " + v.dump());
    out.push_back(v.get<std::string>());
  }
  return out;
}

SlurmConfig parse_slurm(const nlohmann::json& j, const std::string& base_dir) {
  if (!j.is_object()) throw ConfigError("job.slurm: want a table { conf = ..., reservation = ..., ... }");
  static const char* kKeys[] = {"conf",
                                "partition",
                                "reservation",
                                "nodes",
                                "spares",
                                "sbatch_args",
                                "command_timeout_seconds",
                                "snapshot_seconds"};
  for (const auto& [k, v] : j.items()) {
    bool known = false;
    for (const char* key : kKeys) known = known || k == key;
    if (!known) throw ConfigError("job.slurm." + k + ": unknown field");
  }
  SlurmConfig c;
  c.conf = absolute(text(j, "conf", "", "job.slurm."), base_dir);
  c.partition = text(j, "partition", "", "job.slurm.");
  c.reservation = text(j, "reservation", c.reservation, "job.slurm.");
  if (c.reservation.empty() || c.reservation.find_first_of(" \t\n=") != std::string::npos)
    throw ConfigError("job.slurm.reservation: want a name without spaces or '=', got \"" + c.reservation + "\"");
  c.nodes = strings(j, "nodes");
  c.spares = strings(j, "spares");
  c.sbatch_args = strings(j, "sbatch_args");
  if (j.contains("command_timeout_seconds")) {
    const auto& v = j["command_timeout_seconds"];
    if (!v.is_number() || v.get<double>() < 1 || v.get<double>() > 3600)
      throw ConfigError("job.slurm.command_timeout_seconds: want a number in [1, 3600], got " + v.dump());
    c.command_timeout_s = v.get<double>();
  }
  if (j.contains("snapshot_seconds")) {
    const auto& v = j["snapshot_seconds"];
    if (!v.is_number() || v.get<double>() < 1 || v.get<double>() > 3600)
      throw ConfigError("job.slurm.snapshot_seconds: want a number in [1, 3600], got " + v.dump());
    c.snapshot_s = v.get<double>();
  }
  return c;
}

}  // namespace

std::string resolve_program(const std::string& program, const std::string& base_dir) {
  if (program.empty()) throw ConfigError("job.command[1]: empty program name");
  auto executable = [](const fs::path& p) {
    std::error_code ec;
    return fs::is_regular_file(p, ec) && access(p.c_str(), X_OK) == 0;
  };
  if (program.find('/') != std::string::npos) {
    const std::string p = absolute(program, base_dir);
    if (executable(p)) return p;
    // A path relative to where `ballast run` was started works too.
    if (executable(program)) return fs::absolute(program).string();
    throw ConfigError("job.command[1]: '" + program + "' does not exist or is not executable (looked at " + p + ")");
  }
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "/usr/local/bin:/usr/bin:/bin");
  for (std::string dir; std::getline(ss, dir, ':');)
    if (!dir.empty() && executable(fs::path(dir) / program)) return (fs::path(dir) / program).string();
  // Beside the ballast executable: the bundled trainer of a build or an install.
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec && executable(self.parent_path() / program)) return (self.parent_path() / program).string();
  throw ConfigError("job.command[1]: '" + program + "' is not found in PATH or beside " +
                    (ec ? std::string("the ballast executable") : self.parent_path().string()));
}

JobConfig parse_job_config(const nlohmann::json& job, const nlohmann::json& top, const std::string& base_dir) {
  if (!job.is_object()) throw ConfigError("job: want a table { command = {...}, ranks = N, ... }");
  static const char* kKeys[] = {"command",
                                "name",
                                "ranks",
                                "ranks_per_node",
                                "standby",
                                "steps",
                                "dir",
                                "trace_dir",
                                "env",
                                "cgroups",
                                "netns",
                                "stop_grace_seconds",
                                "hello_timeout_seconds",
                                "exit_grace_seconds",
                                "checkpoint_timeout_seconds",
                                "pause_seconds",
                                "unhandled_seconds",
                                "repair_seconds",
                                "action_tries",
                                "backoff_seconds",
                                "restart_loop_limit",
                                "keep_checkpoints",
                                "metrics_period_seconds",
                                "placement_timeout_seconds",
                                "progress",
                                "backend",
                                "slurm",
                                "relay_socket"};
  for (const auto& [k, v] : job.items()) {
    bool known = false;
    for (const char* key : kKeys) known = known || k == key;
    if (!known) throw ConfigError("job." + k + ": unknown field");
  }
  JobConfig c;
  if (!job.contains("command") || !job["command"].is_array() || job["command"].empty())
    throw ConfigError("job.command: want a list of strings, the program first");
  for (size_t i = 0; i < job["command"].size(); ++i) {
    const auto& a = job["command"][i];
    if (!a.is_string() && !a.is_number())
      throw ConfigError("job.command[" + std::to_string(i + 1) + "]: want a string, got " + a.dump());
    c.command.push_back(a.is_string() ? a.get<std::string>() : a.dump());
  }
  c.command[0] = resolve_program(c.command[0], base_dir);
  c.name = text(job, "name", c.name);
  c.ranks = integer(job, "ranks", 1, 1, 1024);
  c.ranks_per_node = integer(job, "ranks_per_node", 1, 1, 1024);
  if (c.ranks % c.ranks_per_node != 0)
    throw ConfigError("job.ranks_per_node: " + std::to_string(c.ranks_per_node) +
                      " does not divide ranks = " + std::to_string(c.ranks));
  c.standby = integer(job, "standby", 1, 0, 64);
  c.steps = int64_t(number(job, "steps", 0, 0, 1e15));
  c.dir = absolute(text(job, "dir", ""), base_dir);
  c.trace_dir = absolute(text(job, "trace_dir", ""), base_dir);
  if (job.contains("env")) {
    if (!job["env"].is_object()) throw ConfigError("job.env: want a table of NAME = \"value\"");
    for (const auto& [k, v] : job["env"].items()) {
      if (!v.is_string() && !v.is_number()) throw ConfigError("job.env." + k + ": want a string");
      c.env[k] = v.is_string() ? v.get<std::string>() : v.dump();
    }
  }
  c.cgroups = flag(job, "cgroups", true);
  c.relay_socket = text(job, "relay_socket", "");
  if (!c.relay_socket.empty() && c.relay_socket[0] != '/')
    throw ConfigError("job.relay_socket: want an absolute path (the agents' socket on every node), got '" +
                      c.relay_socket + "'");
  if (job.contains("netns")) {
    const auto& v = job["netns"];
    if (v.is_boolean())
      c.netns = v.get<bool>() ? NetnsMode::on : NetnsMode::off;
    else if (v == "auto")
      c.netns = NetnsMode::automatic;
    else
      throw ConfigError("job.netns: want true, false or \"auto\", got " + v.dump());
  }
  c.progress = flag(job, "progress", true);
  c.stop_grace_s = number(job, "stop_grace_seconds", c.stop_grace_s, 0, 600);
  c.hello_timeout_s = number(job, "hello_timeout_seconds", c.hello_timeout_s, 0.1, 86400);
  c.exit_grace_s = number(job, "exit_grace_seconds", c.exit_grace_s, 0.1, 86400);
  c.checkpoint_timeout_s = number(job, "checkpoint_timeout_seconds", c.checkpoint_timeout_s, 0.1, 86400);
  c.pause_s = number(job, "pause_seconds", c.pause_s, 0, 86400);
  c.unhandled_s = number(job, "unhandled_seconds", c.unhandled_s, 0.1, 86400);
  c.repair_s = number(job, "repair_seconds", c.repair_s, 0, 1e9);
  c.action_tries = integer(job, "action_tries", c.action_tries, 1, 100);
  c.backoff_s = number(job, "backoff_seconds", c.backoff_s, 0, 3600);
  c.restart_loop_limit = integer(job, "restart_loop_limit", c.restart_loop_limit, 1, 1000);
  c.keep_checkpoints = integer(job, "keep_checkpoints", c.keep_checkpoints, 0, 1000000);
  c.metrics_period_s = number(job, "metrics_period_seconds", c.metrics_period_s, 0, 3600);
  c.placement_timeout_s = number(job, "placement_timeout_seconds", c.placement_timeout_s, 0, 600);
  c.backend = text(job, "backend", c.backend);
  if (c.backend != "local" && c.backend != "slurm")
    throw ConfigError("job.backend: want \"local\" or \"slurm\", got \"" + c.backend + "\"");
  if (job.contains("slurm") && c.backend != "slurm") throw ConfigError("job.slurm: only with backend = \"slurm\"");
  if (c.netns != NetnsMode::off && c.backend != "local")
    throw ConfigError("job.netns: only with backend = \"local\" (a Slurm node has a network of its own)");
  if (c.backend == "slurm") {
    c.slurm = parse_slurm(job.contains("slurm") ? job["slurm"] : nlohmann::json::object(), base_dir);
    // Per-node metrics come from the agents' collectors: the executor sees no process on a node.
    if (!job.contains("metrics_period_seconds")) c.metrics_period_s = 0;
    if (!c.slurm.nodes.empty() && int(c.slurm.nodes.size()) != c.nodes())
      throw ConfigError("job.slurm.nodes: " + std::to_string(c.slurm.nodes.size()) + " nodes for a job of " +
                        std::to_string(c.nodes()) + " (ranks / ranks_per_node)");
    if (!c.slurm.spares.empty() && int(c.slurm.spares.size()) != c.standby)
      throw ConfigError("job.slurm.spares: " + std::to_string(c.slurm.spares.size()) +
                        " spares for standby = " + std::to_string(c.standby));
  }

  c.report = text(top, "report", c.report, "");
  if (c.report != "text" && c.report != "json" && c.report != "none")
    throw ConfigError("report: want \"text\", \"json\" or \"none\", got \"" + c.report + "\"");
  c.timeline = absolute(text(top, "timeline", "", ""), base_dir);
  const JobShape shape{c.ranks, c.nodes(), c.netns != NetnsMode::off};
  if (top.contains("inject")) {
    if (!top["inject"].is_array()) throw ConfigError("inject: want a list of fault specs");
    for (const auto& s : top["inject"]) {
      if (!s.is_string()) throw ConfigError("inject: want strings, got " + s.dump());
      c.injections.push_back(parse_spec(s.get<std::string>(), "--inject '" + s.get<std::string>() + "'", shape));
    }
  }
  if (top.contains("inject_schedule")) {
    ScheduleOptions o;
    o.seconds_per_day = number(top, "schedule_seconds_per_day", 1, 1e-9, 1e9);
    const std::string path = absolute(text(top, "inject_schedule", "", ""), base_dir);
    for (auto& in : parse_schedule(path, shape, o)) c.injections.push_back(std::move(in));
  }
  return c;
}

}  // namespace ballast::runner
