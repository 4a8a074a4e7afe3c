// The job the executor owns, as the config describes it:
//   job = { command = {"trainer", "--steps", "200"}, ranks = 4, ... }
// plus what `ballast run` hands over from its command line (injections,
// timeline, report form). Every field and its default is in README.md.
#pragma once

#include "inject.hpp"
#include "netns.hpp"

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ballast::runner {

struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// job.slurm: where the Slurm backend runs the job (README.md, "Slurm").
struct SlurmConfig {
  std::string conf;                            // SLURM_CONF ("": Slurm's default)
  std::string partition;                       // "": the default partition
  std::string reservation = "ballast-spares";  // the warm spares' reservation
  std::vector<std::string> nodes;              // the job's nodes ({}: the first idle ones)
  std::vector<std::string> spares;             // held in the reservation at start ({}: it exists already)
  std::vector<std::string> sbatch_args;        // more sbatch arguments
  double command_timeout_s = 30;               // per Slurm command
  double snapshot_s = 30;                      // the state recorded at least this often while training
};

struct JobConfig {
  std::vector<std::string> command;  // argv; [0] searched in PATH, or relative to base_dir
  std::string name = "job";
  int ranks = 1;
  int ranks_per_node = 1;  // ranks of one slot ("node")
  int standby = 1;         // spare slots
  int64_t steps = 0;       // the job's total, for progress only (0: unknown)
  std::string dir;         // the job's run folder ("": a new one under TMPDIR)
  std::string trace_dir;   // BALLAST_TRACE_DIR ("": from the environment, else new in /dev/shm)
  std::map<std::string, std::string> env;
  bool cgroups = true;
  NetnsMode netns = NetnsMode::off;  // a network namespace per slot (local backend)
  double stop_grace_s = 3;
  double hello_timeout_s = 60;       // a restarted job must be back within this
  double exit_grace_s = 30;          // a rank that reported done must exit within this
  double checkpoint_timeout_s = 60;  // checkpoint_now must be answered within this
  double pause_s = 30;               // pause without args.seconds
  double unhandled_s = 120;          // a failed job no action came for is escalated after this
  double repair_s = 30;              // an evicted slot is a standby again after this (local: the fault is gone)
  int action_tries = 3;
  double backoff_s = 1;
  int restart_loop_limit = 3;
  int keep_checkpoints = 3;        // the newest N checkpoints are kept, older ones deleted; 0: all
  double metrics_period_s = 1;     // per-slot metric.sample; 0: none
  double placement_timeout_s = 2;  // wait for the placement plugin's plan
  std::string report = "text";     // text, json (printed by `ballast run --json`), none
  std::string timeline;            // Chrome trace file, "" for none
  bool progress = true;            // a progress line when stderr is a terminal
  std::vector<Injection> injections;
  std::string backend = "local";  // local, slurm
  SlurmConfig slurm;
  // The node agents' relay socket (relay.hpp), "{node}" replaced by the
  // node's name: the ranks' BALLAST_JOB_SOCKET. "": the executor's job.sock.
  std::string relay_socket;
  int nodes() const { return ranks / ranks_per_node; }
};

// Build the config from the plugin's configuration: `job` (the table) and
// the top-level keys inject, inject_schedule, schedule_seconds_per_day,
// timeline, report. base_dir resolves relative paths. Throws ConfigError or
// InjectError naming the field, argument or file line.
JobConfig parse_job_config(const nlohmann::json& job, const nlohmann::json& top, const std::string& base_dir);

// The command's program as execvp would find it, or ConfigError saying it does not exist.
std::string resolve_program(const std::string& program, const std::string& base_dir);

}  // namespace ballast::runner
