// The start-up stage log: one JSON object per line, one line per timed stage
// of a job's start ("environment", "file_warmup", "checkpoint_load",
// "comm_init", "first_step", or any other name), appended by the `ballast
// startup` commands and by trainers (through the "ballast.startup" interface
// or by writing the line themselves):
//
//   {"stage":"checkpoint_load","node":"n1","rank":0,"start_ns":..,"end_ns":..,
//    "bytes":2147483648,"status":0,"detail":"3 files, 8 stripes"}
//
// Each line is written with one write(2) on an O_APPEND descriptor, so ranks
// sharing a file never interleave. `ballast startup report` reads it back.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <ballast/plugin.h>

namespace ballast::startup {

struct StageRecord {
  std::string stage;
  std::string node;
  int32_t rank = -1;
  int64_t start_ns = 0, end_ns = 0;  // wall clock
  uint64_t bytes = 0;
  int32_t status = 0;  // BALLAST_OK or a BALLAST_E* code
  std::string detail;
};

std::string stage_to_json_line(const StageRecord& r);
// Reads every line; a malformed one throws Error "FILE:LINE: field ...".
std::vector<StageRecord> read_stages(const std::string& path);

// Where stage records go: appended to a stage log file (if one is configured)
// and published as `startup.stage` events (if a host is given).
class StageLog {
 public:
  // path "" = the BALLAST_STARTUP_STAGES environment variable, or no file.
  StageLog(const ballast_host_api* host, std::string path);
  void record(StageRecord r);  // fills node and rank when empty; never throws
  const std::string& path() const { return path_; }

 private:
  const ballast_host_api* host_;
  std::string path_;
};

// Summary of a stage log: per stage its span, union, longest record, bytes,
// and share of the whole start; plus the time no stage accounts for.
nlohmann::json stage_report(const std::vector<StageRecord>& records);
std::string stage_report_text(const nlohmann::json& report);

}  // namespace ballast::startup
