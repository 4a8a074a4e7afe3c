// `ballast run` with a job: what the command line hands to the executor
// plugin (runner) and what it hears back. The executor reads everything
// from its plugin config; the CLI only fills it in and watches job.state.
#pragma once

#include "host.hpp"

#include <nlohmann/json.hpp>

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

namespace ballast::cli {

struct JobFlags {
  std::vector<std::string> inject;  // --inject SPEC (repeatable)
  std::string inject_schedule;      // --inject-schedule FILE
  std::string timeline;             // --timeline FILE
  bool json = false;                // --json: the report as one JSON object on stdout
};

// Put the top-level `job` table and the flags into the runner plugin's
// config (adding `{ path = "runner" }` first in the plugin list when the
// config does not load it). Returns false with *error when flags need a job
// the config does not have. *has_job says whether the config runs a job.
bool hand_job_to_runner(nlohmann::json& config, const std::string& base_dir, const JobFlags& flags, bool* has_job,
                        std::string* error);

// Follows the job on the bus: stops the host when the job reaches a
// terminal state, keeps the report.
class JobWatch {
 public:
  int attach(Host& host);  // subscribe before the host starts
  bool started() const { return started_; }
  int exit_code() const;  // finished 0, interrupted 130, anything else 1
  nlohmann::json report() const;

 private:
  static int on_event(void* user, const ballast_event* ev);
  Host* host_ = nullptr;
  std::atomic<bool> started_{false};
  mutable std::mutex mu_;
  std::string state_;
  nlohmann::json report_;
};

}  // namespace ballast::cli
