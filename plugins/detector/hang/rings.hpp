// Reading trace rings (abi/ballast/trace.h) from outside the writing
// process: a consistent copy of each record, while the writer runs, is
// stopped, or is gone.
#pragma once

#include <ballast/trace.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ballast::hang {

enum class ProcState { unknown, alive, stopped, gone };
const char* proc_state_name(ProcState s);

struct RankRing {
  std::string path;  // the file; the files, joined by ", ", when merged
  ballast_trace_header header{};
  std::vector<ballast_trace_slot> records;  // oldest first, only consistent copies
  uint64_t overflow = 0;                    // records overwritten before this read
  uint64_t dropped = 0;                     // operations unrecorded: every slot held one in flight
  ProcState state = ProcState::unknown;     // of the writing process, when on this host
  int64_t wall_ns(uint64_t tick) const {
    return header.clock_wall_ns + int64_t(double(int64_t(tick - header.clock_tick)) * header.ns_per_tick);
  }
};

// Read one ring file. false with *err naming the file and the field when the
// file is not a ring of this version.
bool read_ring(const std::string& path, RankRing* out, std::string* err);

// One process's rings (one per comm plugin it ran: rank-R.PID.ucx.btrace,
// rank-R.PID.nccl.btrace) as one: every record, oldest first, on the first
// ring's clock; overflow, dropped and head summed; closed only when every writer closed.
RankRing merge_rings(std::vector<RankRing> parts);

// Read every *.btrace file of dir, one RankRing per rank: the files of its
// newest process (highest clock; older ones are restarts) merged. Files that
// fail to read are reported in *errors and skipped.
std::vector<RankRing> read_dir(const std::string& dir, std::vector<std::string>* errors);

// The state of pid on this host, when host is this host's name.
ProcState probe(int32_t pid, const char* host);

// What the writers of rings that run on this host do over `window` (it
// sleeps that long, once): "busy (N ms of CPU in the last M ms)" when their
// CPU time was at least a quarter of the window, "busy (N ms of CPU and Q ms
// waiting for one ...)" when that and the time their threads waited on a run
// queue were (a loaded host), else "sleeping (no CPU ...)" or "sleeping (N
// ms of CPU ...)", "stopped" or "gone"; keyed by pid.
std::map<int32_t, std::string> activity(const std::vector<const RankRing*>& rings, std::chrono::milliseconds window);
// The same for processes of this host by pid; a sleeping one's evidence
// says where it waits in the kernel (/proc/PID/wchan) when known.
std::map<int32_t, std::string> activity_of(const std::vector<int32_t>& pids, std::chrono::milliseconds window);

}  // namespace ballast::hang
