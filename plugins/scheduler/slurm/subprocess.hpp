// Running a command as a subprocess (no shell): its exit code, stdout and
// stderr, bounded in size and time.
#pragma once

#include <string>
#include <vector>

namespace ballast::slurm {

struct CommandResult {
  int exit_code = -1;  // 128 + signal when killed; -1 when it could not run
  std::string out, err;
};

// Run argv with `env` added to the environment ("NAME=value"), kill it after
// timeout_ms, keep at most max_output bytes of each stream. False (with
// *error) when it could not be started or timed out; the exit code is the
// caller's to check.
bool run_command(const std::vector<std::string>& argv, const std::vector<std::string>& env, int timeout_ms,
                 CommandResult* result, std::string* error, size_t max_output = 16u << 20);

}  // namespace ballast::slurm
