// What `ballast launch` did to a job, left in its trace folder as
// launch.json so that a later `ballast analyze` of the folder agrees with the
// launcher: which ranks it stopped and when, the state each process was in
// when the launcher gave its verdict (before it stopped them), and that
// verdict.
#pragma once

#include "rings.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ballast::hang {

struct LaunchRank {
  int rank = -1;
  int32_t pid = 0;
  ProcState state = ProcState::unknown;  // when the verdict was given
  std::string ended;                     // "exit 0", "exit 3", "signal 9 (Killed)", "" while it ran
  bool stopped_by_launcher = false;      // the launcher ended it (SIGTERM, then SIGKILL)
};

struct LaunchRecord {
  std::string reason;        // "rank 2 (pid 123) was killed by signal 9 (Killed)", "the job hangs: ..."
  int failed_rank = -1;      // the rank whose end stopped the job, -1 for a hang
  int64_t verdict_ns = 0;    // wall clock of the verdict
  int64_t stopped_ns = 0;    // wall clock when the last rank was stopped, 0 before
  std::string verdict_json;  // the launcher's verdict (Verdict::to_json())
  std::vector<LaunchRank> ranks;
};

constexpr const char* kLaunchRecordName = "launch.json";

// Write dir/launch.json atomically (temporary file, rename). false with *err.
bool write_launch_record(const std::string& dir, const LaunchRecord& rec, std::string* err);

// Read dir/launch.json: false with *err empty when there is none, with *err
// naming the file and the field when it is not a record.
bool read_launch_record(const std::string& dir, LaunchRecord* rec, std::string* err);

// The state of each rank's process when the launcher gave its verdict, for
// the ranks it stopped itself: the state the analysis must use for them
// (their process is gone now because the launcher ended it).
std::map<int, ProcState> states_at_verdict(const LaunchRecord& rec);

// One paragraph for `ballast analyze`: what the launcher did and said; and
// the same as a JSON object (reason, failed_rank, verdict_ns, stopped_ns,
// stopped_ranks, verdict).
std::string launch_summary(const LaunchRecord& rec);
std::string launch_summary_json(const LaunchRecord& rec);

}  // namespace ballast::hang
