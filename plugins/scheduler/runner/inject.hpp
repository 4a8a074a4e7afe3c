// Fault injection: `--inject SPEC` and `--inject-schedule FILE` parsed into
// injections the executor fires at their time. Specs:
//   hang:rank=R@T   crash:rank=R@T   skip:rank=R@T   slow:rank=R,factor=F@T
//   machine:node=N,kind=cpu|mem|net@T   nan@STEP   usererror@STEP
// T in seconds after the job's first start, or stepN: when the job first
// reaches step N; STEP a training step (from 1).
// A schedule is JSON lines: {"spec": "crash:rank=1@20"}, or the fields
// {"kind": "crash", "rank": 1, "at": 20} ("step" for nan/usererror), or
// records of the InfiniteHBD fault trace ({"node_id", "event_time" in days,
// "event_type", "fault_type": {"Level", "Class", "Desc"}}); that trace's
// JSON array as published is accepted as well.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace ballast::runner {

// Bad input, with a message that names the argument or the file and line.
struct InjectError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class FaultKind { hang, crash, skip, slow, machine, nan, usererror };
const char* fault_kind_name(FaultKind k);

struct Injection {
  FaultKind kind = FaultKind::crash;
  int rank = -1;             // hang, crash, skip, slow
  int node = -1;             // machine
  std::string machine_kind;  // machine: cpu, mem or net
  double factor = 1;         // slow
  double at_s = -1;          // seconds after the first start, or -1
  int64_t at_step = -1;      // nan, usererror: the step; others: fire at this step (@stepN), or -1
  std::string spec;          // canonical form, e.g. "crash:rank=1@20"
  std::string origin;        // "--inject 'crash:rank=1@20'" or "FILE:LINE"
  std::string note;          // where it came from in a trace ("GPU: GPU xid Error")
};

// The shape of the job injections must fit.
struct JobShape {
  int ranks = 1;
  int nodes = 1;                  // slots running the job (standbys not counted)
  bool network_per_node = false;  // job.netns asks for a network per node: machine kind=net allowed
};

// Parse one spec; `origin` names it in errors.
Injection parse_spec(const std::string& spec, const std::string& origin, const JobShape& shape);

struct ScheduleOptions {
  double seconds_per_day = 1;  // InfiniteHBD event_time (days) compressed to this many seconds per day
};

// Parse a schedule file. Throws InjectError naming the file and line.
std::vector<Injection> parse_schedule(const std::string& path, const JobShape& shape, const ScheduleOptions& options);

}  // namespace ballast::runner
